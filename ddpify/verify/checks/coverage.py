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
    if status == "finished":
        figure = "the script ran to its end"
    elif status == "stopped" and ctx.epochs:
        them = "them" if ctx.epochs > 1 else "it"
        figure = f"{ctx.epochs} whole epoch{'s' if ctx.epochs > 1 else ''} and the work after {them} (--epochs); the script's end was not reached: {TO_END}"
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
    if never:
        figure += f"; never reached: {listed}"
    data = {"never_reached": never, "script_end": status == "finished"}
    return Check("reached", INFO, figure, data=data)


def verdict(ctx: Context, checks: list[Check]) -> str:
    """One line: FAIL and the checks that failed, or PASS and what the run covered."""
    failed = [c.name for c in checks if c.status == FAIL]
    if failed:
        return "FAIL: " + ", ".join(failed)
    rec = ctx.candidate.records.get(0) or {}
    steps = rec.get("steps", 0)
    if rec.get("status") == "finished":
        return (
            f"PASS: the script ran to its end on every rank ({plural(steps, 'step')})"
        )
    if ctx.epochs:
        covered = f"{plural(ctx.epochs, 'epoch')} (step {steps})"
        run_more = (
            "run with --to-end to cover the evaluation, the final save and the teardown"
        )
    else:
        covered = plural(steps, "step")
        run_more = "run with --epochs E or --to-end to cover the end of an epoch, the evaluation, the final save and the teardown"
    return f"PASS for {covered}: the script's end was not reached; {run_more}"
