"""--optimize: fused optimizers (DDP131). Adam, AdamW and SGD of torch.optim get
fused=LOCAL_DEVICE.type == "cuda": one CUDA kernel updates every parameter (foreach runs several
passes over them); on CPU (gloo) the generated code keeps the default implementation. Refused
where the call already picks an implementation, hides its keywords in **kwargs, or runs before
the model reaches its device, and where the script uses sparse gradients."""

from __future__ import annotations

from ddpify.analysis import call_args
from ddpify.transforms.base import Context, Transform, append_kwarg
from ddpify.transforms.optimize_common import wrapped_models
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP131",
    "optimize-fused-optimizer",
    "--optimize: fused Adam/AdamW/SGD on GPUs (or why not)",
    fix=True,
    check="throughput",
)

CODE = "DDP131"
FUSED = {f"torch.optim.{n}" for n in ("Adam", "AdamW", "SGD")} | {
    "torch.optim.adam.Adam",
    "torch.optim.adamw.AdamW",
    "torch.optim.sgd.SGD",
}
CHOSEN = ("fused", "foreach", "differentiable")


class FusedOptimizerTransform(Transform):
    name = "optimize_optimizer"

    def plan(self, ctx: Context) -> None:
        if "fused-optimizer" not in ctx.opts.optimize:
            return
        a = ctx.a
        models = wrapped_models(ctx)
        for target, call in a.optimizers.items():
            sources = [
                s
                for s in a._param_sources(call)
                if s.split(".")[0] in {n.split(".")[0] for n in models}
            ]
            if not sources:
                continue
            qn = a.call_qualname(call)
            if qn not in FUSED:
                ctx.finding(
                    call,
                    CODE,
                    f"optimizer `{target}` ({qn}) left as it is: --optimize fuses torch.optim's Adam, AdamW and SGD only",
                    False,
                )
                continue
            _, kw = call_args(call)
            why = None
            if any(k in kw for k in CHOSEN):
                why = f"the call already chooses its implementation ({next(k for k in CHOSEN if k in kw)}=)"
            elif any(x.star == "**" for x in call.args):
                why = "its keywords come from a **dict, which may choose the implementation already"
            elif "sparse=True" in ctx.a.module.code or "Sparse" in qn:
                why = "the script uses sparse gradients, which the fused kernels do not take"
            elif any(f.code == "DDP035" for f in ctx.findings):
                why = "the model may stay on the CPU, and the fused kernel needs every parameter on the GPU"
            elif self._before_placement(ctx, call, sources):
                why = "it is built before the model reaches its device (older torch checks fused=True against the parameters' device when it is built)"
            if why or not ctx.editable(call):
                ctx.finding(
                    call,
                    CODE,
                    f"optimizer `{target}` not fused: {why or 'ddpify was asked to keep out here'}",
                    False,
                )
                continue
            ctx.edits.replace(
                call,
                lambda n: append_kwarg(
                    n, "fused", ctx.expr('LOCAL_DEVICE.type == "cuda"')
                ),
            )
            ctx.finding(
                call,
                CODE,
                f'optimizer `{target}` fused on GPUs (fused=LOCAL_DEVICE.type == "cuda"): one kernel updates every parameter, the same update; the default implementation on CPU',
                True,
            )

    @staticmethod
    def _before_placement(ctx: Context, call, sources: list[str]) -> bool:
        """The optimizer is built before the model it steps is moved to its device."""
        from ddpify.analysis.lifecycle import changes_in

        a = ctx.a
        stmt = a.statement(call)
        body = list(getattr(a.block(stmt), "body", ()))
        later = body[body.index(stmt) + 1 :] if stmt in body else []
        roots = {s.split(".")[0] for s in sources}
        return any(
            kind == "move"
            for s in later
            for r in roots
            for _, kind in changes_in(a, s, r)
        )
