"""--optimize: DDP's gradient buckets (DDP132). gradient_as_bucket_view=True makes each
parameter's .grad a view into DDP's all-reduce bucket (no copy in and out of the bucket, one
gradient-sized buffer less), and bucket_cap_mb grows the buckets with the model (about 16 per
model, never below DDP's 25 MB), so a large model all-reduces in fewer, larger messages.
Refused where the script replaces or detaches a .grad (a view cannot be re-pointed)."""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import dotted
from ddpify.rules import declare
from ddpify.transforms.base import Concern, Context
from ddpify.transforms.optimize_common import anchor_of, wrapped_models
from ddpify.transforms.plans import DDPOptions

# The codes this module raises (the registry: ddpify/rules.py).
DDP132 = declare(
    "DDP132",
    "optimize-ddp-buckets",
    "--optimize: DDP gradient_as_bucket_view=True and bucket_cap_mb from the model's size (or why not)",
    fix=True,
    check="throughput",
    says={
        "": "DDP of `{model}`: gradient_as_bucket_view=True (grads are views into the all-reduce "
        "buckets: no copies, less memory) and bucket_cap_mb from the model's size (about 16 "
        "buckets, at least DDP's 25 MB)",
        "grad": (
            "DDP buckets of `{model}` left at their defaults: line {line} replaces or detaches a "
            ".grad, which gradient_as_bucket_view=True (grads that are views into DDP's "
            "buckets) does not allow",
            False,
        ),
    },
)

# 25 MB is DDP's default; a model of P MB gets about 16 buckets of P/16 MB above 400 MB.
BUCKET_MB = "max(25, sum(p.numel() * p.element_size() for p in {name}.parameters()) / 2**20 / 16)"


class DDPBucketsTransform(Concern):
    name = "optimize_ddp"
    makes = "ddp_buckets"
    reads = ("wrap",)

    def decide(self, ctx: Context) -> DDPOptions:
        if "ddp-buckets" not in ctx.opts.optimize:
            return DDPOptions()
        options, said = [], []
        touched = self._grad_rebound(ctx)
        for w in ctx.plans.wrap.wraps:
            if w.model not in wrapped_models(ctx) or any(
                o[0] == w.model for o in options
            ):
                continue
            anchor = anchor_of(ctx, w.model)
            if touched is not None:
                line = ctx.a.pos[touched].start.line
                said.append(DDP132.at(anchor, "grad", model=w.model, line=line))
                continue
            options += [
                (w.model, "gradient_as_bucket_view", "True"),
                (w.model, "bucket_cap_mb", BUCKET_MB.format(name=w.module)),
            ]
            said.append(DDP132.at(anchor, model=w.model))
        return DDPOptions(tuple(options), tuple(said))

    def emit(self, ctx: Context, plan: DDPOptions) -> None:
        for said in plan.said:  # the keywords go into the wrap (wrapping.py's emit)
            ctx.say(said)

    @staticmethod
    def _grad_rebound(ctx: Context) -> cst.CSTNode | None:
        a = ctx.a
        for asg in a.assigns:
            targets = (
                [t.target for t in asg.targets]
                if isinstance(asg, cst.Assign)
                else [asg.target]
            )
            if any(
                isinstance(t, cst.Attribute)
                and (
                    t.attr.value == "grad" or (dotted(t.value) or "").endswith(".grad")
                )
                for t in targets
            ):
                return asg
        for c in a.findall(a.module, m.Call(func=m.Attribute())):
            inner = c.func.value  # type: ignore[attr-defined]
            if (
                c.func.attr.value in ("detach_", "requires_grad_", "set_")
                and isinstance(inner, cst.Attribute)
                and inner.attr.value == "grad"
            ):  # type: ignore[attr-defined]
                return c
        return None
