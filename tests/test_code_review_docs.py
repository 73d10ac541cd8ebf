"""docs/code-review.md's recipes, run as written on a temporary git repository: the `ddpify` step of
the GitHub Actions workflow (with a stand-in `reviewdog` that records its arguments and input), its
annotation variant, and the GitLab job's script. Nothing is fetched: the install lines are the only
ones left out."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_rdjson import VALIDATOR as RDJSON, apply
from test_review_formats import SARIF, check_gitlab, parse_command

pytestmark = pytest.mark.runs  # runs git, bash and the CLI in subprocesses

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "code-review.md").read_text()
BIN = str(Path(sys.executable).parent)
GIT_ID = [
    "-c",
    "user.name=ddpify test",
    "-c",
    "user.email=test@example.invalid",
    "-c",
    "commit.gpgsign=false",
]
SCRIPT = ROOT / "fixtures" / "02_mnist_classic"
BUG = ROOT / "fixtures" / "lint" / "bugs" / "13_barrier_in_rank0_branch.py"


def blocks(lang: str) -> list[str]:
    return re.findall(r"^```%s\n(.*?)^```" % lang, DOC, re.S | re.M)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *GIT_ID, *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def pull_request(tmp_path):
    """A repository whose base commit has a README and a helper, and whose HEAD adds a single-GPU
    script (its name has a space), a distributed script with a DDP bug, and edits the helper."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "README.md").write_text("# project\n")
    (repo / "utils.py").write_text("def helper():\n    return 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "feature")
    (repo / "scripts").mkdir()
    shutil.copy(SCRIPT / "input.py", repo / "scripts" / "train mnist.py")
    shutil.copy(BUG, repo / "buggy.py")
    (repo / "utils.py").write_text("def helper():\n    return 2\n")
    (repo / "notes.txt").write_text("not Python\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "add training scripts")
    return repo, base


def stand_in_reviewdog(folder: Path) -> Path:
    """A `reviewdog` that writes its arguments and its standard input next to itself."""
    folder.mkdir()
    exe = folder / "reviewdog"
    exe.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > "{folder}/args"\ncat > "{folder}/input"\n'
    )
    exe.chmod(0o755)
    return folder


def env_with(*dirs: Path, **extra: str) -> dict:
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "FORCE_COLOR")
    }
    env["PATH"] = os.pathsep.join([*map(str, dirs), BIN, env.get("PATH", "")])
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def workflow() -> dict:
    (text,) = [b for b in blocks("yaml") if b.startswith("name: ddpify")]
    return yaml.safe_load(text)


def github_bash(script: str, repo: Path, env: dict) -> subprocess.CompletedProcess:
    """As GitHub Actions runs a `run:` script on Linux: bash --noprofile --norc -eo pipefail."""
    path = repo.parent / "step.sh"
    path.write_text(script)
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(path)],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_workflow_step(pull_request, tmp_path):
    repo, base = pull_request
    flow = workflow()
    steps = flow["jobs"]["ddpify"]["steps"]
    (step,) = [s for s in steps if s.get("id") == "ddpify"]
    (upload,) = [
        s
        for s in steps
        if s.get("uses", "").startswith("github/codeql-action/upload-sarif")
    ]
    assert upload["if"] == "always()"
    assert any(s.get("uses", "").startswith("reviewdog/action-setup") for s in steps)
    assert (
        flow["permissions"]["security-events"] == "write"
        and flow["permissions"]["pull-requests"] == "write"
    )
    env = {k: ("dummy-token" if "token" in v else v) for k, v in step["env"].items()}
    assert env["BASE"] == "${{ github.event.pull_request.base.sha }}"
    env["BASE"] = base
    fake = stand_in_reviewdog(tmp_path / "fake-bin")
    res = github_bash(step["run"], repo, env_with(fake, **env))
    assert res.returncode == 1, (
        res.stdout + res.stderr
    )  # the script would change, and lint finds the bug

    # code scanning: two valid SARIF files in the uploaded folder, naming the changed files
    sarifs = sorted((repo / upload["with"]["sarif_file"]).glob("*.sarif"))
    assert [p.name for p in sarifs] == ["convert.sarif", "lint.sarif"]
    uris = set()
    for p in sarifs:
        doc = json.loads(p.read_text())
        SARIF.validate(doc)
        uris |= {
            r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
            for r in doc["runs"][0]["results"]
        }
    assert "scripts/train%20mnist.py" in uris and "buggy.py" in uris
    lint = json.loads((repo / "ddpify-sarif" / "lint.sarif").read_text())
    assert any(
        r["ruleId"] == "DDP210" and r["level"] == "error"
        for r in lint["runs"][0]["results"]
    )

    # reviewdog: its flags, and an input whose suggestions rebuild what ddpify writes
    args = (fake / "args").read_text().split()
    assert args == [
        "-f=rdjson",
        "-name=ddpify",
        "-reporter=github-pr-review",
        "-filter-mode=diff_context",
    ]
    doc = json.loads((fake / "input").read_text())
    RDJSON.validate(doc)
    before = (repo / "scripts" / "train mnist.py").read_bytes()
    assert before == (SCRIPT / "input.py").read_bytes()  # --check wrote nothing
    assert (
        apply(before, doc["diagnostics"], "scripts/train mnist.py")
        == (SCRIPT / "expected.py").read_bytes()
    )
    assert {d["location"]["path"] for d in doc["diagnostics"]} == {
        "scripts/train mnist.py"
    }


def test_workflow_step_with_nothing_to_check(pull_request, tmp_path):
    repo, _ = pull_request
    step = next(
        s for s in workflow()["jobs"]["ddpify"]["steps"] if s.get("id") == "ddpify"
    )
    fake = stand_in_reviewdog(tmp_path / "fake-bin")
    res = github_bash(
        step["run"],
        repo,
        env_with(
            fake, BASE=git(repo, "rev-parse", "HEAD"), REVIEWDOG_GITHUB_API_TOKEN="x"
        ),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    for p in (repo / "ddpify-sarif").glob("*.sarif"):
        doc = json.loads(p.read_text())
        SARIF.validate(doc)
        assert doc["runs"][0]["results"] == []
    assert json.loads((fake / "input").read_text())["diagnostics"] == []


def test_annotation_variant(pull_request, tmp_path):
    repo, base = pull_request
    (variant,) = [b for b in blocks("bash") if "--output-format github" in b]
    step = next(
        s for s in workflow()["jobs"]["ddpify"]["steps"] if s.get("id") == "ddpify"
    )
    lines = step["run"].splitlines()
    head = [ln for ln in lines if ln.startswith(("mapfile", "status="))]
    script = "\n".join([*head, variant.strip(), 'exit "$status"']) + "\n"
    res = github_bash(script, repo, env_with(BASE=base))
    assert res.returncode == 1, res.stderr
    commands = [parse_command(line) for line in res.stdout.splitlines()]
    files = {props["file"] for _, props, _ in commands}
    assert files == {"scripts/train mnist.py", "buggy.py"}
    assert ("error", "DDP210") in {
        (name, props["title"]) for name, props, _ in commands
    }


def test_gitlab_job(pull_request, tmp_path):
    repo, _ = pull_request
    (text,) = [b for b in blocks("yaml") if b.startswith("ddpify:\n")]
    job = yaml.safe_load(text)["ddpify"]
    assert job["artifacts"]["reports"]["codequality"] == "gl-code-quality-report.json"
    assert job["variables"]["GIT_DEPTH"] == 0
    # `origin` is a local bare copy holding the target branch: git fetch works without a network
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(origin)], check=True)
    git(repo, "remote", "add", "origin", str(origin))
    script = [line for line in job["script"] if "pip install" not in line]
    assert len(script) == len(job["script"]) - 1
    res = subprocess.run(
        ["bash", "-e", "-c", "\n".join(script)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
        env=env_with(CI_MERGE_REQUEST_TARGET_BRANCH_NAME="main"),
    )
    assert res.returncode == 1, res.stdout + res.stderr
    report = json.loads((repo / "gl-code-quality-report.json").read_text())
    check_gitlab(report)
    paths = {i["location"]["path"] for i in report}
    assert paths == {"scripts/train mnist.py", "buggy.py"}
    assert any(
        i["check_name"] == "DDP210" and i["severity"] == "critical" for i in report
    )
