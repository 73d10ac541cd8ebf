"""Training batches without a DataLoader (ddpify/analysis/batches.py, transforms/batches.py):
what is sharded, and what is refused because ddpify cannot make it per-rank."""

from __future__ import annotations

from pathlib import Path

from ddpify import convert_source

ROOT = Path(__file__).resolve().parent.parent

HEAD = """import random
import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"
X = torch.randn(64, 4)
Y = X.sum(1, keepdim=True)
model = nn.Linear(4, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""
STEP = """    loss = nn.functional.mse_loss(model(xb.to(device)), yb.to(device))
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def codes(src: str) -> dict[str, str]:
    res = convert_source(src)
    return {f.code: f.severity for f in res.findings}


def test_random_offsets_are_reseeded_once_before_the_loop():
    src = (
        HEAD
        + "for step in range(10):\n    ix = torch.randint(0, 64, (8,))\n    xb, yb = X[ix], Y[ix]\n"
        + STEP
    )
    res = convert_source(src)
    assert res.status == "converted" and not res.blocking
    assert (
        res.source.count(
            "torch.manual_seed(int(torch.randint(2**62, ())) + RANK)\nfor step in range(10):"
        )
        == 1
    )


def test_a_draw_that_decides_whether_the_step_runs_is_refused():
    src = HEAD + (
        "for step in range(10):\n    ix = torch.randint(0, 64, (8,))\n    xb, yb = X[ix], Y[ix]\n"
        "    if random.random() < 0.1:\n        continue\n" + STEP
    )
    assert codes(src).get("DDP116") == "blocking"


def test_a_seed_inside_the_loop_is_refused():
    src = (
        HEAD
        + "for step in range(10):\n    torch.manual_seed(step)\n    ix = torch.randint(0, 64, (8,))\n    xb, yb = X[ix], Y[ix]\n"
        + STEP
    )
    assert codes(src).get("DDP116") == "blocking"


def test_a_training_function_called_from_two_loops_is_refused():
    body = (
        "def train():\n    for step in range(5):\n        ix = torch.randint(0, 64, (8,))\n        xb, yb = X[ix], Y[ix]\n"
        + STEP.replace("    ", "        ")
    )
    src = (
        HEAD
        + body
        + "\nfor epoch in range(2):\n    train()\nfor epoch in range(2):\n    train()\n"
    )
    assert codes(src).get("DDP116") == "blocking"


def test_full_batch_without_an_index_reads_the_ranks_rows():
    src = HEAD + "for epoch in range(10):\n    xb, yb = X, Y\n" + STEP
    res = convert_source(src)
    assert res.status == "converted" and "DDP119" in {f.code for f in res.findings}
    assert "    xb, yb = X[RANK::WORLD_SIZE], Y[RANK::WORLD_SIZE]\n" in res.source
    assert (
        "X = torch.randn(64, 4)\n" in res.source
    )  # the tensors themselves stay whole (evaluation reads them)


def test_full_batch_with_only_the_inputs_whole_is_refused():
    # the targets are picked by an index that the rows of X would no longer match
    src = (
        HEAD
        + "for epoch in range(10):\n    out = model(X.to(device))\n    loss = nn.functional.mse_loss(out, Y[:64])\n"
        "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    )
    assert codes(src).get("DDP024") == "blocking"


def test_lbfgs_with_a_dataloader_is_refused():
    src = """import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

ds = TensorDataset(torch.randn(32, 2), torch.randn(32, 1))
loader = DataLoader(ds, batch_size=8, shuffle=True)
model = nn.Linear(2, 1)
opt = torch.optim.LBFGS(model.parameters())
for epoch in range(2):
    for x, y in loader:
        def closure():
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss
        opt.step(closure)
"""
    assert codes(src).get("DDP114") == "blocking"


def test_a_sampler_without_replacement_is_wrapped():
    src = """import torch
import torch.nn as nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

ds = TensorDataset(torch.randn(32, 2), torch.randn(32, 1))
loader = DataLoader(ds, batch_size=8, sampler=RandomSampler(ds, num_samples=16))
model = nn.Linear(2, 1).to("cuda")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = nn.functional.mse_loss(model(x.to("cuda")), y.to("cuda"))
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
    assert codes(src).get("DDP115") == "note"
    assert "DDP022" not in codes(src)


def test_evaluation_loops_over_the_same_data_stay_unsharded():
    out = (ROOT / "fixtures/124_bptt_slices_train_fn/expected.py").read_text()
    assert out.count("rank_share(range(") == 1
    assert (
        "for i in range(0, source.size(0) - 1, BPTT):" in out
    )  # evaluate() walks all of it


def test_an_epoch_loop_that_only_picks_settings_is_not_a_data_loop():
    # full-batch training, not slices: each rank reads its rows of the whole tensors
    lrs = (
        HEAD
        + "lrs = [0.1] * 10\nfor epoch in range(10):\n    opt.param_groups[0]['lr'] = lrs[epoch]\n    xb, yb = X, Y\n"
        + STEP
    )
    assert codes(lrs).get("DDP119") == "note" and "DDP111" not in codes(lrs)
    settings = (
        HEAD
        + "for lr in [0.1, 0.01]:\n    opt.param_groups[0]['lr'] = lr\n    xb, yb = X, Y\n"
        + STEP
    )
    assert codes(settings).get("DDP119") == "note" and "DDP111" not in codes(settings)


def test_an_index_on_one_side_of_the_loss_only_is_not_sharded():
    src = (
        HEAD
        + "idx = torch.arange(32)\ny_train = Y[idx]\nfor epoch in range(10):\n    out = model(X.to(device))\n"
        "    loss = nn.functional.mse_loss(out[idx], y_train.to(device))\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    )
    assert codes(src).get("DDP024") == "blocking"


def test_a_key_is_not_an_index_of_rows():
    src = (
        HEAD
        + "key = 'a'\nfor epoch in range(10):\n    out = {'a': model(X.to(device))}\n    tgt = {'a': Y.to(device)}\n"
        "    loss = nn.functional.mse_loss(out[key], tgt[key])\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    )
    assert codes(src).get("DDP117") == "blocking"


def test_draws_that_do_not_feed_the_batch_do_not_shard_it():
    # the random draw only picks an evaluation subset; the training batch is the full data
    src = HEAD + (
        "for epoch in range(10):\n    if epoch % 5 == 0:\n        probe = X[torch.randint(0, 64, (4,))]\n"
        "        print(model(probe.to(device)).mean().item())\n    xb, yb = X, Y\n"
        + STEP
    )
    assert "DDP110" not in codes(src) and codes(src).get("DDP119") == "note"


def test_noise_next_to_batches_from_an_unknown_loader_is_not_sharding():
    # a GAN whose images come from a loader built in another module: the noise is random, the data is not sharded
    src = (
        HEAD
        + "def fit(loader):\n    for xb, yb in loader:\n        xb = xb + 0.1 * torch.randn_like(xb)\n"
        + STEP.replace("    ", "        ")
    )
    assert codes(src).get("DDP024") == "blocking"


def test_noise_on_samples_picked_by_the_loop_counter_is_not_sharding():
    src = (
        HEAD
        + "for i in range(64):\n    xb, yb = X[i] + 0.1 * torch.randn(4), Y[i]\n"
        + STEP
    )
    assert codes(src).get("DDP024") == "blocking"


def test_a_batch_iterator_handed_to_the_epoch_function_is_shared_by_rank():
    src = HEAD + (
        "class Feed:\n    def __init__(self, n):\n        self.n = n\n\n    def __iter__(self):\n"
        "        for i in range(0, 64, self.n):\n            yield X[i:i + self.n], Y[i:i + self.n]\n\n\n"
        "def run_epoch(batches):\n    for xb, yb in batches:\n"
        + STEP.replace("    ", "        ")
        + "\n\nfor epoch in range(3):\n    run_epoch(Feed(8))\n"
    )
    res = convert_source(src)
    assert res.status == "converted", [f.message for f in res.blocking]
    assert (
        "    for xb, yb in rank_batches(batches):\n" in res.source
        and "def rank_batches(batches):" in res.source
    )


def test_an_iterable_with_getitem_is_not_taken_for_a_batch_iterator():
    # a Dataset-like class iterated directly: its items are samples, not batches
    src = HEAD + (
        "class Rows:\n    def __getitem__(self, i):\n        return X[i], Y[i]\n\n    def __iter__(self):\n"
        "        return iter(zip(X, Y))\n\n\nfor epoch in range(3):\n    for xb, yb in Rows():\n"
        + STEP.replace("    ", "        ")
    )
    assert "DDP118" not in codes(src)
