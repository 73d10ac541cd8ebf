"""The training step under the generated autocast: the cases the fixtures 70-76 do not spell out
(options other than the default, the refusals)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ddpify import Options, convert_source

HEAD = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

model = nn.Linear(4, 1)  # a device named (below): the GPU set-up, not a CPU program
device = "cpu"
loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.rand(8, 1)), batch_size=4, shuffle=True)
"""

MANUAL = (
    HEAD
    + """
for epoch in range(2):
    for x, y in loader:
        out = model(x)
        loss = F.mse_loss(out, y)
        model.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.1)
"""
)

# The snippets keep their models on the CPU (DDP035 would refuse them): these tests are about the step.
CPU_OK = Options(ignore=("DDP035",))


def _codes(result, fixed=None):
    return [f.code for f in result.findings if fixed is None or f.fixed == fixed]


def test_manual_update_with_fp16_leaves_precision_off():
    result = convert_source(MANUAL, Options(amp="fp16", ignore=CPU_OK.ignore))
    assert "autocast" not in result.source and "SCALER" not in result.source
    assert "DDP045" in _codes(result, fixed=False)
    assert (
        "ddp_in_place(model" in result.source
    )  # found by its update loop, wrapped all the same


def test_manual_update_gets_bf16_autocast_and_no_scaler():
    result = convert_source(MANUAL, Options(amp="auto", ignore=CPU_OK.ignore))
    assert "dtype=torch.bfloat16, enabled=AMP_DTYPE == torch.bfloat16" in result.source
    assert "SCALER" not in result.source and "no_sync" not in result.source
    assert "DDP045" in _codes(result, fixed=True)


def test_unsafe_op_in_the_forward_statement_leaves_precision_off():
    src = (
        HEAD
        + """
criterion = nn.BCELoss()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        loss = criterion(torch.sigmoid(model(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
    )
    result = convert_source(src, CPU_OK)
    assert "torch.autocast" not in result.source
    assert "DDP044" in _codes(result, fixed=False)
    # asked for: the op alone leaves autocast, in the one statement of forward and loss
    result = convert_source(src, Options(amp="bf16", ignore=CPU_OK.ignore))
    assert (
        "        loss = in_float32(criterion)(torch.sigmoid(model(x)), y)\n"
        in result.source
    )
    assert "DDP044" in _codes(result, fixed=True) and "DDP043" not in _codes(result)


def test_inplace_change_of_the_first_forward_output_leaves_precision_off():
    src = (
        HEAD
        + """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        out = model(x); out.clamp_(-1, 1)
        loss = F.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
    )
    result = convert_source(src, CPU_OK)
    assert "DDP046" in _codes(result, fixed=False)
    assert "torch.autocast" not in result.source


def test_augmented_assignment_to_a_number_is_no_inplace_op():
    src = (
        HEAD
        + """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        n = x.size(0)
        out = model(x)
        n += 1
        loss = F.mse_loss(out, y) * n
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
    )
    result = convert_source(
        src, replace(CPU_OK, line_length=0)
    )  # the statements unwrapped
    assert "DDP046" not in _codes(result)
    assert "torch.autocast(LOCAL_DEVICE.type, dtype=AMP_DTYPE" in result.source


def test_bce_outside_the_training_step_is_left_alone():
    src = (
        HEAD
        + """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        out = torch.sigmoid(model(x))
        loss = F.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        val = F.binary_cross_entropy(torch.sigmoid(model(x)), y)
"""
    )
    result = convert_source(src, CPU_OK)
    assert "DDP044" not in _codes(result)
    assert "enabled=False" not in result.source


# -- data: streams and weighted samplers ---------------------------------------------

STREAM_STEP = """
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in train_loader:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
STREAM_HEAD = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset
"""


def test_stream_defined_elsewhere_is_refused():
    src = (
        STREAM_HEAD
        + "import webdataset as wds\n\nshards = wds.WebDataset('data-{0..9}.tar')\ntrain_loader = DataLoader(shards, batch_size=4)\n"
        + STREAM_STEP
    )
    result = convert_source(src, CPU_OK)
    assert "DDP023" in _codes(result, fixed=False)
    assert "RankShard" not in result.source


def test_stream_splitting_its_workers_is_split_by_rank_only():
    src = (
        STREAM_HEAD
        + """
class Lines(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start = info.id if info else 0
        yield from range(start, 100, info.num_workers if info else 1)


train_loader = DataLoader(Lines(), batch_size=4)
"""
        + STREAM_STEP
    )
    result = convert_source(src, CPU_OK)
    assert (
        "DataLoader(RankShard(Lines(), split_workers=False), batch_size=4)"
        in result.source
    )
    assert "DDP019" in _codes(result, fixed=True)


def test_stream_reading_the_rank_itself_is_refused():
    src = (
        STREAM_HEAD
        + """
class Shards(IterableDataset):
    def __init__(self, rank=0, world_size=1):
        self.rank, self.world_size = rank, world_size

    def __iter__(self):
        yield from range(self.rank, 100, self.world_size)


train_loader = DataLoader(Shards(), batch_size=4)
"""
        + STREAM_STEP
    )
    result = convert_source(src, CPU_OK)
    assert "DDP023" in _codes(result, fixed=False)
    assert "RankShard(" not in result.source


def test_a_sampler_of_the_scripts_own_is_wrapped():
    src = (
        STREAM_HEAD
        + """from torch.utils.data import Sampler, TensorDataset


class EveryOther(Sampler):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(0, self.n, 2))

    def __len__(self):
        return self.n // 2


ds = TensorDataset(torch.randn(8, 4), torch.rand(8, 1))
train_loader = DataLoader(ds, batch_size=4, sampler=EveryOther(8))
"""
        + STREAM_STEP
    )
    result = convert_source(src, CPU_OK)
    assert "DDP115" in _codes(result, fixed=True)
    assert "sampler=DistributedSamplerWrapper(EveryOther(8))" in result.source
    # each epoch another order of the sampler's, the same on every rank
    assert "train_loader.sampler.set_epoch(epoch)" in result.source


def _helper(text: str, rank: int, world: int) -> dict:
    """Run a generated helper class with this rank's module globals."""
    import torch

    from ddpify.transforms.launch import SHARD

    scope = {"torch": torch, "RANK": rank, "WORLD_SIZE": world}
    exec({"shard": SHARD}[text].format(torch="torch"), scope)
    return scope


def test_rank_shard_gives_every_rank_the_same_count_of_distinct_items():
    pytest.importorskip("torch")
    got = [list(_helper("shard", r, 3)["RankShard"](range(11))) for r in range(3)]
    assert got == [
        [0, 3, 6],
        [1, 4, 7],
        [2, 5, 8],
    ]  # 9 and 10: an incomplete round, dropped


def test_rank_shard_splits_workers_too():
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    per_rank = []
    for r in range(2):
        shard = _helper("shard", r, 2)["RankShard"](list(range(20)))
        # workers are forked processes: the helper's globals go with them
        per_rank.append(
            sorted(
                int(x)
                for x in DataLoader(
                    shard,
                    batch_size=None,
                    num_workers=2,
                    multiprocessing_context="fork",
                )
            )
        )
    assert len(per_rank[0]) == len(per_rank[1]) == 10
    assert set(per_rank[0]).isdisjoint(per_rank[1])


# -- legacy scripts: the same device-aware set-up as a fresh conversion ----------------

LEGACY = """\
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)
parser.add_argument("--dist-backend", default="nccl")
args = parser.parse_args()
torch.cuda.set_device(args.local_rank)
torch.distributed.init_process_group(backend=args.dist_backend)
model = nn.Linear(4, 1).cuda(args.local_rank)
model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank], output_device=args.local_rank)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(8, 4).cuda()).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
"""


def test_legacy_launch_script_gets_a_device_aware_setup():
    result = convert_source(
        LEGACY, replace(CPU_OK, line_length=0)
    )  # the statements unwrapped
    out = result.source
    assert (
        "if torch.cuda.is_available():\n    torch.cuda.set_device(args.local_rank)"
        in out
    )
    assert (
        'init_process_group(backend=args.dist_backend if torch.cuda.is_available() else "gloo")'
        in out
    )
    assert "device_ids=[args.local_rank] if torch.cuda.is_available() else None" in out
    assert "output_device=args.local_rank if torch.cuda.is_available() else None" in out
    assert ".cuda(" not in out and "nn.Linear(4, 1).to(LOCAL_DEVICE)" in out
    assert (
        'LOCAL_DEVICE = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))'
        in out
    )
    assert "import os" in out
    again = convert_source(out, CPU_OK)
    assert not again.changed  # the set-up it wrote is left alone


def test_legacy_setup_already_device_aware_is_left_alone():
    src = LEGACY.replace(
        "torch.cuda.set_device(args.local_rank)",
        "if torch.cuda.is_available():\n    torch.cuda.set_device(args.local_rank)",
    )
    src = src.replace(
        'default="nccl"', 'default="nccl" if torch.cuda.is_available() else "gloo"'
    )
    result = convert_source(src, CPU_OK)
    assert "DDP013" not in " ".join(
        f.format("x")
        for f in result.findings
        if "set_device" in f.message or "backend" in f.message
    )


def test_old_autocast_positional_enabled_becomes_a_keyword():
    # torch.cuda.amp.autocast(flag): flag is `enabled`; torch.autocast's second parameter is dtype
    src = MANUAL.replace("import torch\n", "import torch\nuse_amp = False\n", 1)
    body = "with torch.cuda.amp.autocast(use_amp):\n    pass\n"
    result = convert_source(src + body, CPU_OK)
    assert 'torch.autocast("cuda", enabled=use_amp)' in result.source
