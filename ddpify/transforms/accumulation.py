"""Gradient accumulation: micro-steps that do not step the optimizer skip DDP's gradient
averaging (`model.set_requires_gradient_sync(False)` before their forward pass), so DDP
all-reduces once per optimizer step instead of once per micro-step."""

from __future__ import annotations

import ddpify.match as m

from ddpify.analysis import code
from ddpify.analysis.loss_flow import loss_flow
from ddpify.analysis.tree import _inside
from ddpify.transforms.base import Context, Transform
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
DDP050 = declare(
    "DDP050",
    "accumulation-no-sync",
    "gradient-accumulation micro-steps do not average gradients: one all-reduce per optimizer step",
    fix=True,
    check="params-in-sync",
    says="micro-steps that do not step the optimizer skip DDP's gradient averaging "
    "({models}.set_requires_gradient_sync({test}) before the forward pass): one all-reduce per "
    "optimizer step",
)


class AccumulationTransform(Transform):
    name = "accumulation"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        plan = ctx.plans.wrap
        if plan is None or not plan.wraps:
            return
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
            models = self._models(ctx, region)
            if not models:
                continue
            for model in models:
                ctx.edits.before[step.forward_first].append(
                    ctx.stmt(f"{model}.set_requires_gradient_sync({code(test)})\n")
                )
            ctx.say(DDP050.at(step.stmt, models=", ".join(models), test=code(test)))

    @staticmethod
    def _models(ctx: Context, region) -> list[str]:
        """The distributed models the step's training forwards run, as the step names them."""
        a = ctx.a
        wrapped = {w.model for w in ctx.plans.wrap.wraps}
        out: list[str] = []
        for tf in loss_flow(a).forwards:
            if not any(tf.call is s or _inside(a, tf.call, s) for s in region):
                continue
            name = code(tf.receiver)
            if (name in wrapped or len(wrapped) == 1) and name not in out:
                out.append(name)
        return out
