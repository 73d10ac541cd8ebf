"""DDP applied in place and the process group follow the device the script actually puts its
model on (a --cuda flag left off keeps it on the CPU on a GPU machine): no device_ids, a
gloo+NCCL group, checkpoints that keep CPU tensors on the CPU. DDP applied in place broadcasts
no buffers, so a model run more than once before one backward needs nothing more. Fixtures
170-173."""

from __future__ import annotations

import pytest

from pathlib import Path

from ddpify import Options, convert_source

FLAG_SCRIPT = """\
import argparse
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--cuda", action="store_true")
args = parser.parse_args()
device = torch.device("cuda" if args.cuda else "cpu")
model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8, shuffle=True)
for epoch in range(2):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
{step}
torch.save(model.state_dict(), "m.pt")
model.load_state_dict(torch.load("m.pt"))
"""
ONE_FORWARD = """\
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
TWO_FORWARDS = """\
        loss = ((model(x) - y) ** 2).mean() + ((model(x + 1) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
EITHER_FORWARD = """\
        if epoch % 2:
            out = model(x)
        else:
            out = model(-x)
        loss = ((out - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
LOOP_FORWARD = """\
        loss = sum(((model(v) - y) ** 2).mean() for v in (x, -x))
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
TWO_FORWARDS_TWO_BACKWARDS = """\
        opt.zero_grad()
        real, flipped = ((model(x) - y) ** 2).mean(), ((model(-x) - y) ** 2).mean()
        real.backward()
        flipped.backward()
        opt.step()
"""
NO_GRAD_FIRST = """\
        with torch.no_grad():
            before = model(x)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
NO_GRAD_AFTER = """\
        loss = ((model(x) - y) ** 2).mean()
        with torch.no_grad():
            after = model(x)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
FORWARD_BACKWARD_TWICE = """\
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        ((model(-x) - y) ** 2).mean().backward()
        opt.step()
"""


def convert(step: str, script: str = FLAG_SCRIPT, **opts):
    res = convert_source(script.format(step=step), Options(**opts))
    assert not res.blocking, res.blocking
    return res.source, res.findings


def ddp_line(code: str) -> str:
    return next(
        line.strip() for line in code.splitlines() if "ddp_in_place(model" in line
    )


def test_wrap_has_no_device_ids_and_the_group_has_gloo_for_cpu_tensors():
    code, findings = convert(ONE_FORWARD)
    assert ddp_line(code) == "ddp_in_place(model)"
    assert "device_id" not in code.split("ddp_setup()")[-1]
    # CUDA tensors through NCCL, the CPU tensors of a model kept on the CPU through gloo
    assert 'backend, device_id = "cpu:gloo,cuda:nccl", LOCAL_DEVICE' in code
    assert 'backend, device_id = "gloo", None' in code


def test_checkpoint_keeps_cpu_tensors_on_the_cpu():
    code, findings = convert(ONE_FORWARD)
    assert 'torch.load("m.pt", map_location={"cuda:0": str(LOCAL_DEVICE)})' in code
    assert any(
        f.code == "DDP071" and "CPU tensors staying on the CPU" in f.message
        for f in findings
    )


def test_cpu_program_still_maps_everything_to_the_cpu():
    script = FLAG_SCRIPT.replace(
        'device = torch.device("cuda" if args.cuda else "cpu")\n', ""
    ).replace(".to(device)", "")
    script = script.replace('parser.add_argument("--cuda", action="store_true")\n', "")
    code, findings = convert(ONE_FORWARD, script)
    assert "DDP120" in {f.code for f in findings}
    assert "map_location=LOCAL_DEVICE" in code
    assert ddp_line(code) == "ddp_in_place(model)"


def test_sync_bn_on_gpus_only_before_the_optimizer_takes_the_parameters():
    code, _ = convert(
        ONE_FORWARD, sync_bn=True, line_length=0
    )  # the statements unwrapped
    convert_line = (
        "model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) "
        'if LOCAL_DEVICE.type == "cuda" else model'
    )
    assert code.index(convert_line) < code.index("ddp_in_place(model)")
    assert code.index("ddp_in_place(model)") < code.index("opt = torch.optim.SGD(")


@pytest.mark.parametrize(
    "step",
    [
        TWO_FORWARDS,
        LOOP_FORWARD,
        TWO_FORWARDS_TWO_BACKWARDS,
        NO_GRAD_AFTER,
        EITHER_FORWARD,
        FORWARD_BACKWARD_TWICE,
        NO_GRAD_FIRST,
    ],
)
def test_repeated_forwards_need_no_option(step):
    # DDP applied in place synchronises no buffers: nothing to turn off for a second forward
    code, findings = convert(step)
    assert ddp_line(code) == "ddp_in_place(model)"
    assert "broadcast_buffers" not in code


def test_sync_bn_says_converted_only_where_the_model_has_batchnorm():
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"

    def ddp032(src: str):
        res = convert_source(src, Options(sync_bn=True))
        return res, [f for f in res.findings if f.code == "DDP032"]

    # no BatchNorm in the model's code: nothing converted, and the note says so
    res, (note,) = ddp032(
        (fixtures / "270_sync_bn_model_without_batchnorm" / "input.py").read_text()
    )
    assert not note.fixed and "has no BatchNorm layers" in note.message
    assert "convert_sync_batchnorm" not in res.source
    # BatchNorm in the model (here made by a helper of the file): converted, and said plainly
    res, found = ddp032(
        (fixtures / "173_gan_trainer_loop_sync_bn" / "input.py").read_text()
    )
    assert [f.message for f in found] == [
        f"BatchNorm layers of `self.{n}` converted to SyncBatchNorm on GPUs (--sync-bn), "
        "before its optimizer takes the new layers' parameters"
        for n in "GD"
    ]
    # a model whose class ddpify cannot read: converted (a no-op without BatchNorm), said as such
    src = (fixtures / "270_sync_bn_model_without_batchnorm" / "input.py").read_text()
    src = src.replace(
        "model = MLP().to(device)",
        "import torchvision\nmodel = torchvision.models.resnet18(num_classes=3).to(device)",
    )
    res, (f,) = ddp032(src)
    assert (
        f.fixed
        and "if it has any" in f.message
        and "convert_sync_batchnorm" in res.source
    )
