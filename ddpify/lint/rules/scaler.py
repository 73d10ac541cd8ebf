"""Loss-scaling order mistakes with a GradScaler: gradients clipped while still scaled (before
scaler.unscale_), scaler.step after a backward of the unscaled loss, or scaled gradients that
reach optimizer.step() without the scaler."""

from __future__ import annotations

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import call_args, code, dotted
from ddpify.rules import declare

declare(
    "DDP270",
    "clip-before-unscale",
    "gradients clipped while still scaled by the GradScaler (before scaler.unscale_(optimizer)): the clip threshold applies to scaled values, so it clips almost every step or never",
    severity="blocking",
    tool="lint",
)
declare(
    "DDP271",
    "scaler-order",
    "the GradScaler is used in part: scaler.step() after a backward of the unscaled loss (the step divides by the scale), or scaled gradients passed to optimizer.step() directly",
    severity="blocking",
    tool="lint",
)

SCALERS = (
    "torch.cuda.amp.GradScaler",
    "torch.amp.GradScaler",
    "torch.GradScaler",
    "torch.amp.grad_scaler.GradScaler",
    "torch.cuda.amp.grad_scaler.GradScaler",
)
CLIPS = ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grad_value")


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if not f.distributed or f.framework is not None:
        return
    scalers = set()
    for c in a.calls:
        if a.is_call(c, *SCALERS):
            _, kw = call_args(c)
            if "enabled" in kw and m.matches(kw["enabled"].value, m.Name("False")):
                continue
            t = a._assign_target(c)
            if t:
                scalers.add(t)
    if not scalers:
        return
    for step in a.steps:
        backward = step.backward.func.value  # type: ignore[attr-defined]
        scaled = _is_scale(backward, scalers)
        if not scaled and isinstance(backward, (cst.Name, cst.Attribute)):
            # `self.backward(loss)`: the program's own method or function that back-propagates
            own = _own_backward(a, step.backward, scalers)
            if own is not None:
                scaled, backward = True, own
        calls = sorted(
            (c for s in step.tail for c in a.findall(s, m.Call())), key=f.order
        )
        calls = [c for c in calls if f.order(c) > f.order(step.backward)]
        unscaled_at = None
        for c in calls:
            meth = (
                c.func.attr.value
                if isinstance(c.func, cst.Attribute)
                else dotted(c.func) or ""
            )
            base = dotted(c.func.value) if isinstance(c.func, cst.Attribute) else None
            if meth == "unscale_" and base in scalers:
                unscaled_at = c
            elif (
                meth.rsplit(".", 1)[-1] in CLIPS
                and scaled
                and unscaled_at is None
                and base not in f.accelerators
            ):
                ctx.report(
                    c,
                    "DDP270",
                    f"{code(c.func)}(...) clips gradients that the GradScaler still scales (no {dotted(backward.func.value)}.unscale_(optimizer) before it): the threshold applies to scaled values; call {dotted(backward.func.value)}.unscale_(optimizer) first",
                )
            elif meth == "step" and base in scalers and not scaled:
                ctx.report(
                    c,
                    "DDP271",
                    f"{code(c.func)}(optimizer) after `{code(step.backward.func.value)}.backward()`, a backward of the unscaled loss: scaler.step divides the gradients by the scale; back-propagate {base}.scale(loss) instead",
                )
            elif (
                meth == "step"
                and scaled
                and base not in scalers
                and a.is_optimizer_ref(c.func.value)
                and not any(
                    isinstance(x.func, cst.Attribute)
                    and x.func.attr.value == "step"
                    and dotted(x.func.value) in scalers
                    for x in calls
                )
            ):
                ctx.report(
                    c,
                    "DDP271",
                    f"{code(c.func)}() takes the gradients that {dotted(backward.func.value)}.scale(loss) scaled, without the scaler: the update is the scale (65536 by default) times too large and infs are never skipped; call {dotted(backward.func.value)}.step(optimizer) and {dotted(backward.func.value)}.update()",
                )


def _is_scale(node, scalers: set[str]) -> bool:
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "scale"
        and dotted(node.func.value) in scalers
    )


def _own_backward(a, call: cst.Call, scalers: set[str]) -> cst.Call | None:
    """The scaler's scale(...) call inside the program's own function or method that `call`
    runs (`def backward(self, loss): scaler.scale(loss).backward()`), or None."""
    func = call.func
    name = func.attr.value if isinstance(func, cst.Attribute) else dotted(func)
    for fn in a.findall(a.module, m.FunctionDef()):
        if fn.name.value != name:
            continue
        for c in a.findall(fn, m.Call()):
            if (
                isinstance(c.func, cst.Attribute)
                and c.func.attr.value == "backward"
                and _is_scale(c.func.value, scalers)
            ):
                return c.func.value
    return None
