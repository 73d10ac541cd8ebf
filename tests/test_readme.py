"""The documented commands, as written: the README's install lines, CONTRIBUTING.md's set-up and
test commands against what CI runs, the README's try-it in a fresh clone and both pre-commit
snippets, and the sample outputs of `ddpify launch` in docs/launch.md."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpify.launcher import launch_command
from ddpify.output import run_commands

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CONTRIBUTING = (ROOT / "CONTRIBUTING.md").read_text()
LAUNCH = (ROOT / "docs" / "launch.md").read_text()
BIN = str(Path(sys.executable).parent)
GIT_ID = [
    "-c",
    "user.name=ddpify test",
    "-c",
    "user.email=test@example.invalid",
    "-c",
    "commit.gpgsign=false",
]


def section(title: str, text: str = README) -> str:
    """From the heading `title` to the next heading of its level or above (not inside a code block)."""
    lines = text.splitlines()
    start = lines.index(title)
    level, fenced = title.count("#", 0, title.index(" ")), False
    for end in range(start + 1, len(lines)):
        fenced ^= lines[end].startswith("```")
        head = re.match(r"(#+) ", lines[end])
        if not fenced and head and len(head.group(1)) <= level:
            break
    else:
        end = len(lines)
    return "\n".join(lines[start:end]) + "\n"


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(r"```%s\n(.*?)```" % lang, text, re.S)


def commands(block: str) -> list[str]:
    """The `$ ` lines of a console block, without their trailing `# comment`."""
    out = []
    for line in block.splitlines():
        if line.startswith("$ "):
            out.append(re.sub(r"\s+#\s[^'\"]*$", "", line[2:]).strip())
    return out


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *GIT_ID, *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout.strip()


def fresh_clone(tmp_path: Path) -> Path:
    """A `git clone` of the working tree as it is (its files that git tracks or does not ignore)."""
    src = tmp_path / "origin"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    git(src, "init", "-q")
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", "the working tree")
    subprocess.run(
        ["git", "clone", "-q", str(src), str(tmp_path / "ddpify")], check=True
    )
    return tmp_path / "ddpify"


def env_for(clone: Path | None = None) -> dict:
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "FORCE_COLOR")
    }
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    if clone is not None:
        env["PYTHONPATH"] = str(clone)  # the clone's ddpify, not this tree's
    return env


# --------------------------------------------------------------------------- install, CI


def test_install_lines_give_the_cpu_build():
    install = section("## Install")
    first, gpu = [commands(b) for b in blocks(install, "console")[:2]]
    assert first[0] == "git clone <this repository> ddpify && cd ddpify"
    assert (
        "python -m pip install torch --index-url https://download.pytorch.org/whl/cpu"
        in first
    )
    assert first[-1] == 'python -m pip install -e ".[verify]"'
    assert gpu == ["python -m pip install torch"]
    pyproject = (ROOT / "pyproject.toml").read_text()
    # the extra the README installs exists and brings torch >= the version the text accepts
    assert re.search(r'^verify = \["torch>=2\.4"', pyproject, re.M)
    assert "Any torch from 2.4 on works" in install.replace("\n", " ")


def test_contributing_sets_up_and_tests_as_ci_does():
    ci = (ROOT / ".ci" / "run").read_text()
    pin = re.search(r"pip install -q (torch==[\d.]+)", ci).group(1)
    setup = section("## Set up", CONTRIBUTING)
    lines = [c for b in blocks(setup, "console") for c in commands(b)]
    # CI's torch, as the CPU wheel: the pin alone would fetch the CUDA build from PyPI
    assert (
        f"python -m pip install {pin} --index-url https://download.pytorch.org/whl/cpu"
        in lines
    )
    assert lines.index(
        f"python -m pip install {pin} --index-url https://download.pytorch.org/whl/cpu"
    ) < lines.index('python -m pip install -e ".[test]"')
    assert f"`{pin}`" in setup and "`.ci/run`" in setup
    # CONTRIBUTING's test command is what CI runs, and its lint steps too
    assert ci.strip().splitlines()[-1] in lines
    for step in ("ruff check .", "python tools/rules_table.py --check"):
        assert step in ci.splitlines() and step in lines


def test_the_converter_tier_is_the_runs_marker():
    setup = section("## Set up", CONTRIBUTING)
    assert 'python -m pytest -q -n 2 -m "not runs"' in [
        c for b in blocks(setup, "console") for c in commands(b)
    ]
    assert '"runs: ' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.runs
def test_try_it_runs_in_a_fresh_clone(tmp_path: Path):
    clone = fresh_clone(tmp_path)
    script = " && ".join(commands(blocks(section("## Try it"), "console")[0]))
    assert (
        script.startswith("mkdir -p out")
        and "ddpify verify" in script
        and "torchrun" in script
    )
    proc = subprocess.run(
        ["bash", "-c", "set -e; " + script],
        cwd=clone,
        env=env_for(clone),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (
        "converted train.py" in proc.stderr
        and (clone / "out" / "regressor.pt").exists()
    )
    assert "ddp_in_place(model" in (clone / "out" / "train.py").read_text()


# --------------------------------------------------------------------------- pre-commit


def _user_repo(tmp_path: Path, config: str) -> Path:
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "train.py").write_text((ROOT / "examples" / "train.py").read_text())
    (repo / ".pre-commit-config.yaml").write_text(config)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a single-GPU script")
    return repo


@pytest.mark.runs
def test_precommit_local_snippet_works_as_written(tmp_path: Path):
    config = blocks(section("## pre-commit"), "yaml")[0]
    assert "<" not in config and "rev:" not in config
    repo = _user_repo(tmp_path, config)
    env = env_for()
    env["PRE_COMMIT_HOME"] = str(tmp_path / "pre-commit-home")

    def pre_commit():
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pre_commit",
                "run",
                "--all-files",
                "--color",
                "never",
            ],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    original = (repo / "train.py").read_text()
    first = pre_commit()
    assert first.returncode == 1, first.stdout + first.stderr
    assert "would convert train.py" in first.stdout and "+++ train.py" in first.stdout
    assert (repo / "train.py").read_text() == original
    subprocess.run(
        [str(Path(BIN) / "ddpify"), "-q", "train.py"], cwd=repo, env=env, check=True
    )
    second = pre_commit()
    assert second.returncode == 0, second.stdout + second.stderr


@pytest.mark.runs
def test_precommit_pinned_snippet_names_the_clones_commit(tmp_path: Path):
    clone = fresh_clone(tmp_path)
    printf = [
        c
        for b in blocks(section("## pre-commit"), "console")
        for c in commands(b)
        if c.startswith("printf")
    ]
    assert len(printf) == 1
    entry = subprocess.run(
        ["bash", "-c", printf[0]], cwd=clone, capture_output=True, text=True, check=True
    ).stdout
    config = "repos:\n" + entry
    assert f"rev: {git(clone, 'rev-parse', 'HEAD')}\n" in config
    assert f"repo: {tmp_path / 'origin'}\n" in config
    assert "files: ^train.*\\.py$" in config
    (tmp_path / "config.yaml").write_text(config)
    check = subprocess.run(
        [
            sys.executable,
            "-m",
            "pre_commit",
            "validate-config",
            str(tmp_path / "config.yaml"),
        ],
        capture_output=True,
        text=True,
        env=env_for(),
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    git(
        tmp_path / "origin",
        "cat-file",
        "-e",
        git(clone, "rev-parse", "HEAD") + "^{commit}",
    )
    assert "ddpify-check" in (clone / ".pre-commit-hooks.yaml").read_text()


# --------------------------------------------------------------------------- ddpify launch


def _console(text: str, command: str) -> list[str]:
    """The lines printed after `$ command` in `text`, up to the next `$ ` or the block's end."""
    for block in blocks(text, "console"):
        lines = block.splitlines()
        if f"$ {command}" in lines:
            out = []
            for line in lines[lines.index(f"$ {command}") + 1 :]:
                if line.startswith("$ "):
                    break
                out.append(line)
            return out
    raise AssertionError(f"no `$ {command}` in docs/launch.md")


def test_launch_samples_are_what_ddpify_prints(tmp_path: Path, monkeypatch):
    text = section("# Running on more than one machine: `ddpify launch`", LAUNCH)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(
        (ROOT / "fixtures" / "01_toplevel_regression" / "expected.py").read_text()
    )
    # after a conversion: the commands that run the script on this machine
    shown = _console(text, "ddpify train.py")
    assert shown[1:] == [
        "converted train.py",
        f"  run it with: {run_commands('train.py')[0]}",
        f"           or: {run_commands('train.py')[1]}",
        "1 file converted.",
    ]
    # several nodes by hand
    cmd = 'ddpify launch train.py --nodes 2 --gpus-per-node 8 -- --epochs 10 --out "runs/first try"'
    res = CliRunner().invoke(launch_command, shlex.split(cmd)[2:])
    assert res.exit_code == 0, res.output
    assert _console(text, cmd) == res.output.splitlines()
    # SLURM
    cmd = "ddpify launch train.py --nodes 2 --gpus-per-node 4 --slurm -o train.sbatch -- --epochs 10"
    res = CliRunner().invoke(launch_command, shlex.split(cmd)[2:])
    assert res.exit_code == 0, res.output
    assert _console(text, cmd) == res.output.splitlines()
    assert (
        _console(text, "cat train.sbatch")
        == (tmp_path / "train.sbatch").read_text().splitlines()
    )
