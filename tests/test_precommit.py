"""The pre-commit hooks of .pre-commit-hooks.yaml, installed by pre-commit itself from a git copy of
this working tree (the working tree is not committed, so a throw-away repository holds a copy).

Slow-ish (pre-commit builds a virtualenv and pip-installs ddpify, libcst and click): < 2 minutes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = (
    pytest.mark.runs
)  # trains or runs tools in subprocesses: not the converter tier

ROOT = Path(__file__).resolve().parents[1]
GIT_ID = [
    "-c",
    "user.name=ddpify test",
    "-c",
    "user.email=test@example.invalid",
    "-c",
    "commit.gpgsign=false",
]


def git(cwd: Path, *args: str) -> str:
    res = subprocess.run(
        ["git", *GIT_ID, *args], cwd=cwd, capture_output=True, text=True, check=True
    )
    return res.stdout.strip()


def make_hook_repo(dest: Path) -> str:
    """A git repository with the project's files as they are in the working tree; returns HEAD."""
    dest.mkdir()
    shutil.copytree(
        ROOT / "ddpify",
        dest / "ddpify",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    for name in ("pyproject.toml", ".pre-commit-hooks.yaml", "README.md"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, dest / name)
    if not (dest / "README.md").exists():
        (dest / "README.md").write_text(
            "# ddpify\n"
        )  # pyproject's readme must exist to build
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "snapshot of the working tree")
    return git(dest, "rev-parse", "HEAD")


def training_script() -> bytes:
    inputs = sorted((ROOT / "fixtures").glob("*/input.py"))
    if not inputs:
        pytest.fail("no fixtures/*/input.py to commit")
    return inputs[0].read_bytes()


def test_precommit_hooks(tmp_path):
    sha = make_hook_repo(tmp_path / "ddpify-src")
    repo = tmp_path / "user-repo"
    repo.mkdir()
    git(repo, "init", "-q")
    original = training_script()
    (repo / "train.py").write_bytes(original)
    (repo / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {tmp_path / 'ddpify-src'}\n    rev: {sha}\n    hooks:\n      - id: ddpify\n      - id: ddpify-check\n      - id: ddpify-lint\n"
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "single-GPU script")

    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    env["PRE_COMMIT_HOME"] = str(tmp_path / "pre-commit-home")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    def pre_commit(hook: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pre_commit", "run", hook, "--all-files", "--color", "never"],
            cwd=repo, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip

    # The check hook fails with a diff and leaves the file alone.
    check = pre_commit("ddpify-check")
    assert check.returncode == 1, check.stdout + check.stderr
    assert "--- train.py" in check.stdout and "+++ train.py" in check.stdout
    assert "would convert train.py" in check.stdout
    assert (repo / "train.py").read_bytes() == original

    # The rewriting hook fails the first time (file modified), passes the second time.
    first = pre_commit("ddpify")
    assert first.returncode == 1, first.stdout + first.stderr
    assert "files were modified by this hook" in first.stdout
    converted = (repo / "train.py").read_bytes()
    assert converted != original and b"ddp_in_place(model" in converted
    second = pre_commit("ddpify")
    assert second.returncode == 0, second.stdout + second.stderr
    assert (repo / "train.py").read_bytes() == converted

    # And the converted file passes the check hook, and lint finds no DDP bug in it.
    assert pre_commit("ddpify-check").returncode == 0
    assert pre_commit("ddpify-lint").returncode == 0

    # The lint hook fails on a DDP bug (a barrier on rank 0 only), naming the place.
    (repo / "buggy.py").write_bytes(
        (
            ROOT / "fixtures" / "lint" / "bugs" / "13_barrier_in_rank0_branch.py"
        ).read_bytes()
    )
    git(repo, "add", "buggy.py")
    lint = pre_commit("ddpify-lint")
    assert lint.returncode == 1, lint.stdout + lint.stderr
    assert "buggy.py:29:9: DDP210 [error]" in lint.stdout
