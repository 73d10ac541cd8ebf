"""Project mode: an entry script and the local modules it imports, converted as one program
(fixtures/1NN_*/input -> expected/, see conftest.PROJECTS); the CLI writes every file or none;
import resolution stays inside the project; the outputs train as 2 gloo ranks and pass verify."""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    PROJECTS,
    ROOT,
    clean_env,
    convert_fixture_project,
    free_port,
    is_refused,
    project_entry,
)

from ddpify.analysis.project import local_modules
from ddpify.project import convert_project, is_project

IDS = [p.name for p in PROJECTS]


def _files(top: Path) -> dict[str, str]:
    return {str(p.relative_to(top)): p.read_text() for p in sorted(top.rglob("*.py"))}


@pytest.fixture(params=PROJECTS, ids=IDS)
def project(request) -> Path:
    return request.param


def test_there_are_project_fixtures_of_each_layout():
    assert len([d for d in PROJECTS if not is_refused(d)]) >= 4
    assert any(is_refused(d) for d in PROJECTS)


def test_expected_outputs(project):
    _, _, outputs = convert_fixture_project(project)
    got = _files(project / "input")  # files outside the project stay as they are
    got.update(outputs)
    expected = _files(project / "expected")
    assert sorted(got) == sorted(expected)
    for name, text in expected.items():
        assert got[name] == text, "".join(
            difflib.unified_diff(
                text.splitlines(True), got[name].splitlines(True), name, "converted"
            )
        )


def test_expected_findings(project):
    _, lines, _ = convert_fixture_project(project)
    assert lines == (project / "expected.txt").read_text().splitlines()


def test_output_is_fixed_point(project):
    result, _, outputs = convert_fixture_project(project, base="expected")
    assert outputs == {
        n: t for n, t in _files(project / "expected").items() if n in outputs
    }
    if _files(project / "input") != _files(project / "expected"):
        assert result.status == "already-distributed"


def test_unchanged_modules_and_refusals_are_byte_identical(project):
    inputs, outputs = _files(project / "input"), _files(project / "expected")
    if is_refused(project):
        assert inputs == outputs
    # the entry always changes (a module it imports may need nothing: a step timer's class)
    entry = str(project_entry(project).relative_to(project / "input"))
    if not is_refused(project):
        assert inputs[entry] != outputs[entry]


@pytest.mark.runs
def test_modules_stay_importable_without_a_process_group(project, tmp_path, forkrun):
    """No process group at import time: tools and tests can still import each module."""
    if is_refused(project):
        pytest.skip("refused: nothing converted")
    entry = project_entry(project).relative_to(project / "input")
    modules = [
        n[:-3].replace("/", ".").removesuffix(".__init__")
        for n in _files(project / "expected")
        if n != str(entry)
    ]
    code = f"import importlib, sys, torch.distributed as d\nsys.path.insert(0, {str(project / 'expected')!r})\n"
    code += "".join(f"importlib.import_module({m!r})\n" for m in modules)
    code += "assert not d.is_initialized()\nprint('ok')\n"
    (tmp_path / "import_all.py").write_text(code)
    run = forkrun.run(tmp_path / "import_all.py", [], project / "expected", timeout=120)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-3000:]


# The real torchrun (agent, rendezvous, each interpreter's own exit) for one project here, and
# for 101 in test_verify_converts_the_project_and_runs_a_converted_folder; the others run as 2
# ranks forked from one process that imported torch (tests/forkrun.py), with torchrun's variables.
REAL_TORCHRUN = {"100_trainer_class_module"}


@pytest.mark.runs
def test_real_torchrun_set_exists():
    assert REAL_TORCHRUN <= set(IDS), sorted(REAL_TORCHRUN - set(IDS))


@pytest.mark.runs
def test_runs_as_two_ranks(project, tmp_path, forkrun):
    if is_refused(project):
        pytest.skip("refused: nothing converted")
    work = tmp_path / "project"
    shutil.copytree(project / "expected", work)
    entry = work / project_entry(project).relative_to(project / "input")
    if (project / "launch.txt").exists():
        # a console script's module has no __main__ block: run what `pip install` would
        # write for it (a file of the fixture that imports the function and calls it)
        entry = work / (project / "launch.txt").read_text().strip()
    if project.name in REAL_TORCHRUN:
        logs = tmp_path / "logs"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            f"--log-dir={logs}",
            "--redirects=3",
            "--tee=3",
            str(entry),
        ]
        proc = subprocess.run(
            cmd,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env=clean_env(),
        )
        returncode, out = proc.returncode, proc.stdout + proc.stderr
        rank0 = next(logs.glob("*/attempt_0/0/stdout.log")).read_text()
        rank1 = next(logs.glob("*/attempt_0/1/stdout.log")).read_text()
    else:
        run = forkrun.run(
            entry,
            [],
            tmp_path,
            nproc=2,
            env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())},
        )
        assert not run.timed_out, run.stderr[-4000:]
        returncode, out = run.returncode, run.stdout + run.stderr
        rank0, rank1 = run.ranks[0].stdout, run.ranks[1].stdout
    assert returncode == 0, out[-4000:]
    assert "terminate called" not in out, out[-4000:]
    assert "epoch" in rank0, rank0[-2000:]
    # prints in every file of the project (helpers included) are rank 0's alone
    assert rank1.strip() == "", rank1[-2000:]


@pytest.mark.runs
def test_other_scripts_of_the_repository_still_run_as_plain_python(project, tmp_path):
    """others.txt names scripts of the fixture that the conversion does not run (an inference
    script that imports the model's module): each still runs as a plain `python` process,
    with no process group, after the modules it imports were converted for the entry."""
    others = project / "others.txt"
    if not others.exists():
        pytest.skip("no other script in this fixture")
    work = tmp_path / "project"
    shutil.copytree(project / "expected", work)
    for name in others.read_text().split():
        proc = subprocess.run(
            [sys.executable, name],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=120,
            env=clean_env(),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]


# -- the command line ----------------------------------------------------------------------------


def _ddpify(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "ddpify", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=120,
    )


@pytest.mark.runs
def test_cli_converts_every_file_of_the_project(tmp_path):
    d = next(p for p in PROJECTS if p.name.startswith("101_"))
    work = tmp_path / "p"
    shutil.copytree(d / "input", work)
    check = _ddpify("--check", "train.py", cwd=work)
    assert check.returncode == 1, check.stderr
    for name in ("train.py", "engine.py", "utils.py"):
        assert f"would convert {name}" in check.stderr
    assert (
        "engine.py:11:5: DDP021" in check.stderr
    )  # path:line:col of the file concerned
    diff = _ddpify("--diff", "train.py", cwd=work)
    for name in ("train.py", "engine.py", "utils.py"):
        assert f"+++ {name}" in diff.stdout
    assert _files(work) == _files(d / "input")  # --check and --diff write nothing
    write = _ddpify("train.py", cwd=work)
    assert write.returncode == 0, write.stderr
    assert _files(work) == _files(d / "expected")
    assert write.stderr.count("run it with") == 1  # the entry alone is what one runs
    again = _ddpify("--check", "train.py", cwd=work)
    assert again.returncode == 0, again.stderr
    assert not list(work.glob(".*ddpify*")), "a temporary file was left behind"


@pytest.mark.runs
def test_cli_refusal_leaves_every_file_untouched(tmp_path):
    d = next(p for p in PROJECTS if is_refused(p))
    work = tmp_path / "p"
    shutil.copytree(d / "input", work)
    run = _ddpify(str(project_entry(d).relative_to(d / "input")), cwd=work)
    assert run.returncode == 2
    assert "DDP100 [blocking]" in run.stderr and "recipes.py" in run.stderr
    assert _files(work) == _files(d / "input")


@pytest.mark.runs
def test_directory_finds_the_entry_and_converts_the_project_once(tmp_path):
    d = next(p for p in PROJECTS if p.name.startswith("103_"))
    work = tmp_path / "repo"
    shutil.copytree(d / "input", work)
    run = _ddpify(".", cwd=work)
    assert run.returncode == 0, run.stderr
    assert _files(work) == _files(d / "expected")
    assert "refused" not in run.stderr


@pytest.mark.runs
def test_shared_module_converted_the_same_for_two_entries(tmp_path):
    d = next(p for p in PROJECTS if p.name.startswith("101_"))
    work = tmp_path / "repo"
    shutil.copytree(d / "input", work)
    shutil.copy(work / "train.py", work / "train_small.py")
    text = (work / "train_small.py").read_text().replace("EPOCHS = 3", "EPOCHS = 1")
    (work / "train_small.py").write_text(text)
    run = _ddpify(".", cwd=work)
    assert run.returncode == 0, run.stderr
    assert (work / "engine.py").read_text() == (
        d / "expected" / "engine.py"
    ).read_text()
    assert (work / "train_small.py").read_text() == (
        d / "expected" / "train.py"
    ).read_text().replace("EPOCHS = 3", "EPOCHS = 1")


# -- import resolution ---------------------------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_resolution_follows_local_imports_only(tmp_path):
    _tree(
        tmp_path,
        {
            "pyproject.toml": "",
            "app/train.py": "import os\nimport pkg.mod\nfrom pkg import sub\nfrom helper import f\nimport venvlib\n",
            "app/helper.py": "from . import nothing_here\n",
            "pkg/__init__.py": "",
            "pkg/mod.py": "from .deep import g\n",
            "pkg/deep.py": "def g():\n    import lazy_one\n",
            "pkg/sub.py": "x = 1\n",
            "app/lazy_one.py": "",
            "app/.venv/lib/site-packages/venvlib.py": "",
        },
    )
    root, files = local_modules(str(tmp_path / "app" / "train.py"))
    assert root == str(tmp_path.resolve())
    names = [str(Path(f.path).relative_to(root)) for f in files]
    assert names[0] == "app/train.py"
    assert set(names[1:]) == {
        "pkg/__init__.py",
        "pkg/mod.py",
        "pkg/deep.py",
        "pkg/sub.py",
        "app/helper.py",
    }
    assert names.index("pkg/deep.py") < names.index("pkg/mod.py")  # dependencies first
    deep = next(f for f in files if f.path.endswith("deep.py"))
    assert [Path(p).name for _, p in deep.lazy] == ["lazy_one.py"]


def test_a_single_script_is_not_a_project(tmp_path):
    _tree(tmp_path, {"train.py": "import torch\nimport numpy\n"})
    assert not is_project(str(tmp_path / "train.py"))


def test_project_without_training_is_not_training(tmp_path):
    _tree(
        tmp_path,
        {
            "main.py": "from util import f\nf()\n",
            "util.py": "def f():\n    print('hi')\n",
        },
    )
    result = convert_project(str(tmp_path / "main.py"))
    assert result.status == "not-training"
    assert not any(r.changed for r in result.files)


@pytest.mark.runs
def test_modules_that_are_also_scripts_still_run(tmp_path, forkrun):
    """A module with its own `if __name__ == "__main__":` block keeps working as a script."""
    ran = 0
    for d in PROJECTS:
        if is_refused(d):
            continue
        entry = str(project_entry(d).relative_to(d / "input"))
        for name, text in _files(d / "expected").items():
            if name == entry or "__main__" not in text:
                continue
            work = tmp_path / d.name
            if not work.exists():
                shutil.copytree(d / "expected", work)
            run = forkrun.run(
                work / name, [], work, timeout=120
            )  # as `python name` in work
            assert run.returncode == 0, run.stderr[-3000:]
            ran += 1
    assert ran, "no project fixture has a module that is also a script"


@pytest.mark.runs
def test_module_script_that_needs_a_group_sets_it_up(tmp_path, forkrun):
    """A trainer module whose own __main__ block does not train, but whose code now uses DDP: run
    directly, its block sets up (and tears down) a process group of its own."""
    d = next(p for p in PROJECTS if p.name.startswith("100_"))
    shutil.copytree(d / "input", tmp_path / "p")
    trainer = tmp_path / "p" / "trainer.py"
    trainer.write_text(
        trainer.read_text()
        + '\n\nif __name__ == "__main__":\n    print(Trainer.__doc__ or "Trainer(model, optimizer, train_loader, device)")\n'
    )
    result = convert_project(str(tmp_path / "p" / "train.py"))
    assert result.status == "converted", [
        f.format("x") for r in result.files for f in r.findings
    ]
    out = next(r.output for r in result.files if r.path.endswith("trainer.py"))
    guard = out[out.index('if __name__ == "__main__":') :]
    assert (
        guard.splitlines()[1].strip() == "ddp_setup()"
        and "dist.destroy_process_group()" in guard
    )
    assert "\ndef ddp_setup():" in out
    trainer.write_text(out)
    run = forkrun.run(
        trainer, [], tmp_path / "p", timeout=120
    )  # as `python trainer.py`
    assert run.returncode == 0 and "Trainer" in run.stdout, run.stderr[-3000:]


@pytest.mark.runs
def test_verify_converts_the_project_and_runs_a_converted_folder(tmp_path, monkeypatch):
    """`ddpify verify train.py` converts the whole project into its run folder; `--no-convert`
    runs an already converted folder (its modules found next to the entry)."""
    pytest.importorskip("torch")
    from ddpify.verify import run_verify

    d = next(p for p in PROJECTS if p.name.startswith("101_"))
    monkeypatch.chdir(tmp_path)
    for folder, convert in (("input", True), ("expected", False)):
        lines: list[str] = []
        outcome = run_verify(
            str(d / folder / "train.py"),
            nproc=2,
            steps=12,
            backend="gloo",
            timeout=120.0,
            baseline=convert,
            convert=convert,
            echo=lines.append,
        )
        text = "\n".join(lines)
        assert outcome.exit_code == 0, text
        statuses = {c.name: c.status for c in outcome.checks}
        for check in ("params-in-sync", "data-sharding", "rank0-writes"):
            assert statuses[check] == "PASS", text
        if convert:
            assert "converted to a temporary copy" in text


def test_loop_in_the_entry_with_a_helper_module(tmp_path):
    """The loop stays in the entry (the common case): converted as one file would be, plus the
    helper's print on rank 0."""
    d = next(p for p in PROJECTS if p.name.startswith("102_"))
    _tree(
        tmp_path,
        {
            "helpers.py": "def log(epoch, loss):\n    print(f'epoch {epoch} loss {loss:.4f}')\n",
            "train.py": (d / "input" / "train.py")
            .read_text()
            .replace(
                "from helpers import describe, head_norm, save_checkpoint\n",
                "from helpers import log\n",
            )
            .replace("describe(model)\n", "")
            .replace(
                '    print(f"epoch {epoch} loss {loss.item():.4f} head norm {head_norm(model):.3f}")\n    save_checkpoint(model, "classifier.pt")\n',
                "    log(epoch, loss.item())\n",
            ),
            "model.py": (d / "input" / "model.py").read_text(),
        },
    )
    result = convert_project(str(tmp_path / "train.py"))
    assert result.status == "converted", [
        f.format(Path(r.path).name) for r in result.files for f in r.findings
    ]
    out = {Path(r.path).name: r.output for r in result.files}
    assert "    train_loader.sampler.set_epoch(epoch)\n" in out["train.py"]
    assert "    if RANK == 0:\n        print(" in out["helpers.py"]
    assert out["model.py"] == (d / "input" / "model.py").read_text()


def test_a_project_distributed_with_todays_apis_is_left_as_it_is(tmp_path):
    """DINO's layout: the entry has a --local_rank flag and wraps DDP, a helper module sets up the
    group (init_process_group): already distributed, so no file changes, also in project mode."""
    (tmp_path / "dist_utils.py").write_text(
        "import os\nimport torch.distributed as dist\n\n\ndef init_distributed():\n"
        "    dist.init_process_group('gloo', init_method='env://')\n    return int(os.environ.get('RANK', 0))\n"
    )
    (tmp_path / "train.py").write_text(
        "import argparse\nimport torch\nimport torch.nn as nn\nimport dist_utils\n\n"
        "parser = argparse.ArgumentParser()\nparser.add_argument('--local_rank', type=int, default=0)\n"
        "args = parser.parse_args()\ndist_utils.init_distributed()\n"
        "model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nloss = model(torch.randn(2, 4)).sum()\n"
        "loss.backward()\nopt.step()\n"
    )
    res = convert_project(str(tmp_path / "train.py"))
    assert res.status == "already-distributed", res.status
    assert not any(f.changed for f in res.files)


TINY_ENTRY = (
    "import torch\nimport torch.nn.functional as F\nfrom torch.utils.data import DataLoader, TensorDataset\n"
    "from helpers import build\n\n"
    "torch.manual_seed(0)\nmodel = build()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8, shuffle=True)\n"
    "for epoch in range(2):\n    for x, y in loader:\n"
    "        loss = F.mse_loss(model(x), y)\n        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
)


def test_names_another_file_imports_are_not_the_entrys(tmp_path):
    """helpers.py imports DistributedDataParallel and dist at module level; train.py imports
    neither: its wrap still needs imports of its own (the benchmark's benchmodels.py had the wrap
    read a name only the helper bound, NameError at the first step)."""
    _tree(
        tmp_path,
        {
            "helpers.py": (
                "import torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel\n"
                "import torch.nn as nn\n\n\ndef build():\n    return nn.Linear(4, 1)\n\n\n"
                "def is_ddp(m):\n    return isinstance(m, DistributedDataParallel) and dist.is_initialized()\n"
            ),
            "train.py": TINY_ENTRY,
        },
    )
    result = convert_project(str(tmp_path / "train.py"))
    assert result.status == "converted", [
        f.format(Path(r.path).name) for r in result.files for f in r.findings
    ]
    out = {Path(r.path).name: r.output for r in result.files}["train.py"]
    assert "def ddp_in_place(module" in out and "ddp_in_place(model)" in out
    assert (
        "import torch.distributed as dist\n" in out
        and "dist.destroy_process_group()" in out
    )
    from ddpify.undefined import unbound_reads

    assert unbound_reads(out)[0] == set()  # (names read unbound, ...)


def test_a_name_only_another_file_binds_is_refused_per_file(tmp_path, monkeypatch):
    """The last check reads each output file on its own (the merged program binds every file's
    names): a conversion that reads a helper's import in the entry is refused, not written."""
    import ddpify.transforms.base as base

    monkeypatch.setattr(
        base.Context,
        "_resolve_aliases",
        lambda self: (
            setattr(
                self,
                "_bound",
                {
                    "DistributedTrainSampler": {
                        "torch.utils.data.distributed.DistributedSampler"
                    }
                },
            )
            or {
                **{k: v[1] for k, v in base.IMPORTS.items()},
                "DistributedSampler": "DistributedTrainSampler",
            }
        ),
    )
    _tree(
        tmp_path,
        {
            "helpers.py": "from torch.utils.data.distributed import DistributedSampler as DistributedTrainSampler\nimport torch.nn as nn\n\n\ndef build():\n    return nn.Linear(4, 1)\n",
            "train.py": TINY_ENTRY,
        },
    )
    result = convert_project(str(tmp_path / "train.py"))
    assert result.status == "refused"
    findings = [f for r in result.files for f in r.findings]
    assert any(
        f.code == "DDP005" and "DistributedTrainSampler" in f.message for f in findings
    ), findings
    assert all(r.output == r.source for r in result.files)
