"""Files ddpify must leave alone, and what it says about them: its own output (DDP090) and
files that do not train (DDP099, with and without the quick text test)."""

from pathlib import Path

import pytest

from ddpify import Options, convert_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
OWN_OUTPUTS = [
    "02_mnist_classic",
    "13_checkpoint_resume",
    "36_gpt_param_groups_method",
    "44_multiline_loader_calls",
]

NOT_TRAINING = '''"""Inference helper: loads a model and predicts; nothing is trained here."""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


def predict(path, x):
    model = Net()
    model.load_state_dict(torch.load(path, map_location="cpu"))
    model.eval()
    with torch.no_grad():
        return model(x.to("cuda")).argmax(1)  # NOTE: TEXT
'''


@pytest.mark.parametrize("name", OWN_OUTPUTS)
def test_own_output_is_already_distributed(name):
    src = (FIXTURES / name / "expected.py").read_text()
    r = convert_source(src, Options(), path="expected.py")
    assert r.source == src and not r.changed
    assert r.status == "already-distributed"
    assert [f.code for f in r.findings] == ["DDP090"]
    # it points at the line that joins the process group, not at 1:1
    line = src.splitlines()[r.findings[0].line - 1]
    assert "init_process_group" in line, line


@pytest.mark.parametrize(
    "comment",
    ["", "the backward pass lives in train.py"],
    ids=["quick-text-test", "full-analysis"],
)
def test_not_training_is_left_alone(comment):
    # A comment that mentions "backward" sends the file through the full analysis; both
    # ways must come to the same answer.
    src = NOT_TRAINING.replace("TEXT", comment)
    r = convert_source(src, Options(), path="util.py")
    assert r.source == src and not r.changed
    assert r.status == "not-training"
    assert [(f.code, f.line, f.col) for f in r.findings] == [("DDP099", 1, 1)]


def test_modern_ddp_script_with_a_local_rank_flag_is_left_alone():
    # DINO's style: DDP in this file, the process group set up by a helper module, and a
    # --local_rank flag kept for the old launcher: already distributed, not legacy
    from ddpify import Options, convert_source

    src = (
        "import argparse\nimport torch\nimport torch.nn as nn\nimport utils\n\n"
        "parser = argparse.ArgumentParser()\n"
        'parser.add_argument("--local_rank", default=0, type=int)\n'
        "args = parser.parse_args()\nutils.init_distributed_mode(args)\n"
        "model = nn.parallel.DistributedDataParallel(nn.Linear(2, 2).cuda(), device_ids=[args.gpu])\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "with torch.cuda.amp.autocast(True):\n    loss = model(torch.randn(4, 2).cuda()).sum()\n"
        "loss.backward()\nopt.step()\n"
    )
    result = convert_source(src, Options())
    assert result.source == src and result.status == "already-distributed"
    assert sorted(f.code for f in result.findings) == ["DDP090", "DDP091"]


# -- already distributed by a framework: untouched, exit 0 (issue 27, issue 33) -----------------
CASES = Path(__file__).resolve().parent / "unchanged_cases"


@pytest.mark.parametrize("path", sorted(CASES.glob("*.py")), ids=lambda p: p.stem)
def test_distributed_by_any_framework_is_left_alone(path):
    src = path.read_text()
    r = convert_source(src, Options(), path=path.name)
    assert r.source == src and not r.changed and r.status == "already-distributed"
    assert [f.code for f in r.findings] == ["DDP090"], r.findings


def _ddpify(*args, cwd):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "ddpify", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_passes_on_distributed_scripts(tmp_path):
    """A pre-commit `--check` over scripts distributed by Accelerate, Fabric, DeepSpeed, Horovod,
    Lightning or by hand exits 0: nothing to convert."""
    import shutil

    for p in CASES.glob("*.py"):
        shutil.copy(p, tmp_path / p.name)
    proc = _ddpify("--check", ".", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "DDP102" not in proc.stdout + proc.stderr


def test_project_distributed_by_accelerate_is_left_alone(tmp_path):
    """`ddpify .` over a repository whose entry uses Accelerate and imports a module that is also a
    script (its demo block trains): the project is already distributed, so no file is converted
    and nothing is refused (DDP102 was reported here, exit 2)."""
    (tmp_path / "helper.py").write_text(
        "import torch\n\n\ndef fit(model, loader, opt, backward):\n    for x, y in loader:\n"
        "        loss = ((model(x) - y) ** 2).mean()\n        opt.zero_grad()\n        backward(loss)\n        opt.step()\n"
        '    return loss\n\n\nif __name__ == "__main__":\n    m = torch.nn.Linear(4, 1)\n    o = torch.optim.SGD(m.parameters(), lr=0.1)\n'
        "    print(fit(m, [(torch.randn(8, 4), torch.randn(8, 1))], o, lambda loss: loss.backward()))\n"
    )
    (tmp_path / "train.py").write_text(
        "import torch\nfrom accelerate import Accelerator\nfrom torch.utils.data import DataLoader, TensorDataset\n\nfrom helper import fit\n\n"
        "\ndef main():\n    accelerator = Accelerator()\n    model = torch.nn.Linear(4, 1)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8, shuffle=True)\n"
        "    model, opt, loader = accelerator.prepare(model, opt, loader)\n    for epoch in range(2):\n"
        '        print(fit(model, loader, opt, accelerator.backward))\n\n\nif __name__ == "__main__":\n    main()\n'
    )
    before = {p.name: p.read_text() for p in tmp_path.glob("*.py")}
    for args in (["--check", "."], ["."]):
        proc = _ddpify(*args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (
            "DDP090" in proc.stdout + proc.stderr
            and "DDP102" not in proc.stdout + proc.stderr
        )
    assert {p.name: p.read_text() for p in tmp_path.glob("*.py")} == before
