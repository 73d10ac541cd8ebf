"""--optimize: DDP static_graph=True (DDP133) where the model's graph provably does not change
between steps: its code is read (this file or a module beside it) and its forward has no branch,
no loop over data and no class ddpify cannot read; every parameter gets a gradient (no
find_unused_parameters); the model runs once per backward, with no gradient accumulation.
DDP then reuses what it learnt in the first step (which buckets are ready when)."""

from __future__ import annotations

import ddpify.match as m

from ddpify.analysis import dotted
from ddpify.analysis.model_code import dynamic_forward
from ddpify.rules import declare
from ddpify.transforms.base import Concern, Context
from ddpify.transforms.optimize_common import anchor_of, code_of, wrapped_models
from ddpify.transforms.plans import DDPOptions

# The codes this module raises (the registry: ddpify/rules.py).
DDP133 = declare(
    "DDP133",
    "optimize-static-graph",
    "--optimize: DDP static_graph=True where the graph provably does not change (or why not)",
    fix=True,
    check="throughput",
    says={
        "": "DDP of `{model}` with static_graph=True: its forward has no branch or "
        "data-dependent loop, every parameter gets a gradient, and it runs once per backward",
        "not": ("static_graph not set for `{model}`: {why}", False),
    },
)


class StaticGraphTransform(Concern):
    name = "optimize_static_graph"
    makes = "static_graph"
    reads = ("wrap",)

    def decide(self, ctx: Context) -> DDPOptions:
        if "static-graph" not in ctx.opts.optimize:
            return DDPOptions()
        options, said = [], []
        for name in wrapped_models(ctx):
            why = self._why_not(ctx, name)
            anchor = anchor_of(ctx, name)
            if why:
                said.append(DDP133.at(anchor, "not", model=name, why=why))
            else:
                options.append((name, "static_graph", "True"))
                said.append(DDP133.at(anchor, model=name))
        return DDPOptions(tuple(options), tuple(said))

    def emit(self, ctx: Context, plan: DDPOptions) -> None:
        for said in plan.said:  # the keyword goes into the wrap (wrapping.py's emit)
            ctx.say(said)

    @staticmethod
    def _why_not(ctx: Context, name: str) -> str | None:
        a = ctx.a
        w = next(w for w in ctx.plans.wrap.wraps if w.model == name)
        if dict(w.options).get("find_unused_parameters") == "True":
            return "some parameters may get no gradient (find_unused_parameters=True), so the graph may change"
        if w.entries:
            return "its training runs its methods or parts directly, which a static graph does not cover"
        if any(a.is_call(c, "torch.compile") for c in a.calls):
            return "torch.compile may change the graph DDP sees"
        mc = code_of(ctx, name)
        if isinstance(mc, str):
            return f"{mc}, so ddpify cannot show that its graph does not change"
        dynamic = dynamic_forward(mc)
        if dynamic:
            return f"{mc.name} may change its graph between steps: {dynamic}"
        steps = [s for s in a.steps if name in s.models]
        if len(steps) != 1:
            return f"it takes part in {len(steps)} backward passes, not exactly one"
        step = steps[0]
        if step.accumulation_test is not None:
            return "gradients are accumulated over micro-steps, which a static graph does not cover"
        body = list(step.block.body)
        region = (
            body[body.index(step.forward_first) : body.index(step.stmt) + 1]
            if step.forward_first in body
            else [step.stmt]
        )
        runs = [
            c
            for st in region
            for c in a.findall(st, m.Call())
            if dotted(c.func) == name
        ]
        if len(runs) != 1:
            return f"it runs {len(runs)} times per backward pass"
        return None
