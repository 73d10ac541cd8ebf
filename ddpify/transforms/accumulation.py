"""Gradient accumulation: micro-steps that do not step the optimizer run under no_sync(),
so DDP all-reduces once per optimizer step instead of once per micro-step."""

from __future__ import annotations

import ddpify.match as m

from ddpify.analysis import code
from ddpify.analysis.tree import _inside
from ddpify.transforms.base import Context, Transform
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP050",
    "accumulation-no-sync",
    "gradient-accumulation micro-steps run under model.no_sync()",
    fix=True,
    check="params-in-sync",
)


class AccumulationTransform(Transform):
    name = "accumulation"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        if ctx.opts.amp == "apex":
            return  # apex's DistributedDataParallel has no no_sync()
        for step in a.steps:
            test = step.accumulation_test
            if (
                test is None
                or step.forward_first is None
                or not ctx.editable(step.stmt)
            ):
                continue
            if a.manual_update_in(step.tail) is not None:
                continue  # `if opt: opt.step() else: <update by hand>`: every iteration updates
            body = list(step.block.body)
            if step.forward_first not in body:
                continue
            first, last = body.index(step.forward_first), body.index(step.stmt)
            region = body[first : last + 1]
            # the condition must mean the same before the forward pass as after backward
            names = {n.value for n in a.findall(test, m.Name())}
            if any(a._assigns(s, n) for s in region for n in names):
                continue
            wrappers = self._wrappers(ctx, step)
            if len(wrappers) != 1:
                continue
            ctxlib = ctx.name("contextlib")
            header = ctx.expr(
                f"{ctxlib}.nullcontext() if {code(test)} else {wrappers[0]}.no_sync()"
            )
            ctx.edits.wraps.append((step.forward_first, step.stmt, header))
            ctx.finding(
                step.stmt,
                "DDP050",
                f"micro-steps that do not step the optimizer run under {wrappers[0]}.no_sync(): one all-reduce per optimizer step",
                True,
            )

    @staticmethod
    def _wrappers(ctx: Context, step) -> list[str]:
        """The DDP wrappers the step's training forwards run through, as named in the step."""
        from ddpify.transforms.routing import wrapper_at

        a = ctx.a
        body = list(step.block.body)
        region = body[body.index(step.forward_first) : body.index(step.stmt) + 1]
        out: list[str] = []
        for name, r in ctx.routes.items():
            for tf, _node, holder in r.direct:  # type: ignore[attr-defined]
                if any(tf.call is s or _inside(a, tf.call, s) for s in region):
                    w = wrapper_at(ctx.wrappers[name], holder)
                    if w not in out:
                        out.append(w)
            for tf, param in r.holder_forwards:  # type: ignore[attr-defined]
                if (
                    any(tf.call is s or _inside(a, tf.call, s) for s in region)
                    and param not in out
                ):
                    out.append(param)
        return out
