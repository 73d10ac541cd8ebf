"""Training forwards through the DDP wrapper. The model keeps its name (the plain module) and the
wrapper has its own (wrapping.py); each call whose output reaches a backward names the wrapper
where it runs (`ddp_model(x)`, `self.ddp_model(x)`, `ddp_model(x, method="loss")` for a loss
computed by a method), or the function that runs it is handed the wrapper (`train(ddp_model,
...)`). Every other use of the model is left as it is (ddpify/analysis/routes.py)."""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import code
from ddpify.transforms.base import Context, Transform, append_kwarg
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP137",
    "training-forward-routed",
    "training forward through the DDP wrapper (the model keeps its name for every other use)",
    fix=True,
    check="params-in-sync",
)


def wrapper_at(wrapper: str, holder: str) -> str:
    """The wrapper's expression where `holder` holds it: "" its own name, "self" (self.ddp_model),
    an instance of the class that wraps it (trainer.ddp_model)."""
    if holder in ("", "self"):
        return wrapper
    return f"{holder}.{wrapper.split('.', 1)[1]}"


class RoutingTransform(Transform):
    name = "routing"

    def plan(self, ctx: Context) -> None:
        for name, r in ctx.routes.items():
            wrapper = ctx.wrappers[name]
            for tf, node, holder in r.direct:  # type: ignore[attr-defined]
                expr = wrapper_at(wrapper, holder)
                self._route(ctx, tf, node, expr)
                shown = (
                    f'{expr}(..., method="{tf.method}")'
                    if tf.method
                    else f"{expr}(...)"
                )
                ctx.finding(
                    tf.call,
                    "DDP137",
                    f"training forward (its output reaches backward()): `{code(tf.call.func)}(...)` runs as {shown}, so DDP averages the gradients",
                    True,
                )
            for tf, param in r.holder_forwards:  # type: ignore[attr-defined]
                if tf.method is not None or tf.receiver is not tf.call.func:
                    self._route(ctx, tf, tf.receiver, param)
                    ctx.finding(
                        tf.call,
                        "DDP137",
                        f"training forward of the wrapper `{param}` holds here: `{code(tf.call.func)}(...)` runs as DDP's forward",
                        True,
                    )
            for call, arg, holder in r.handed:  # type: ignore[attr-defined]
                expr = wrapper_at(wrapper, holder)
                ctx.edits.replace(arg, lambda n, e=expr: ctx.expr(e))
                ctx.finding(
                    call,
                    "DDP137",
                    f"{code(call.func)}() runs the training forward of `{code(arg)}`: it gets the DDP wrapper, `{expr}`",
                    True,
                )

    @staticmethod
    def _route(ctx: Context, tf, node: cst.CSTNode, expr: str) -> None:
        if tf.method is None and tf.receiver is tf.call.func:
            ctx.edits.replace(
                node, lambda n: ctx.expr(expr)
            )  # model(x) -> ddp_model(x)
            return
        method = tf.method

        def through(call: cst.Call) -> cst.Call:
            # model.forward(x) -> ddp_model(x); model.loss(x) -> ddp_model(x, method="loss")
            new = call.with_changes(func=ctx.expr(expr))
            return (
                new
                if method is None
                else append_kwarg(new, "method", cst.SimpleString(f'"{method}"'))
            )

        ctx.edits.replace(tf.call, through)
