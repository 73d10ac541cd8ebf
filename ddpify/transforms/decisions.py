"""Decisions that end training (early stopping, a loss threshold) are taken by rank 0 and
shared, so no rank leaves the loop while the others wait in a collective."""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis.rank_invariance import RankInvariance
from ddpify.transforms.base import Context, Transform
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP080",
    "rank0-decides",
    "loop-ending decision taken by rank 0 and shared with every rank",
    fix=True,
    check="no-hang",
)


class DecisionTransform(Transform):
    name = "decisions"

    def plan(self, ctx: Context) -> None:
        """Every `if` between a training loop and a `break` or `return` that leaves it is
        taken by rank 0, unless its test is provably the same on every rank: a loss, a
        metric or anything else computed from a rank's own batches differs per rank. All
        the ifs of that path are shared, so every rank reaches each one equally often."""
        a = ctx.a
        training_loops = self._training_loops(ctx)
        decided: set[int] = set()
        # an if rank 0 decides runs its branches alike everywhere: what they count stays the
        # same on every rank (so `decided` is handed over, and grows)
        same = RankInvariance(a, decided, training_loops, getattr(ctx, "sharded", []))
        for exit_ in [
            *a.findall(a.module, m.Break()),
            *a.findall(a.module, m.Return()),
        ]:
            loop = self._left(ctx, exit_, training_loops)
            if loop is None:
                continue
            cur, child = a.parent.get(exit_), exit_
            path = []
            while cur is not None and cur is not loop:
                if isinstance(cur, cst.If) and child is not cur.test:
                    path.append(cur)
                if isinstance(cur, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                    path = []
                    break
                cur, child = a.parent.get(cur), cur
            for if_ in reversed(path):
                if (
                    id(if_) in decided
                    or not ctx.editable(if_)
                    or same.same_on_every_rank(if_.test, if_)
                ):
                    continue
                decided.add(id(if_))
                ctx.edits.replace(
                    if_.test,
                    lambda n: cst.Call(
                        func=cst.Name("rank0_decides"), args=[cst.Arg(n)]
                    ),
                )
                ctx.helpers.add("rank0_decides")
                ctx.finding(
                    if_,
                    "DDP080",
                    "loop-ending decision taken by rank 0 and shared with every rank (rank0_decides)",
                    True,
                )

    def _left(
        self, ctx: Context, exit_: cst.CSTNode, training_loops: set[int]
    ) -> cst.CSTNode | None:
        """The training loop that exit_ leaves (a return: the outermost one of its function)."""
        a = ctx.a
        if isinstance(exit_, cst.Break):
            loop = a.enclosing_loop(exit_)
            return loop if loop is not None and id(loop) in training_loops else None
        fn, found = a.function_of(exit_), None
        loop = a.enclosing_loop(exit_)
        while loop is not None and a.function_of(loop) is fn:
            if id(loop) in training_loops:
                found = loop
            loop = a.enclosing_loop(loop)
        return found

    def _training_loops(self, ctx: Context) -> set[int]:
        """Loops that run a training step, directly or through a function they call."""
        a = ctx.a
        out: set[int] = set()
        step_fns = set()
        for s in a.steps:
            loop = a.enclosing_loop(s.stmt)
            while loop is not None:
                out.add(id(loop))
                loop = a.enclosing_loop(loop)
            fn = a.function_of(s.stmt)
            if fn is not None:
                step_fns.add(fn)
        frontier = list(step_fns)
        seen = set()
        while frontier:
            fn = frontier.pop()
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            for call in a.callers(fn):
                loop = a.enclosing_loop(call)
                while loop is not None:
                    out.add(id(loop))
                    loop = a.enclosing_loop(loop)
                cfn = a.function_of(call)
                if cfn is not None:
                    frontier.append(cfn)
        return out
