"""The `no-hang` check: where each stalled rank waits (from its faulthandler dump), and the
rank-local branch that sent the ranks to different collectives."""

from __future__ import annotations

import os
import re

from ddpify.verify.checks.common import (
    FAIL,
    NA,
    PASS,
    Check,
    Context,
    finished,
    steps_of,
)
from ddpify.verify.runner import RunResult

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_VERIFY_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_stack(text: str, exec_path: str) -> list[tuple[str, int, str]]:
    """The frames (innermost first) of the thread that runs the user's script, from a faulthandler dump."""
    threads: list[list[tuple[str, int, str]]] = []
    for line in text.splitlines():
        if line.startswith(("Thread ", "Current thread ")):
            threads.append([])
            continue
        m = _FRAME.match(line)
        if m and threads:
            threads[-1].append((m["file"], int(m["line"]), m["func"]))
    for frames in threads:
        if any(os.path.abspath(f) == exec_path for f, _, _ in frames):
            return frames
    return threads[0] if threads else []


def waiting_in(
    frames: list[tuple[str, int, str]], exec_path: str
) -> tuple[str, tuple[str, int, str] | None]:
    """(the collective or operation the thread waits in, the innermost frame of the script)."""
    user = next((f for f in frames if os.path.abspath(f[0]) == exec_path), None)
    what = None
    for file, _, func in frames:
        if file.endswith("distributed_c10d.py") and not func.startswith("_"):
            what = func
    if what is None:
        if any(
            f.endswith(("autograd/__init__.py", "autograd/graph.py"))
            for f, _, _ in frames
        ):
            what = "backward (DDP gradient all-reduce)"
        elif any(f.endswith("parallel/distributed.py") for f, _, _ in frames):
            what = "the DDP forward (buffer broadcast)"
        elif frames:
            what = frames[0][2]
        else:
            what = "?"
    return what, user


def _is_verify(path: str) -> bool:
    return os.path.abspath(path).startswith(_VERIFY_DIR + os.sep)


def _loop_exit_causes(
    ctx: Context, run: RunResult, exec_path: str, waits: dict
) -> list[str]:
    """A rank that left a loop through a `break` the others did not take: an early stop decided per rank."""
    hang, src = run.hang or {}, ctx.sources
    frames = {
        r: [
            f
            for f in parse_stack(hang["stacks"].get(r, ""), exec_path)
            if os.path.abspath(f[0]) == exec_path
        ]
        for r in waits
    }
    for a in sorted(frames):
        for b in sorted(frames):
            if a == b:
                continue
            for fa in frames[a]:
                for fb in frames[b]:
                    if fa[1] == fb[1]:
                        continue
                    found = src.loop_left_by_break(exec_path, fa[1], fb[1])
                    if not found:
                        continue
                    loop_line, head, brk, guard = found
                    under = (
                        f" under `if {guard[1]}:` ({src.line(exec_path, guard[0])})"
                        if guard
                        else ""
                    )
                    return [
                        f"rank {a} left the loop `{head}` ({src.line(exec_path, loop_line)}) through the `break` at "
                        f"{src.line(exec_path, brk)}{under} and waits in {waits[a][0]} at {src.line(exec_path, fa[1])}, "
                        f"while rank {b} is still inside the loop, in {waits[b][0]} at {src.line(exec_path, fb[1])}: "
                        "the ranks decided differently. Decide on every rank alike (all_reduce the metric first, "
                        "or broadcast rank 0's decision)"
                    ]
    return []


def _end_of(run: RunResult, r: int) -> str:
    rec = run.records.get(r) or {}
    status = rec.get("status")
    if status == "finished":
        return "then ran to the end of the script"
    if status == "stopped":
        return "then stopped at the step limit"
    if status in ("crashed", "exited"):
        err = (
            (rec.get("error") or "").splitlines()[0][:160]
            if rec.get("error")
            else status
        )
        return f"then failed: {err}"
    if run.hang and r in run.hang.get("ranks", []):
        return "and waits there"
    return "and is still there"


def collective_cause(ctx: Context, run: RunResult) -> str | None:
    """Which rank ran ahead, from the collectives each rank entered (the probe notes each one's
    count and the script's line): the rank that entered one more than another waits in it for a
    rank that will never come, or the ranks entered different collectives at the same count."""
    colls = run.collectives
    if len(colls) < 2:
        return None
    src = ctx.sources
    counts = {r: c[0] for r, c in colls.items()}

    def at(r: int) -> str:
        n, what, where = colls[r]
        return f"{what} at {ctx.where(where)}" + (
            f" `{src.line_text(*_split(where))}`" if where != "?" else ""
        )

    ahead = max(counts, key=lambda r: (counts[r], -r))
    behind = min(counts, key=lambda r: (counts[r], r))
    if counts[ahead] != counts[behind]:
        return (
            f"rank {ahead} ran ahead: its collective #{counts[ahead]}, {at(ahead)}, was never joined by rank {behind}, "
            f"whose last collective was #{counts[behind]}, {at(behind)}, {_end_of(run, behind)}: the ranks took different "
            "paths through the script (a branch on the rank, a data-dependent exit, or more batches on one rank)"
        )
    kinds = {colls[r][1:] for r in colls}
    if len(kinds) > 1:
        a, b = sorted(colls)[:2]
        return (
            f"at their collective #{counts[a]} the ranks called different ones: rank {a} {at(a)}, rank {b} {at(b)}: "
            "each waits for the other in a collective it never calls"
        )
    return None


def _split(where: str) -> tuple[str, int]:
    path, _, line = where.rpartition(":")
    try:
        return path, int(line)
    except ValueError:
        return path, 0


def check_hang(ctx: Context) -> Check:
    src = ctx.sources
    for run in (ctx.baseline, ctx.candidate):
        if run is None or not run.hang:
            continue
        hang, exec_path = run.hang, os.path.abspath(ctx.exec_path)
        parts, details, causes = [], [], []
        waits = {}
        for r in range(run.world):
            waits[r] = waiting_in(
                parse_stack(hang["stacks"].get(r, ""), exec_path), exec_path
            )
        for r in range(run.world):
            frames = parse_stack(hang["stacks"].get(r, ""), exec_path)
            what, user = waits[r]
            at = src.where(user[0], user[1]) if user else "?"
            code = src.line_text(user[0], user[1]) if user else ""
            parts.append(f"rank {r} in {what} at {at}")
            details.append(
                f"rank {r} at step {steps_of(run, r)}: waiting in {what} at {at}"
                + (f"  `{code}`" if code else "")
            )
            details.extend(
                "    "
                + (
                    src.where(f, ln)
                    if src.is_copy(f)
                    else f"{os.path.basename(f)}:{ln}"
                )
                + f" in {fn}"
                for f, ln, fn in frames[:12]
                if not _is_verify(f)
            )
            if user:
                guard = src.enclosing_if(user[0], user[1], rank_only=True)
                inside_too = guard and all(
                    o == r
                    or (
                        waits.get(o, (None, None))[1]
                        and src.enclosing_if(*waits[o][1][:2], rank_only=True) == guard
                    )
                    for o in range(run.world)
                )
                if guard and not inside_too:
                    causes.append(
                        f"rank {r} waits in {what} at {src.line(user[0], user[1])}, inside `if {guard[1]}:` "
                        f"({src.line(user[0], guard[0])}): the other ranks never join this collective"
                    )
        if not causes:
            causes.extend(_loop_exit_causes(ctx, run, exec_path, waits))
        if not causes:
            told = collective_cause(ctx, run)
            if told:
                causes.append(told)
        kinds = {w[0] for w in waits.values()}
        cause = (
            causes[0]
            if causes
            else (
                "the ranks wait in different collectives: " + ", ".join(sorted(kinds))
                if len(kinds) > 1
                else f"no progress for {hang['timeout']:g} s"
            )
        )
        role = "" if run.role == "candidate" else " (baseline, one process)"
        stalled = ("ranks " if len(hang["ranks"]) > 1 else "rank ") + ", ".join(
            map(str, hang["ranks"])
        )
        figure = (
            f"{stalled} made no progress for {hang['timeout']:g} s{role}: "
            + "; ".join(parts)
        )
        return Check(
            "no-hang", FAIL, figure, cause, details, data={"stalled": hang["ranks"]}
        )
    return Check("no-hang", PASS, f"no rank stalled for {ctx.timeout:g} s")


# ------------------------------------------------------------------------ collectives


def check_collectives(ctx: Context) -> Check:
    """Every rank entered the same collectives in the same order (the whole group's:
    torch.distributed's, a backward that all-reduces, a DDP forward that broadcasts buffers).
    NCCL pairs the ranks' collectives in turn: a broadcast on one rank where another is in a
    barrier hangs there or mixes up their data, where gloo sometimes lets the ranks through."""
    run = ctx.candidate
    if ctx.nproc < 2:
        return Check("collectives", NA, "one process")
    if not finished(run):
        return Check("collectives", NA, "not every rank finished its steps")
    recs = {r: run.records.get(r) or {} for r in range(ctx.nproc)}
    seqs = {r: rec.get("collective_seq") or [] for r, rec in recs.items()}
    full = all(len(s) < 4096 for s in seqs.values())
    n = min(len(s) for s in seqs.values())
    at = next(
        (i for i in range(n) if len({seqs[r][i][0] for r in seqs}) > 1),
        None if not full or len({len(s) for s in seqs.values()}) == 1 else n,
    )
    if at is None:
        return Check(
            "collectives",
            PASS,
            f"every rank entered the same {len(seqs[0])} collectives, in the same order",
        )

    def one(r: int) -> str:
        if at >= len(seqs[r]):
            return f"rank {r} none (it entered {len(seqs[r])})"
        kind, index = seqs[r][at]
        site = (recs[r].get("collective_sites") or [])[index]
        what, _, where = site[0].partition("\t")
        guard = ""
        for frame in site[1:] or [where]:
            file, _, line = frame.rpartition(":")
            found = (
                ctx.sources.enclosing_if(file, int(line), rank_only=True)
                if line.isdigit()
                else None
            )
            if found is not None:
                guard = (
                    f", inside `if {found[1]}:` ({ctx.sources.where(file, found[0])})"
                )
                break
        return f"rank {r} a {kind} ({what} at {ctx.where(where)}{guard})"

    listed = "; ".join(one(r) for r in range(ctx.nproc))
    figure = f"collective #{at + 1}: {listed}"
    cause = (
        f"the ranks enter different collectives at their collective #{at + 1}: {listed}. NCCL pairs the ranks' "
        "collectives in turn, so this run hangs there (or mixes up their data) on GPUs, where gloo may let it "
        "through; every rank must enter the same collectives in the same order (evaluate the plain module, "
        "`.module`, on one rank)"
    )
    return Check("collectives", FAIL, figure, cause)
