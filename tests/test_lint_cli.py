"""`ddpify lint`'s command line: text and JSON output, exit codes, stdin, directories (the
converter's skip rules), `# ddpify: ignore[CODE]`, [tool.ddpify] ignore/exclude, project mode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpify.lint.cli import lint_command

ROOT = Path(__file__).resolve().parents[1]
BUGS = ROOT / "fixtures" / "lint" / "bugs"
CLEAN = ROOT / "fixtures" / "lint" / "clean"

# A distributed script with one error (a barrier on rank 0 only) and one note (no device_id).
BUGGY = """import os
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
if dist.get_rank() == 0:
    dist.barrier()
dist.destroy_process_group()
"""
PLAIN = "import torch\nprint(torch.ones(2))\n"


def lint(*args: str, input: str | None = None):
    return CliRunner().invoke(
        lint_command, list(args), input=input, catch_exceptions=False
    )


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_text_output_and_exit_1_on_an_error(in_tmp):
    (in_tmp / "train.py").write_text(BUGGY)
    res = lint("train.py")
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    assert (
        "train.py:8:5: DDP210 [error] dist.barrier() only where `if dist.get_rank() == 0` holds"
        in lines[1]
    )
    assert lines[0].startswith("train.py:5:1: DDP283 [note] ")
    assert "1 error, 1 note in 1 file (1 distributed)" in res.stderr


def test_notes_alone_exit_0_and_quiet_hides_them(in_tmp):
    (in_tmp / "train.py").write_text(
        BUGGY.replace("    dist.barrier()", "    print('rank 0')")
    )
    res = lint("train.py")
    assert res.exit_code == 0 and "DDP283 [note]" in res.stdout
    quiet = lint("-q", "train.py")
    assert quiet.exit_code == 0 and quiet.stdout == "" and quiet.stderr == ""


def test_a_script_that_is_not_distributed_is_not_linted(in_tmp):
    (in_tmp / "plain.py").write_text(PLAIN)
    res = lint("plain.py")
    assert res.exit_code == 0 and res.stdout == ""
    assert "0 errors, 0 notes in 1 file (0 distributed)" in res.stderr


def test_json_output(in_tmp):
    (in_tmp / "train.py").write_text(BUGGY)
    res = lint("--output-format", "json", "train.py")
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    (f,) = doc["files"]
    assert f["path"] == "train.py" and f["status"] == "checked" and f["errors"] == []
    codes = {(x["code"], x["severity"], x["line"], x["col"]) for x in f["findings"]}
    assert codes == {("DDP210", "error", 8, 5), ("DDP283", "note", 5, 1)}
    assert lint("--json", "train.py").stdout == res.stdout


def test_unparsable_and_unreadable_input_exit_2_with_the_place(in_tmp):
    (in_tmp / "bad.py").write_text(
        "import torch.distributed as dist\nif True:\nx = (\n"
    )
    (in_tmp / "train.py").write_text(BUGGY)
    res = lint("bad.py", "train.py", "missing.py")
    assert res.exit_code == 2  # the other files are still linted
    assert "DDP210" in res.stdout
    assert any(
        line.startswith("bad.py:3:") and ": error: SyntaxError" in line
        for line in res.stderr.splitlines()
    ), res.stderr
    assert "missing.py: error:" in res.stderr


def test_stdin_with_a_filename(in_tmp):
    res = lint("-", "--stdin-filename", "job/train.py", input=BUGGY)
    assert res.exit_code == 1
    assert res.stdout.splitlines()[1].startswith("job/train.py:8:5: DDP210 [error]")
    plain = lint("-", input=PLAIN)
    assert plain.exit_code == 0


def test_ignore_comment_and_option(in_tmp):
    (in_tmp / "train.py").write_text(
        BUGGY.replace(
            "    dist.barrier()", "    dist.barrier()  # ddpify: ignore[DDP210]"
        )
    )
    res = lint("train.py")
    assert res.exit_code == 0 and "DDP210" not in res.stdout
    (in_tmp / "train.py").write_text(BUGGY)
    assert lint("--ignore", "DDP210,DDP283", "train.py").stdout == ""


def test_pyproject_ignore_and_exclude(in_tmp):
    (in_tmp / "pyproject.toml").write_text(
        '[tool.ddpify]\nignore = ["DDP283"]\nexclude = ["legacy/"]\n'
    )
    (in_tmp / "legacy").mkdir()
    (in_tmp / "legacy" / "old.py").write_text(BUGGY)
    (in_tmp / "train.py").write_text(BUGGY)
    res = lint(".")
    assert res.exit_code == 1
    assert res.stdout.splitlines() == [
        line
        for line in res.stdout.splitlines()
        if line.startswith("train.py:8:5: DDP210")
    ]
    assert "legacy" not in res.stdout + res.stderr


def test_directories_skip_what_the_converter_skips(in_tmp):
    for d in ("src", ".hidden", "venv", "build", "node_modules"):
        (in_tmp / d).mkdir()
        (in_tmp / d / "train.py").write_text(BUGGY)
    (in_tmp / "src" / "notes.txt").write_text(BUGGY)
    res = lint(".")
    assert [
        line.split(":")[0] for line in res.stdout.splitlines() if "[error]" in line
    ] == ["src/train.py"]


def test_project_mode_reports_the_module_file(tmp_path, monkeypatch):
    monkeypatch.chdir(BUGS / "56_project_trainer_no_set_epoch")
    res = lint("train.py")
    assert res.exit_code == 1
    assert res.stdout.startswith("trainer.py:20:9: DDP203 [error]")
    alone = lint("--no-project", "trainer.py")
    assert "DDP203" not in alone.stdout  # the module alone is not a distributed script


def test_clean_controls_exit_0():
    assert lint("-q", str(CLEAN)).exit_code == 0


def test_explain_a_lint_code():
    res = lint("--explain", "ddp210")
    assert res.exit_code == 0
    assert res.stdout.startswith("DDP210 (collective-in-rank-branch)")
    assert "Severity: error" in res.stdout and "ddpify lint reports:" in res.stdout
    table = lint("--explain", "all").stdout
    assert (
        "| DDP210 | collective-in-rank-branch | error |" in table
        and "DDP020" not in table
    )


def test_dispatched_from_the_main_command(tmp_path):
    (tmp_path / "train.py").write_text(BUGGY)
    res = subprocess.run(
        [sys.executable, "-m", "ddpify", "lint", "train.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1 and "DDP210 [error]" in res.stdout


def test_lint_imports_no_torch(tmp_path):
    """Like the converter, lint never imports torch (nor the user's code)."""
    (tmp_path / "train.py").write_text(BUGGY)
    code = (
        "import sys; from ddpify.lint.cli import lint_command\n"
        "try:\n    lint_command.main(['train.py'], standalone_mode=False)\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr


def test_pre_commit_hook_is_declared():
    text = (ROOT / ".pre-commit-hooks.yaml").read_text()
    assert "- id: ddpify-lint\n" in text and "entry: ddpify lint\n" in text
