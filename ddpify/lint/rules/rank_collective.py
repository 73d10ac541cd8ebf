"""A collective on some ranks only: a barrier, all_reduce, a forward of the DDP model, a sharded
state-dict gather (or a function of the script that runs one) inside a branch on the rank. The
ranks outside the branch never join it: the job hangs until the NCCL timeout. Collectives that
the other ranks make in the complementary branch (`if rank != 0: barrier()` ... `if rank == 0:
barrier()`) are matched, not reported."""

from __future__ import annotations

from ddpify.analysis.tree import code, dotted
from ddpify.lint.values import UNK
from ddpify.rules import declare

declare(
    "DDP210",
    "collective-in-rank-branch",
    "a collective (barrier, all_reduce, a DDP forward, a state-dict gather) runs on some ranks only: the other ranks never join it and the job hangs until the NCCL timeout",
    severity="blocking",
    tool="lint",
)


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if not f.distributed:
        return
    points = []
    for c in a.calls:
        if not f.reach.rank_conditions(c):
            continue
        what = f.sync_point(c)
        if what is None or id(c) in f.ddp_backwards or not f.reach.divergent(c):
            continue
        points.append((c, what))
    groups: dict[tuple[int, str], list] = {}
    for c, what in points:
        groups.setdefault((id(a.function_of(c)), dotted(c.func) or what), []).append(c)
    for c, what in points:
        group = groups[(id(a.function_of(c)), dotted(c.func) or what)]
        if len(group) > 1 and _complementary(f, group):
            continue
        test, taken = f.reach.rank_conditions(c)[0]
        where = f"only where `if {'' if taken else 'not '}{code(test)}` holds"
        base = _base(f, c)
        w = f.wrapper(base.func) if base is not None else None
        if w is None or w.kind != "ddp":
            ctx.report(
                c,
                "DDP210",
                f"{what} {where}: the other ranks never join this collective and the job hangs until the NCCL timeout; move it out of the branch (every rank must call it, in the same order)",
            )
            continue
        forward = (
            what
            if base is c
            else f"{code(c.func)}() runs a forward of the DDP model {dotted(base.func)}"
        )
        if not (f.no_grad(base) or f.no_grad(c)):
            ctx.report(
                c,
                "DDP210",
                f"{forward} {where}: the other ranks never run this forward, so the gradient all-reduce of the next backward waits forever; run it on every rank",
            )
            continue
        buffers = f.buffers(w)
        if buffers == "no":
            continue  # no gradient, no buffer: this forward communicates nothing
        maybe = " (this model may have some)" if buffers == "maybe" else ""
        ctx.report(
            c,
            "DDP210",
            f"{forward} {where}: DDP broadcasts the model's buffers from rank 0 at every forward{maybe}, so the other ranks never join and the job hangs; "
            f"evaluate the plain module there ({w.target or 'model'}.module), or evaluate on every rank",
            "note" if maybe else "",
        )


def _complementary(f, group) -> bool:
    """Every process reaches one of the calls (one branch each side of a rank test)."""
    reached = [False] * 3
    for c in group:
        for i, v in enumerate(f.reach.local(c)):
            if v is True or v is UNK:
                reached[i] = True
    return all(reached)


def _base(f, call):
    """The collective a call finally runs: itself, or (through the script's functions) the call
    inside them."""
    seen = 0
    cur = call
    while seen < 6:
        if f.collective(cur) is not None:
            return cur
        callee = f.own_call(cur)
        if callee not in f.sync_functions:
            return None
        cur = f.sync_functions[callee][0]
        seen += 1
    return None
