"""What every check shares: the result (Check), what it looks at (Context), and small helpers."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ddpify.verify.checks.source import Sources
from ddpify.verify.runner import RunResult

PASS, FAIL, NA, INFO = "PASS", "FAIL", "N/A", "INFO"
STOPPED = "the run was stopped before the ranks reported (see no-hang)"


@dataclass
class Check:
    name: str
    status: str
    figure: str
    cause: str | None = None
    details: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "status": self.status,
            "figure": self.figure,
            "cause": self.cause,
            "details": self.details,
            "data": self.data,
        }


@dataclass
class Context:
    candidate: RunResult
    baseline: RunResult | None
    nproc: int  # the world size: processes per node x nodes
    steps: int
    exec_path: str  # the file the ranks ran (the converted copy, or the user's file)
    timeout: float = 0.0
    min_scaling: float | None = None
    nnodes: int = 1
    epochs: int | None = None
    # Every file the ranks ran, parsed once per run, and where its lines are in the user's files.
    sources: Sources = field(default_factory=Sources)
    shared_gpus: int = (
        0  # ranks shared this many GPUs (--share-gpus); 0: a GPU (or the CPU) each
    )
    to_end: bool = False  # --to-end: the script ran without a step limit
    length: object = None  # plan.Length: how long the runs went (None: K steps)
    single: RunResult | None = (
        None  # the converted script as plain python, a world of one
    )
    others: list = field(
        default_factory=list
    )  # the project's other entry scripts, run plainly
    on_cpu: bool = (
        False  # the ranks saw no GPU: a GPU run executes what this one skipped
    )
    converted: bool = False  # the ranks ran verify's conversion of the user's script
    args: list = field(default_factory=list)  # the script's own arguments

    @property
    def auto(self) -> bool:
        """The default run: two passes over each rank's shard, capped."""
        return bool(getattr(self.length, "auto", False))

    def where(self, where: str | None) -> str:
        """A "path:line" the probe recorded, as the user's file and line."""
        if not where:
            return "?"
        path, line = split_where(where)
        return self.sources.where(path, line)


_FILE_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def user_line(ctx: Context, text: str) -> str | None:
    """The innermost location of the user's code in a traceback or stack dump, as the user's
    file and line."""
    found = None
    src = ctx.sources
    roots = [
        os.path.realpath(r) for r in (src.user_root, *[c for c, _ in src.roots]) if r
    ]
    for m in _FILE_LINE.finditer(text or ""):
        path = os.path.realpath(m["file"])
        if "site-packages" in path or "/ddpify/verify/" in path:
            continue
        if src.is_copy(path) or any(path.startswith(r + os.sep) for r in roots):
            found = src.where(path, int(m["line"]))
    return found


def split_where(where: str) -> tuple[str, int]:
    path, _, line = where.rpartition(":")
    try:
        return path, int(line)
    except ValueError:
        return path, 0


def n(x: int) -> str:
    return f"{x:,}"


def plural(count: int, word: str, many: str | None = None) -> str:
    return f"{count} {word if count == 1 else (many or word + 's')}"


def short(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def steps_of(run: RunResult, r: int) -> int:
    rec = run.records.get(r)
    if rec and rec.get("status") != "running":
        return int(rec.get("steps", 0))
    return run.heartbeats.get(r, (0, 0, 0))[0]


def finished(run: RunResult) -> bool:
    """Every rank ended on its own (stopped at K or script end) with the same step count."""
    recs = [run.records.get(r) for r in range(run.world)]
    if not all(rec and rec.get("status") in ("stopped", "finished") for rec in recs):
        return False
    return len({rec["steps"] for rec in recs}) == 1


def error_line(rec: dict) -> str:
    err = rec.get("error") or ""
    return err.splitlines()[0][:200] if err else "no error message"


def tail(text: str, lines: int = 12) -> list[str]:
    return text.rstrip().splitlines()[-lines:]


def training_epochs(rec: dict) -> list[dict]:
    """The epochs a backward pass happened in (between their batches), whose batches were not
    all drawn under no_grad (an evaluation loader drawn from in the training loop)."""
    return [
        e
        for e in rec.get("epochs", [])
        if e.get("bw_first") is not None
        and (e.get("bw_last") or 0) > e["bw_first"]
        and e.get("grad_on", 1) > 0
    ]
