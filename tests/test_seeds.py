"""Random state made before training is the same on every rank (ddpify/analysis/seeds.py,
transforms/seeds.py): unseeded draws before the training loop get rank 0's seed after the
set-up; seeded scripts, draws in the loop and a model's own init are left alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import free_port

from ddpify import convert_source

ROOT = Path(__file__).resolve().parent.parent
SYNC = "torch.manual_seed(rank0_seed())"

LOOP = """model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(X, Y), batch_size=8, shuffle=True)
for epoch in range(2):
    for xb, yb in loader:
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
IMPORTS = "import numpy as np\nimport torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset, random_split\n\n"


def convert(body: str):
    return convert_source(IMPORTS + body + LOOP)


def codes(res) -> dict[str, str]:
    return {f.code: f.severity for f in res.findings}


def test_unseeded_data_gets_rank0_seed_right_after_setup():
    res = convert("X = torch.randn(64, 4)\nY = X.sum(1, keepdim=True)\n")
    assert codes(res).get("DDP145") == "note"
    out = res.source
    assert (
        out.index("ddp_setup()\n")
        < out.index(SYNC)
        < out.index("X = torch.randn(64, 4)")
    )
    assert "np.random.seed(rank0_seed()" not in out  # only the generators drawn from


def test_seeded_before_the_draw_is_left_alone():
    for seed in (
        "torch.manual_seed(0)\n",
        "def set_seed(s):\n    torch.manual_seed(s)\n\n\nset_seed(3)\n",
    ):
        res = convert(seed + "X = torch.randn(64, 4)\nY = X.sum(1, keepdim=True)\n")
        assert "DDP145" not in codes(res) and "rank0_seed" not in res.source


def test_a_seed_under_a_flag_still_gets_rank0_seed_first():
    res = convert(
        "import sys\nif len(sys.argv) > 1:\n    torch.manual_seed(int(sys.argv[1]))\nX = torch.randn(64, 4)\nY = X.sum(1, keepdim=True)\n"
    )
    out = res.source
    assert "DDP145" in codes(res)
    assert out.index(SYNC) < out.index(
        "torch.manual_seed(int(sys.argv[1]))"
    )  # the script's seed still wins


def test_numpy_data_and_a_split_without_generator():
    res = convert(
        "X = torch.from_numpy(np.random.rand(64, 4)).float()\nY = X.sum(1, keepdim=True)\n"
        "a, b = random_split(TensorDataset(X, Y), [48, 16])\n"
    )
    assert "np.random.seed(rank0_seed() % 2**32)" in res.source and SYNC in res.source
    own = convert(
        "torch.manual_seed(0)\nX = torch.randn(64, 4)\nY = X.sum(1, keepdim=True)\n"
        "a, b = random_split(TensorDataset(X, Y), [48, 16], generator=torch.Generator().manual_seed(1))\n"
    )
    assert "DDP145" not in codes(own)


def test_sklearn_split_seeds_numpy_importing_it():
    src = (
        "import torch\nimport torch.nn as nn\nfrom sklearn.model_selection import train_test_split\n"
        "from torch.utils.data import DataLoader, TensorDataset\n\ntorch.manual_seed(0)\nA = torch.randn(80, 4)\n"
        "X, _ = train_test_split(A, test_size=0.2)\nY = X.sum(1, keepdim=True)\n" + LOOP
    )
    res = convert_source(src)
    assert "DDP145" in codes(res)
    assert (
        "import numpy as np\n" in res.source
        and "np.random.seed(rank0_seed() % 2**32)" in res.source
    )


def test_draws_in_training_and_in_a_model_init_are_not_pre_training():
    model_init = (
        "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.w = nn.Parameter(torch.randn(4, 1))\n\n    def forward(self, x):\n        return x @ self.w\n\n\n"
        "torch.manual_seed(0)\nX = torch.randn(64, 4)\nY = X.sum(1, keepdim=True)\nnet = Net()\n"
    )
    assert "DDP145" not in codes(convert(model_init))
    noise = "torch.manual_seed(0)\nX = torch.randn(64, 4)\nY = X.sum(1, keepdim=True)\n"
    res = convert_source(
        IMPORTS
        + noise
        + LOOP.replace("model(xb)", "model(xb + 0.1 * torch.randn_like(xb))")
    )
    assert "DDP145" not in codes(res)


def test_a_module_level_draw_moves_the_setup_out_of_the_main_guard():
    out = convert_source(
        (ROOT / "fixtures/193_module_prototypes_main_guard/input.py").read_text()
    ).source
    assert (
        out.index("ddp_setup()\n")
        < out.index("PROTOTYPES = torch.randn")
        < out.index('if __name__ == "__main__":')
    )
    out = convert_source(
        (ROOT / "fixtures/192_optional_seed_dataset_class/input.py").read_text()
    ).source
    guard = out.index('if __name__ == "__main__":')
    assert guard < out.index("ddp_setup()\n") < out.index(SYNC)


def test_a_draw_among_the_imports_is_refused():
    res = convert_source(
        (ROOT / "fixtures/194_draw_among_imports_refused/input.py").read_text()
    )
    assert codes(res).get("DDP146") == "blocking" and res.blocking


def test_an_own_generator_made_without_seed_starts_from_rank0_seed():
    made = "rng = np.random.default_rng()\nX = torch.tensor(rng.normal(size=(64, 4)), dtype=torch.float32)\nY = X.sum(1, keepdim=True)\n"
    res = convert("torch.manual_seed(0)\n" + made)
    assert (
        "rng = np.random.default_rng(rank0_seed())" in res.source
        and codes(res).get("DDP147") == "note"
    )
    assert SYNC not in res.source  # torch is seeded by the script
    res = convert(
        "torch.manual_seed(0)\nimport sys\nif len(sys.argv) > 1:\n    "
        + made.replace("\n", "\n    ", 1)
    )
    assert codes(res).get("DDP147") == "blocking"
    seeded = convert(
        "torch.manual_seed(0)\n" + made.replace("default_rng()", "default_rng(7)")
    )
    assert "DDP147" not in codes(seeded)


def test_a_full_batch_index_from_an_unseeded_permutation_is_the_same_on_every_rank():
    src = (
        IMPORTS
        + "X = torch.ones(40, 4)\nY = X.sum(1, keepdim=True)\nperm = torch.randperm(40)\nidx = perm[:30]\n"
        "model = nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor epoch in range(5):\n"
        "    out = model(X)\n    loss = nn.functional.mse_loss(out[idx], Y[idx])\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    )
    res = convert_source(src)
    assert {"DDP112", "DDP145"} <= set(codes(res)) and res.source.index(
        SYNC
    ) < res.source.index("perm = torch.randperm(40)")


SHOW = '\nimport sys\nprint("TARGET", coeffs.view(-1).tolist(), intercept.item(), file=sys.stderr)\n'


def _targets(forkrun, script: Path, tmp_path: Path) -> list[str]:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    run = forkrun.run(script, ["--steps", "20"], tmp_path, nproc=2, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return [re.search(r"TARGET .*", r.stderr).group(0) for r in run.ranks]


@pytest.mark.runs
def test_every_rank_fits_the_same_target(forkrun, tmp_path):
    """Fixture 190 as 2 ranks: the curve drawn before training is the same on both ranks; the
    output without the rank-0 seed (the conversion before DDP145) draws one per rank."""
    pytest.importorskip("torch")
    out = (ROOT / "fixtures/190_unseeded_target_curve_fit/expected.py").read_text()
    assert SYNC in out
    now = tmp_path / "now.py"
    now.write_text(out + SHOW)
    a, b = _targets(forkrun, now, tmp_path)
    assert a == b
    before = tmp_path / "before.py"
    assert out.count(SYNC + "\n") == 1
    before.write_text(out.replace(SYNC + "\n", "") + SHOW)
    a, b = _targets(forkrun, before, tmp_path)
    assert a != b
