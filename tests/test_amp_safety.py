"""Mixed precision that would change what a script computes is left out (or, asked for, confined):
losses on probabilities (DDP044) and sparse tensors (DDP140). The dtype errors show on CPU too
once the output runs under CPU bf16 autocast (AMP_DTYPE forced), which these tests do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpify import Options, convert_source

ROOT = Path(__file__).resolve().parents[1]
CPU_OK = ("DDP035",)  # the snippets keep their models on the CPU

HEAD = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)).to(device)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.rand(32, 1).round()), batch_size=8, shuffle=True)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""


def _codes(result, fixed=None):
    return [f.code for f in result.findings if fixed is None or f.fixed == fixed]


def _run_under_cpu_bf16(source: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run a converted script as one plain process with CPU bf16 autocast switched on."""
    line = next(ln for ln in source.splitlines() if ln.startswith("AMP_DTYPE = "))
    script = tmp_path / "train.py"
    script.write_text(
        source.replace(line, "AMP_DTYPE = torch.bfloat16  # forced: CPU bf16 autocast")
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


# -- losses on probabilities ------------------------------------------------------------

TWO_STAGES = (
    HEAD
    + """
for epoch in range(2):  # pre-training on a regression target
    for x, y in loader:
        out = model(x.to(device))
        loss = F.mse_loss(out, y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
for epoch in range(2):  # then probabilities scored with BCE
    for x, y in loader:
        probs = torch.sigmoid(model(x.to(device)))
        loss = F.binary_cross_entropy(probs, y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
)


def test_step_with_a_loss_on_probabilities_gets_no_autocast_by_default():
    result = convert_source(
        TWO_STAGES, Options(line_length=0)
    )  # the statements unwrapped
    assert result.source.count("with torch.autocast(") == 1  # the regression step only
    assert (
        "        with torch.autocast(LOCAL_DEVICE.type, dtype=AMP_DTYPE, enabled=AMP_DTYPE is not None):\n            out = model("
        in result.source
    )
    assert (
        "        probs = torch.sigmoid(model(x.to(device, non_blocking=True)))\n"
        in result.source
    )
    assert "in_float32" not in result.source
    notes = [f for f in result.findings if f.code == "DDP044"]
    bce_line = (
        TWO_STAGES.splitlines().index(
            "        loss = F.binary_cross_entropy(probs, y.to(device))"
        )
        + 1
    )
    assert (
        len(notes) == 1
        and not notes[0].fixed
        and "BCEWithLogitsLoss" in notes[0].message
        and notes[0].line == bce_line
    )


STATEMENT_KINDS = (
    HEAD
    + """
criterion = nn.BCELoss()


def bce_sum(net, x, y):
    return F.binary_cross_entropy(torch.sigmoid(net(x)), y, reduction="sum") / len(x)


for epoch in range(2):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        halves = [(x[:4], y[:4]), (x[4:], y[4:])]
        loss = bce_sum(model, x, y)
        loss += sum(criterion(torch.sigmoid(model(xi)), yi) for xi, yi in halves)
        loss = loss + (criterion(torch.sigmoid(model(x)), y) if epoch else 0.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
print("final loss", loss.item())
"""
)


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_asked_for_the_op_alone_runs_in_float32_in_any_statement(amp):
    result = convert_source(
        STATEMENT_KINDS, Options(amp=amp, line_length=0)
    )  # unwrapped
    src = result.source
    assert (
        '    return in_float32(F.binary_cross_entropy)(torch.sigmoid(net(x)), y, reduction="sum") / len(x)\n'
        in src
    )
    assert (
        "loss += sum(in_float32(criterion)(torch.sigmoid(model(xi)), yi) for xi, yi in halves)"
        in src
    )
    assert (
        "loss = loss + (in_float32(criterion)(torch.sigmoid(model(x)), y) if epoch else 0.0)"
        in src
    )
    assert (
        "enabled=False" in src.split("def in_float32", 1)[1]
    )  # the only autocast-off region
    assert src.count("enabled=False") == 1
    assert _codes(result, fixed=True).count("DDP044") == 3 and "DDP040" in _codes(
        result, fixed=True
    )
    compile(src, "out.py", "exec")


@pytest.mark.runs
def test_model_calls_in_the_ops_arguments_keep_autocast_under_cpu_bf16(tmp_path):
    """The fixture's GAN (BCE on the discriminator's output, --amp bf16) runs under CPU bf16
    autocast; ddpify's former output, with the whole statement under autocast(enabled=False),
    ran the discriminator's float32 layers on the generator's bf16 images and failed."""
    source = (ROOT / "fixtures/180_gan_bceloss_amp_bf16/input.py").read_text()
    out = convert_source(source, Options(amp="bf16")).source
    ok = _run_under_cpu_bf16(out, tmp_path)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "[Epoch 2/3]" in ok.stdout
    new = "            g_loss = in_float32(adversarial_loss)(discriminator(gen_imgs), valid)\n"
    old = (
        "            with torch.autocast(LOCAL_DEVICE.type, enabled=False):\n"
        "                g_loss = adversarial_loss(discriminator(gen_imgs).float(), valid.float())\n"
    )
    assert new in out
    before = _run_under_cpu_bf16(out.replace(new, old), tmp_path)
    assert before.returncode != 0 and "must have the same dtype" in before.stderr


@pytest.mark.runs
def test_statement_kinds_run_under_cpu_bf16(tmp_path):
    out = convert_source(STATEMENT_KINDS, Options(amp="bf16", ignore=CPU_OK)).source
    run = _run_under_cpu_bf16(out, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "final loss" in run.stdout


def test_script_with_its_own_in_float32_keeps_it():
    src = "def in_float32(x):\n    return x.float()\n\n\n" + STATEMENT_KINDS.replace(
        "bce_sum(model, x, y)", "in_float32(bce_sum(model, x, y))"
    )
    result = convert_source(src, Options(amp="bf16"))
    assert (
        "def ddpify_in_float32(op):" in result.source
        and "def in_float32(x):" in result.source
    )
    assert "ddpify_in_float32(criterion)(torch.sigmoid(model(xi)), yi)" in result.source
    assert "loss = in_float32(bce_sum(model, x, y))" in result.source
    assert "DDP004" in _codes(result)


def test_apex_o1_is_told_that_it_bans_the_op():
    result = convert_source(STATEMENT_KINDS, Options(amp="apex"))
    notes = [f for f in result.findings if f.code == "DDP044"]
    assert len(notes) == 1 and not notes[0].fixed and "apex O1 bans" in notes[0].message
    assert "amp.initialize(" in result.source and "in_float32" not in result.source
    assert "DDP044" not in _codes(
        convert_source(STATEMENT_KINDS, Options(amp="apex", opt_level="O2"))
    )


# -- sparse tensors ---------------------------------------------------------------------

SPARSE = (
    HEAD
    + """

def load_adjacency(n):
    dense = (torch.rand(n, n) < 0.2).float() + torch.eye(n)
    return (dense / dense.sum(1, keepdim=True)).to_sparse()


class Propagate(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, x, adj):
        return torch.mm(adj, self.lin(x))


net = Propagate().to(device)
adj = load_adjacency(8).to(device)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        out = net(x.to(device), adj)
        loss = F.mse_loss(out, y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
)


@pytest.mark.parametrize("amp", ["auto", "bf16", "fp16"])
def test_sparse_tensor_made_in_a_helper_keeps_autocast_out(amp):
    result = convert_source(SPARSE, Options(amp=amp))
    assert (
        "torch.autocast" not in result.source
        and "AMP_DTYPE" not in result.source
        and "SCALER" not in result.source
    )
    notes = [f for f in result.findings if f.code == "DDP140"]
    assert len(notes) == 1 and not notes[0].fixed and ".to_sparse()" in notes[0].message
    assert "DDP040" not in _codes(result)


@pytest.mark.parametrize(
    "make, named",
    [
        (
            "torch.sparse_coo_tensor(idx, torch.ones(8), (8, 8))",
            "torch.sparse_coo_tensor",
        ),
        ("torch.zeros(8, 8, layout=torch.sparse_coo)", "layout=torch.sparse_coo"),
        (
            "torch.sparse.FloatTensor(idx, torch.ones(8), torch.Size([8, 8]))",
            "torch.sparse.FloatTensor",
        ),
    ],
)
def test_sparse_constructors_are_recognised(make, named):
    src = SPARSE.replace(
        "    return (dense / dense.sum(1, keepdim=True)).to_sparse()",
        f"    idx = torch.stack([torch.arange(8), torch.arange(8)])\n    return {make}",
    )
    result = convert_source(src)
    assert "torch.autocast" not in result.source
    assert any(f.code == "DDP140" and named in f.message for f in result.findings)


def test_sparse_product_in_the_forward_is_named_first():
    src = SPARSE.replace(
        "torch.mm(adj, self.lin(x))", "torch.sparse.mm(adj, self.lin(x))"
    )
    result = convert_source(src)
    notes = [f for f in result.findings if f.code == "DDP140"]
    assert len(notes) == 1 and "torch.sparse.mm" in notes[0].message
