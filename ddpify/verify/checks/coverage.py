"""What the run covered (`reached`), and the verdict line that says it: a run stopped after K
steps (or E epochs) never reaches the script's end (the end of the epoch, the evaluation, the
final save, the teardown), so its PASS speaks for those K steps only."""

from __future__ import annotations

from ddpify.verify.checks.common import (
    FAIL,
    INFO,
    NA,
    Check,
    Context,
    plural,
    training_epochs,
)
from ddpify.verify.checks.files import reached_lines

TO_END = "--to-end runs the whole script"


def paths_ran(ctx: Context) -> list[str]:
    """What the run went through, from rank 0's record: training epochs (and whether the data cap
    cut them), evaluation passes, the script's own writes by line, its log lines."""
    rec = ctx.candidate.records.get(0) or {}
    out = []
    train = [e for e in training_epochs(rec) if e.get("complete")]
    if train:
        sizes = sorted({e.get("drawn") or 0 for e in train})
        each = "/".join(map(str, sizes))
        real = max(e.get("num_batches") or 0 for e in train)
        cap = (
            f", capped from {real}"
            if any(e.get("capped") for e in train) and real
            else ""
        )
        out.append(
            f"{plural(len(train), 'whole training epoch')} ({each} batches each{cap})"
        )
    evals = [
        e
        for e in rec.get("epochs", [])
        if e.get("complete") and e.get("drawn") and e not in training_epochs(rec)
    ]
    if evals:
        out.append(plural(len(evals), "evaluation pass", "evaluation passes"))
    by_line: dict[str, int] = {}
    for w in rec.get("writes", []):
        where = ctx.where(w.get("where"))
        by_line[f"{w['kind']} at {where}"] = (
            by_line.get(f"{w['kind']} at {where}", 0) + 1
        )
    for what, count in list(by_line.items())[:4]:
        out.append(f"{what} {'once' if count == 1 else f'{count} times'}")
    logs = sum(p.get("n", 0) for p in rec.get("printed", []))
    if logs:
        out.append(plural(logs, "line of output", "lines of output"))
    return out


def check_reached(ctx: Context) -> Check:
    """What the run covered: the script's end, whole epochs or K steps, and the writes it never got to."""
    rec = ctx.candidate.records.get(0) or {}
    status = rec.get("status")
    src = ctx.sources
    done = reached_lines(ctx)
    never = [s for s in src.write_sites(ctx.exec_path) if s[0] not in done]
    listed = ", ".join(
        f"{what} at {src.where(ctx.exec_path, line)}" for line, what in never[:4]
    )
    listed += f" and {len(never) - 4} more" if len(never) > 4 else ""
    train = training_epochs(rec)
    complete = [e for e in train if e.get("complete")]
    by = rec.get("stopped_by")
    if status == "finished":
        figure = "the script ran to its end"
    elif status == "stopped" and by == "time":
        figure = (
            f"stopped by the time cap ({getattr(ctx.length, 'max_time', 0) or 0:g} s) at step {rec.get('steps')}, after "
            f"{plural(len(complete), 'whole epoch')}: the script's end was not reached; {TO_END}"
        )
    elif status == "stopped" and ctx.epochs and (by == "epochs" or not ctx.auto):
        them = "them" if ctx.epochs > 1 else "it"
        flag = "" if ctx.auto else " (--epochs)"
        figure = f"{ctx.epochs} whole epoch{'s' if ctx.epochs > 1 else ''} and the work after {them}{flag}; the script's end was not reached: {TO_END}"
    elif status == "stopped" and train and not train[-1].get("complete"):
        last = train[-1]
        of = f" of {last['num_batches']}" if last.get("num_batches") else ""
        figure = (
            f"stopped at step {rec.get('steps')} in epoch {len(train)} (batch {last.get('drawn')}{of}): the end of that "
            f"epoch (checkpoints, logs, evaluation) was not reached; --epochs 1 runs whole epochs, {TO_END}"
        )
    elif status == "stopped":
        figure = f"stopped at step {rec.get('steps')}: the script's end was not reached; {TO_END}"
    else:
        return Check("reached", NA, "rank 0 did not finish (see ranks)")
    ran = paths_ran(ctx)
    if ran:
        figure += "; ran: " + ", ".join(ran)
    if never:
        figure += f"; never reached: {listed}"
    data = {"never_reached": never, "script_end": status == "finished", "ran": ran}
    return Check("reached", INFO, figure, data=data)


def verdict(ctx: Context, checks: list[Check]) -> str:
    """One line: FAIL and the checks that failed, or PASS, what the run covered and which paths
    of the script ran."""
    failed = [c.name for c in checks if c.status == FAIL]
    if failed:
        return "FAIL: " + ", ".join(failed)
    rec = ctx.candidate.records.get(0) or {}
    steps = rec.get("steps", 0)
    ran = paths_ran(ctx)
    tail = f"; ran: {', '.join(ran)}" if ran else ""
    if any(c.name == "gpu-paths" for c in checks):
        tail += "; on the CPU path: a GPU run also executes what this run skipped (see gpu-paths)"
    if rec.get("status") == "finished":
        return f"PASS: the script ran to its end on every rank ({plural(steps, 'step')}){tail}"
    complete = [e for e in training_epochs(rec) if e.get("complete")]
    if ctx.auto and rec.get("stopped_by") == "epochs":
        return (
            f"PASS for {plural(len(complete), 'pass', 'passes')} over each rank's shard and the work at the end of "
            f"each: the script's end was not reached, --to-end runs it{tail}"
        )
    if ctx.epochs and not ctx.auto:
        covered = f"{plural(ctx.epochs, 'epoch')} (step {steps})"
        run_more = (
            "run with --to-end to cover the evaluation, the final save and the teardown"
        )
    else:
        covered = plural(steps, "step")
        if rec.get("stopped_by") == "time":
            covered += f" (the time cap, {getattr(ctx.length, 'max_time', 0) or 0:g} s)"
        run_more = "run with --epochs E or --to-end to cover the end of an epoch, the evaluation, the final save and the teardown"
    return f"PASS for {covered}: the script's end was not reached; {run_more}{tail}"
