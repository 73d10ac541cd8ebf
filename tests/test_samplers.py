"""A training DataLoader with a sampler of its own: the sampler= / batch_sampler= argument is
wrapped in DistributedSamplerWrapper (each rank every WORLD_SIZE-th of what it yields, drawn
alike on every rank), and a sampler that is None is no sampler of its own. The wrapper itself
is run here as each rank would run it."""

from __future__ import annotations

import multiprocessing
import os
import random

import pytest
from conftest import free_port

from ddpify import Options, convert_source

HEAD = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset
from torch.utils.data import WeightedRandomSampler

ds = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
"""
STEP = """
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
CPU = Options(ignore=("DDP035",))


def flat(res) -> str:
    """The output with its line breaks (wrapped calls) as single spaces."""
    return " ".join(res.source.split())


def convert(loader_lines: str):
    res = convert_source(HEAD + loader_lines + STEP, CPU)
    return res, {f.code: f for f in res.findings}


# -- the conversion ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lines",
    [
        "loader = DataLoader(ds, batch_size=8, shuffle=True, sampler=None)\n",
        "sampler = None\nloader = DataLoader(ds, batch_size=8, shuffle=True, sampler=sampler)\n",
    ],
)
def test_a_sampler_that_is_none_is_no_sampler_of_its_own(lines):
    res, found = convert(lines)
    assert not res.blocking, [f.message for f in res.blocking]
    assert "DDP020" in found and "DistributedSamplerWrapper" not in res.source
    assert "sampler=DistributedSampler(ds)" in res.source
    assert "shuffle=" not in res.source.split("loader = DataLoader(")[1].split("\n")[0]
    assert "loader.sampler.set_epoch(epoch)" in res.source


def test_a_positional_none_sampler_keeps_every_argument_in_its_place():
    res, found = convert("loader = DataLoader(ds, 8, True, None)\n")
    assert "DataLoader(ds, 8, False, DistributedSampler(ds)" in res.source
    assert "DDP020" in found


def test_a_sampler_that_may_be_none_gets_a_distributed_sampler_then():
    res, found = convert(
        "sampler = None\n"
        "if len(ds) > 10:\n"
        "    sampler = WeightedRandomSampler(torch.ones(64), 64)\n"
        "loader = DataLoader(ds, batch_size=8, shuffle=sampler is None, sampler=sampler)\n"
    )
    assert not res.blocking
    assert (
        "sampler=DistributedSamplerWrapper(sampler)\n"
        "    if sampler is not None\n"
        "    else DistributedSampler(ds, shuffle=sampler is None)" in res.source
    )
    assert "shuffle=False" in res.source and "DDP115" in found
    # the DistributedSampler of the None case reshuffles with set_epoch; the wrapper passes it on
    assert "loader.sampler.set_epoch(epoch)" in res.source


def test_a_parameter_may_be_none():
    res, _ = convert(
        "def make(data, sampler=None):\n"
        "    return DataLoader(data, batch_size=8, sampler=sampler)\n\n\n"
        "loader = make(ds, WeightedRandomSampler(torch.ones(64), 64))\n"
    )
    assert not res.blocking
    assert "DistributedSamplerWrapper(sampler) if sampler is not None else" in flat(res)


def test_a_sampler_built_in_the_call_that_may_be_none_is_named_first():
    res, _ = convert(
        "def pick(n):\n"
        "    return WeightedRandomSampler(torch.ones(n), n) if n > 8 else None\n\n\n"
        "loader = DataLoader(ds, batch_size=8, sampler=pick(len(ds)))\n"
    )
    assert not res.blocking
    assert "train_sampler = pick(len(ds))\n" in res.source
    assert (
        "DistributedSamplerWrapper(train_sampler) if train_sampler is not None"
        in flat(res)
    )


def test_a_batch_sampler_that_may_be_none_is_refused_where_it_is_none():
    res, found = convert(
        "batches = None\n"
        "if len(ds) > 10:\n"
        "    batches = [[0, 1], [2, 3]]\n"
        "loader = DataLoader(ds, batch_sampler=batches)\n"
    )
    message = found["DDP022"].message
    assert found["DDP022"].line == 10 and "`batches = None` at line 7" in message
    assert "build it with batch_sampler= only where one is set" in message


def test_a_subset_sampler_is_wrapped_and_set_epoch_reaches_it():
    res, found = convert(
        "loader = DataLoader(ds, batch_size=8, sampler=SubsetRandomSampler(range(48)))\n"
    )
    assert "sampler=DistributedSamplerWrapper(SubsetRandomSampler(range(48)))" in (
        res.source
    )
    assert "DDP027" not in found and "loader.sampler.set_epoch(epoch)" in res.source


def test_a_batch_sampler_of_its_own_takes_set_epoch_where_the_loader_keeps_it():
    res, found = convert(
        "loader = DataLoader(ds, batch_sampler=[[0, 1], [2, 3], [4, 5], [6, 7]])\n"
    )
    assert "batch_sampler=DistributedSamplerWrapper([[0, 1]," in flat(res)
    assert "loader.batch_sampler.set_epoch(epoch)" in res.source
    assert "DDP115" in found


# -- the wrapper, as each rank runs it -------------------------------------------------------


def _wrapper(rank: int, world: int):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from ddpify.transforms.launch import RANK_BATCHES, SAMPLER_WRAPPER

    scope = {"torch": torch, "dist": dist, "RANK": rank, "WORLD_SIZE": world}
    text = SAMPLER_WRAPPER + RANK_BATCHES
    exec(text.format(torch="torch", dist="dist", os="os"), scope)
    return scope


def _shares(make, world: int, passes: int = 1, draw_between: bool = False):
    """Each rank's items over `passes` passes; the ranks' global generators start alike (as
    rank 0's broadcast seed makes them) and only rank 0 draws between items when asked."""
    import torch

    out = []
    for rank in range(world):
        torch.manual_seed(0)
        random.seed(0)
        w = _wrapper(rank, world)["DistributedSamplerWrapper"](make())
        got = []
        for _ in range(passes):
            items = []
            for x in w:
                items.append(x)
                if draw_between and rank == 0:
                    # the training's own draws (dropout, noise), on one rank only
                    torch.randn(3)
                    random.random()
            got.append(items)
        out.append((w, got))
    return out


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_rank_takes_its_share_of_one_sequence(world):
    torch = pytest.importorskip("torch")
    from torch.utils.data import RandomSampler

    shares = _shares(lambda: RandomSampler(range(50)), world, draw_between=True)
    firsts = [got[0] for _, got in shares]
    assert [len(f) for f in firsts] == [50 // world] * world
    assert [len(w) for w, _ in shares] == [50 // world] * world
    every = [i for f in firsts for i in f]
    assert len(set(every)) == len(every) == 50 - 50 % world  # a remainder round dropped
    assert torch.is_tensor(torch.zeros(1))


def test_an_epoch_has_one_order_and_set_epoch_draws_another():
    pytest.importorskip("torch")
    from torch.utils.data import RandomSampler

    class Epochs(RandomSampler):
        epoch = -1

        def set_epoch(self, epoch):
            self.epoch = epoch

    (w, got), _ = _shares(lambda: Epochs(range(40)), 2, passes=2)
    # a pass one rank makes alone (a batch peeked at) changes no later pass
    assert got[0] == got[1]
    w.set_epoch(7)
    assert w.sampler.epoch == 7 == w.epoch and list(w) != got[0]
    assert w.data_source == range(40)  # the sampler's own attributes stay reachable


def test_a_batch_sampler_is_shared_out_whole_batches():
    pytest.importorskip("torch")
    from torch.utils.data import BatchSampler, RandomSampler

    shares = _shares(
        lambda: BatchSampler(RandomSampler(range(30)), 4, drop_last=False), 2
    )
    batches = [b for _, got in shares for b in got[0]]
    assert [len(got[0]) for _, got in shares] == [4, 4]  # 8 batches: 4 rounds of 2
    flat = [i for b in batches for i in b]
    # 8 batches (7 of 4, the last of 2): 4 whole rounds, nothing dropped
    assert len(flat) == len(set(flat)) == 30


def test_an_endless_sampler_goes_on_and_leaves_the_global_generators_alone():
    torch = pytest.importorskip("torch")

    class Endless:
        def __iter__(self):
            while True:
                yield from torch.randperm(6).tolist()

    w = _wrapper(1, 2)["DistributedSamplerWrapper"](Endless())  # draws its seed
    state, py = torch.get_rng_state(), random.getstate()
    items = iter(w)
    got = [next(items) for _ in range(200)]
    assert torch.equal(state, torch.get_rng_state()) and py == random.getstate()
    assert len(got) == 200 and set(got) <= set(range(6))


def test_rank_batches_takes_one_round_of_a_generator_at_a_time():
    pytest.importorskip("torch")
    made = []

    def batches():
        for k in range(7):
            made.append(k)
            yield k

    it = _wrapper(1, 3)["rank_batches"](batches())
    assert next(it) == 1 and made == [0, 1, 2]  # no batch made ahead of its round
    assert list(it) == [4] and made == list(range(7))


def _peek_on_rank0(rank: int, port: int, queue) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.utils.data import RandomSampler

    wrapper = _wrapper(rank, 2)["DistributedSamplerWrapper"](RandomSampler(range(20)))
    if rank == 0:
        # a batch peeked at for a log, where the conversion guards the tracker call
        next(iter(wrapper))
    got = list(wrapper)
    both = [None, None]
    dist.all_gather_object(both, got)
    queue.put((rank, both))
    dist.destroy_process_group()


@pytest.mark.runs
def test_a_pass_one_rank_makes_alone_needs_no_other_rank():
    pytest.importorskip("torch")
    ctx = multiprocessing.get_context("fork")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_peek_on_rank0, args=(r, port, queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
    shares = got[0]
    # no hang, and the shares the ranks then take are disjoint halves of one sequence
    assert len(shares[0]) == len(shares[1]) == 10
    assert not set(shares[0]) & set(shares[1])
