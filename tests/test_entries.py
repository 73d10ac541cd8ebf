"""Every entry: a package that builds an optimizer and steps it is a training script however it
is started. sacred's `@ex.automain` runs its function with no call of it; `ddpify DIR` takes a
console script's module and a package's `__main__.py` as entries; a training module imported
inside a function is refused (DDP100), not called "not a training script"."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT

from ddpify import Options, convert_source

TRAIN = """\
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
    for epoch in range(epochs):
        for x, y in loader:
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        print("loss", loss.item())
"""
HEAD = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
"""


def test_sacred_automain_function_holds_the_process_group():
    src = (
        HEAD
        + "from sacred import Experiment\n\nex = Experiment('tiny')\n\n\n"
        + "@ex.config\ndef cfg():\n    epochs = 2\n    lr = 0.1\n\n\n"
        + "@ex.automain\ndef main(epochs, lr):\n"
        + TRAIN
    )
    res = convert_source(src, Options())
    assert not res.blocking, (
        res.blocking
    )  # DDP153 before: the function was not seen as run
    body = res.source.split("def main(epochs, lr):\n", 1)[1]
    assert body.startswith("    ddp_setup()\n")
    assert body.rstrip().endswith("dist.destroy_process_group()")
    assert any(f.code == "DDP003" and "decorator" in f.message for f in res.findings)


def test_an_experiment_decorator_of_another_object_is_no_entry():
    src = HEAD + "\n\nclass Ex:\n    def automain(self, f):\n        return f\n\n\n"
    src += "ex = Ex()\n\n\n@ex.automain\ndef main(epochs=2, lr=0.1):\n" + TRAIN
    res = convert_source(src, Options())
    assert "def main(epochs=2, lr=0.1):\n    ddp_setup()" not in res.source


def _package(tmp_path, lazy: bool):
    pkg = tmp_path / "src" / "tinytrain"
    pkg.mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "tinytrain"\nversion = "0.1"\n'
        '[project.scripts]\ntinytrain = "tinytrain.cli:main"\n'
    )
    (pkg / "__init__.py").write_text("")
    (pkg / "engine.py").write_text(HEAD + "\n\ndef fit(epochs, lr=0.1):\n" + TRAIN)
    imp = "    from tinytrain.engine import fit\n" if lazy else ""
    top = "" if lazy else "from tinytrain.engine import fit\n\n\n"
    (pkg / "cli.py").write_text(f"{top}def main():\n{imp}    fit(2)\n")
    (pkg / "__main__.py").write_text("from tinytrain.cli import main\n\nmain()\n")


def _ddpify(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "ddpify", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=120,
    )


def test_directory_takes_the_console_script_module_as_the_entry(tmp_path):
    _package(tmp_path, lazy=False)
    run = _ddpify("--check", ".", cwd=tmp_path)
    out = run.stdout + run.stderr
    assert "DDP153" not in out, out  # engine.py is converted with its entry, not alone
    assert all("__main__.py" in ln for ln in out.splitlines() if "DDP099" in ln), out
    assert "would convert src/tinytrain/cli.py" in out
    assert "would convert src/tinytrain/engine.py" in out
    assert (
        "would convert src/tinytrain/__main__.py" not in out
    )  # it calls main(), which sets up


def test_a_training_module_imported_inside_the_entry_function_is_refused(tmp_path):
    _package(tmp_path, lazy=True)
    run = _ddpify("--check", "src/tinytrain/cli.py", cwd=tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode == 2, out
    assert "DDP100" in out and "DDP099" not in out, out
