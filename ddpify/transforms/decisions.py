"""Decisions that end training (early stopping, a loss threshold) are taken by rank 0 and
shared, so no rank leaves the loop while the others wait in a collective."""

from __future__ import annotations

import re

import libcst as cst
import ddpify.match as m

from ddpify.transforms.base import Context, Transform
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare("DDP080", "rank0-decides", "loop-ending decision taken by rank 0 and shared with every rank", fix=True, check="no-hang")

DATA_DEPENDENT = {
    "loss", "acc", "accuracy", "metric", "metrics", "score", "best", "patience", "stop", "stopping", "early", "bad",
    "improve", "improved", "improvement", "converged", "val", "valid", "validation", "ppl", "perplexity", "error",
    "err", "wait", "trigger", "triggered", "plateau", "f1", "auc", "bleu", "mse", "mae", "rmse",
}


def _tokens(name: str) -> set[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()
    return {t for t in re.split(r"[_\W]+", spaced) if t}


class DecisionTransform(Transform):
    name = "decisions"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        training_loops = self._training_loops(ctx)
        for if_ in a.ifs:
            if not ctx.editable(if_):
                continue
            exits = [b for b in a.findall(if_.body, m.Break()) if a.ancestor(b, cst.If) is if_]
            if not exits:
                continue
            loop = a.enclosing_loop(if_)
            if loop is None or id(loop) not in training_loops:
                continue
            if any(a.enclosing_loop(b) is not loop for b in exits):
                continue
            names = {n.value for n in a.findall(if_.test, m.Name())} | {n.attr.value for n in a.findall(if_.test, m.Attribute())}
            if not any(_tokens(n) & DATA_DEPENDENT for n in names) and not a.findall(if_.test, m.Call(func=m.Attribute(attr=m.Name("item")))):
                continue
            ctx.edits.replace(if_.test, lambda n: cst.Call(func=cst.Name("rank0_decides"), args=[cst.Arg(n)]))
            ctx.helpers.add("rank0_decides")
            ctx.finding(if_, "DDP080", "loop-ending decision taken by rank 0 and shared with every rank (rank0_decides)", True)

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
