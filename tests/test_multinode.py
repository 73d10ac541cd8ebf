"""Two nodes x two processes on one host (two torchrun agents, c10d rendezvous, gloo on CPU).

Each node's local rank 0 is not the global rank 0 on one of them: only global rank 0 may write
or print; DistributedSampler must shard by global rank and world size.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

CASES = Path(__file__).resolve().parent / "multinode_cases"
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
sys.path.insert(0, str(CASES))

import harness  # noqa: E402

pytestmark = (
    pytest.mark.runs
)  # trains or runs tools in subprocesses: not the converter tier

# A top-level script and a checkpointing main() with arguments;
# DDPIFY_MULTINODE_ALL=1 runs every fixture (about 15 s each on 2 cores).
SAMPLE = ("01_toplevel_regression", "13_checkpoint_resume")


def run_two_nodes(tmp_path: Path, script: Path, args: list[str]):
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    cmds = harness.two_node_torchrun(script, args, harness.free_port())
    runs = harness.run_agents(
        cmds, [tmp_path / "node0", tmp_path / "node1"], harness.worker_env(evidence)
    )
    return runs, harness.load_evidence(evidence)


def test_handwritten_ddp_two_nodes(tmp_path: Path):
    runs, records = run_two_nodes(tmp_path, CASES / "train_ddp.py", ["--epochs", "2"])
    detail = harness.describe(runs, records)
    assert [r.returncode for r in runs] == [0, 0], detail
    assert harness.check_evidence(records, world_size=4, nodes=2) == [], detail
    # The checkpoint exists on exactly one node's disk: the node that holds global rank 0.
    ckpts = sorted(p.parent.name for p in tmp_path.glob("node*/model.pt"))
    rank0_node = next(r["node"] for r in records if r["env"]["RANK"] == "0")
    assert ckpts == [f"node{rank0_node}"]
    rank0 = next(r for r in records if r["env"]["RANK"] == "0")
    assert "over 100 samples" in rank0["stdout"], (
        detail
    )  # the all-reduce saw every sample once


def test_checks_catch_multinode_bugs(tmp_path: Path):
    """The checks above can fail: guards and sharding on the local rank are both reported."""
    bugs = ["--bug", "local-writer", "--bug", "local-sampler"]
    runs, records = run_two_nodes(
        tmp_path, CASES / "train_ddp.py", ["--epochs", "1", *bugs]
    )
    assert [r.returncode for r in runs] == [0, 0], harness.describe(runs, records)
    problems = harness.check_evidence(records, world_size=4, nodes=2)
    assert any("files written by global ranks" in p for p in problems), problems
    assert any("loss printed by global ranks" in p for p in problems), problems
    assert any("DistributedSampler shards as rank" in p for p in problems), problems
    assert any("shards overlap" in p for p in problems), problems
    # Both nodes wrote a checkpoint to their own disk: one writer per node, the classic bug.
    assert len(list(tmp_path.glob("node*/model.pt"))) == 2


def _fixture_dirs() -> list[Path]:
    dirs = sorted(p.parent for p in FIXTURES.glob("*/expected.py"))
    if os.environ.get("DDPIFY_MULTINODE_ALL") != "1":
        dirs = [d for d in dirs if d.name in SAMPLE]
    runnable = []
    for d in dirs:
        head = (d / "input.py").read_text(encoding="utf-8").splitlines()[:1]
        if head != ["# requires: cuda"]:
            runnable.append(d)
    return runnable


def _converted(fixture: Path) -> str:
    """What ddpify makes of input.py; expected.py while the converter is not written yet."""
    from ddpify import Options, convert_source

    options = Options()
    opts_file = fixture / "options.json"
    if opts_file.exists():
        options = Options(**json.loads(opts_file.read_text(encoding="utf-8")))
    try:
        return convert_source(
            (fixture / "input.py").read_text(encoding="utf-8"), options, path="train.py"
        ).source
    except NotImplementedError:
        return (fixture / "expected.py").read_text(encoding="utf-8")


FIXTURE_DIRS = _fixture_dirs()


@pytest.mark.skipif(not FIXTURE_DIRS, reason="no fixture has an expected.py yet")
@pytest.mark.parametrize("fixture", FIXTURE_DIRS, ids=lambda p: p.name)
def test_converted_fixture_two_nodes(fixture: Path, tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(_converted(fixture), encoding="utf-8")
    args_file = fixture / "args.txt"
    args = (
        shlex.split(args_file.read_text(encoding="utf-8")) if args_file.exists() else []
    )
    runs, records = run_two_nodes(tmp_path, script, args)
    detail = harness.describe(runs, records)
    assert [r.returncode for r in runs] == [0, 0], detail
    assert harness.check_evidence(records, world_size=4, nodes=2) == [], detail
