"""A script that never names a device stays a CPU program (DDP120): gloo, no device_ids, no
autocast, and nothing that touches CUDA, so it also runs on a GPU machine. A script that places
some things on a device but not its model is still refused (DDP035)."""

from __future__ import annotations

import libcst as cst
import pytest
from conftest import FIXTURES, ROOT, free_port

from ddpify import Options, convert_source
from ddpify.analysis import Analysis, devices

CPU_FIXTURES = [d for d in FIXTURES if "DDP120" in (d / "expected.txt").read_text()]

SCRIPT = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

{extra}
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8, shuffle=True)
for epoch in range(2):
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def handles_devices(src: str) -> bool:
    return devices.device_handling(Analysis(cst.parse_module(src), src)) is not None


@pytest.mark.parametrize(
    "extra",
    [
        "output = None\ninputs = []",  # "tpu" inside a word, "put" ...: not a device
        "torch.backends.cudnn.benchmark = True",
        "x = torch.zeros(3).cpu()",
    ],
)
def test_names_without_a_device(extra):
    assert not handles_devices(SCRIPT.format(extra=extra))


@pytest.mark.parametrize(
    "extra",
    [
        "use_cuda = torch.cuda.is_available()",
        'dev = torch.device("cpu")',
        "x = torch.zeros(3).cuda()",
        'x = torch.zeros(3).to("cuda:1")',
        "ngpu = 1",
        "model = nn.DataParallel(nn.Linear(4, 1))",
        'i = 0\nname = f"cuda:{i}"',
        'x = torch.zeros(3).to("mps")',
        "xla_dev = None",
    ],
)
def test_device_handling_found(extra):
    assert handles_devices(SCRIPT.format(extra=extra))


def test_cpu_program_has_no_cuda_and_no_precision():
    for amp in ("auto", "bf16", "fp16"):
        res = convert_source(SCRIPT.format(extra=""), Options(amp=amp))
        assert res.status == "converted" and res.changed
        assert "cuda" not in res.source.lower(), res.source
        assert "autocast" not in res.source and "SCALER" not in res.source
        assert (
            'init_process_group("gloo")' in res.source
            and "ddp_in_place(model)\n" in res.source
        )
        codes = {f.code: f for f in res.findings}
        assert not codes["DDP120"].blocking and not codes["DDP121"].blocking


def test_model_left_behind_while_batches_move_is_refused():
    src = SCRIPT.format(extra='device = "cuda"').replace(
        "for x, y in loader:\n",
        "for x, y in loader:\n        x, y = x.to(device), y.to(device)\n",
    )
    res = convert_source(src)
    assert res.status == "refused" and not res.changed
    assert [f.code for f in res.findings] == ["DDP035"]


def test_cpu_fixtures_exist_in_several_styles():
    names = {d.name for d in CPU_FIXTURES}
    assert {
        "45_cpu_only_regression",
        "140_cpu_only_main_functions",
        "141_cpu_only_trainer_class",
    } <= names
    for d in CPU_FIXTURES:
        assert "cuda" not in (d / "expected.py").read_text().lower(), d.name


# A GPU machine, simulated on CPU: CUDA says it is there, and any use of it raises.
SIMULATED_GPU = """\
import runpy
import sys

import torch


def _touched(name):
    def touched(*args, **kwargs):
        raise RuntimeError(f"torch.cuda.{name} called on a simulated GPU machine")
    return touched


torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 2
torch.cuda.is_bf16_supported = lambda *a, **k: True
for name in ("set_device", "current_device", "synchronize", "get_device_name", "get_device_properties", "init", "_lazy_init"):
    setattr(torch.cuda, name, _touched(name))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _run_on_simulated_gpus(script, tmp_path, forkrun):
    """2 ranks with torchrun's variables, forked from one process that imported torch (tests/forkrun.py)."""
    sim = tmp_path / "simulated_gpu.py"
    sim.write_text(SIMULATED_GPU)
    run = forkrun.run(
        sim,
        [str(script)],
        tmp_path,
        nproc=2,
        env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())},
    )
    assert not run.timed_out, run.stderr[-4000:]
    return run


@pytest.mark.runs
@pytest.mark.parametrize("name", ["45_cpu_only_regression"])
def test_cpu_program_runs_where_cuda_is_available(name, tmp_path, forkrun):
    run = _run_on_simulated_gpus(
        ROOT / "fixtures" / name / "expected.py", tmp_path, forkrun
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert "epoch 1" in run.stdout


@pytest.mark.runs
def test_simulated_gpu_machine_catches_cuda_use(tmp_path, forkrun):
    # the check above can fail: the GPU set-up of a device-aware output calls set_device there
    run = _run_on_simulated_gpus(
        ROOT / "fixtures" / "01_toplevel_regression" / "expected.py", tmp_path, forkrun
    )
    assert run.returncode != 0
    assert (
        "torch.cuda.set_device called on a simulated GPU machine"
        in run.stdout + run.stderr
    )
