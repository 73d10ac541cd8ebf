"""The verify report: a terminal table, the causes and details of failures, and the --json document."""

from __future__ import annotations

import os
import shutil
import textwrap

from ddpify.verify.checks import FAIL, Check
from ddpify.verify.runner import RunResult

_COLOURS = {
    "PASS": "\x1b[32m",
    "FAIL": "\x1b[31m",
    "N/A": "\x1b[33m",
    "INFO": "\x1b[36m",
}


def run_summary(run: RunResult | None, rewrite=lambda text: text) -> dict | None:
    if run is None:
        return None
    ranks = []
    for r in range(run.world):
        rec = run.records.get(r)
        if rec is None:
            ranks.append({"rank": r, "status": "never started"})
            continue
        entry = {
            "rank": r,
            "pid": rec.get("pid"),
            "status": rec.get("status"),
            "steps": rec.get("steps"),
            "backward": rec.get("backward"),
            "mode": rec.get("mode"),
        }
        if rec.get("error"):
            entry["error"] = rec["error"]
            entry["traceback"] = rewrite(rec.get("traceback") or "")
        if rec.get("unused_params"):
            entry["unused_params"] = rec["unused_params"]
        if r in run.fatal:
            entry["fatal"] = rewrite(run.fatal[r][-2000:])
        if rec.get("node") or run.nnodes > 1:
            entry.update(node=rec.get("node"), local_rank=rec.get("local_rank"))
        ranks.append(entry)
    return {
        "role": run.role,
        "nproc": run.nproc,
        "nnodes": run.nnodes,
        "exits": run.exits,
        "max_gap_s": round(run.max_gap, 3),
        "returncode": run.returncode,
        "wall_s": round(run.wall_s, 3),
        "pids": run.pids,
        "ranks": ranks,
        "hang": {"ranks": run.hang["ranks"], "timeout": run.hang["timeout"]}
        if run.hang
        else None,
    }


def table(checks: list[Check], colour: bool = False) -> str:
    width = shutil.get_terminal_size((100, 24)).columns
    name_w = max(len("check"), *(len(c.name) for c in checks)) + 2
    lead = name_w + 8
    fig_w = max(30, width - lead - 1)
    lines = [f"{'check':<{name_w}}{'result':<8}figure"]
    for c in checks:
        status = f"{c.status:<8}"
        if colour:
            status = f"{_COLOURS.get(c.status, '')}{c.status:<6}\x1b[0m  "
        wrapped = textwrap.wrap(c.figure, fig_w) or [""]
        lines.append(f"{c.name:<{name_w}}{status}{wrapped[0]}")
        lines.extend(" " * lead + more for more in wrapped[1:])
    return "\n".join(lines)


def failures(checks: list[Check]) -> str:
    out = []
    for c in checks:
        if c.status != FAIL:
            continue
        out.append(f"\n{c.name} FAILED: {c.cause or c.figure}")
        out.extend("  " + d for d in c.details)
    return "\n".join(out)


def crash_report(run: RunResult, rewrite=lambda text: text) -> str:
    """Every rank's own traceback (or its output's tail) when the script could not run; rewrite
    maps the locations of verify's converted copy to the user's file."""
    out = []
    for r in range(run.world):
        rec = run.records.get(r)
        label = "" if run.world == 1 else f"rank {r}: "
        if rec and rec.get("traceback"):
            out.append(f"{label}{rec.get('error')}")
            out.extend(
                "  " + line for line in rewrite(rec["traceback"]).rstrip().splitlines()
            )
        elif rec and rec.get("status") in ("stopped", "finished"):
            continue
        elif rec and any(
            (o or {}).get("status") in ("crashed", "exited")
            for o in run.records.values()
        ):
            out.append(f"{label}stopped by torchrun after another rank failed")
        else:
            tail = (run.outputs.get(r) or "").rstrip().splitlines()[-15:]
            out.append(
                f"{label}no traceback recorded; last output:"
                if tail
                else f"{label}no output"
            )
            out.extend("  " + line for line in tail)
    if not run.records and run.launcher_output:
        out.append("launcher output:")
        out.extend(
            "  " + line for line in run.launcher_output.rstrip().splitlines()[-15:]
        )
    return "\n".join(out)


def short_path(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


SHOW_LINES = 200


def script_output(run: RunResult) -> str:
    """The script's own stdout and stderr, as each process wrote it (--show-output)."""
    out = []
    for r in range(run.world):
        text = (
            (run.run_dir / f"rank{r}.out").read_text(errors="replace")
            if (run.run_dir / f"rank{r}.out").exists()
            else ""
        )
        lines = text.rstrip().splitlines()
        who = (
            "baseline (one process)"
            if run.role == "baseline"
            else f"candidate rank {r}"
        )
        cut = (
            f", last {SHOW_LINES} of {len(lines)} lines"
            if len(lines) > SHOW_LINES
            else ""
        )
        out.append(f"\n--- output of the {who}{cut} ---")
        out.extend(lines[-SHOW_LINES:] or ["(nothing)"])
    return "\n".join(out)
