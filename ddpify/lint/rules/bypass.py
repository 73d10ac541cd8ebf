"""A training forward that bypasses the DDP wrapper: the loss comes from the plain module
(`model.module(x)`, `model.module.compute_loss(x)`, or the module a differently named wrapper
wraps). DDP synchronises gradients only through its own forward: backward then all-reduces
nothing, and the ranks silently train different models."""

from __future__ import annotations

import libcst as cst

from ddpify.analysis.tree import code, dotted
from ddpify.lint.wrappers import NOT_FORWARD
from ddpify.rules import declare

declare("DDP242", "forward-bypasses-ddp", "the training loss comes from the plain module, not the DDP wrapper: backward all-reduces nothing and the ranks silently train different models", severity="blocking", tool="lint")


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if not f.ddp_wraps:
        return
    for step in a.steps:
        calls = f.step_calls(step)
        if any(f.wrapper(c.func) is not None for c in calls):
            continue  # the step runs the wrapper's forward
        for c in calls:
            w, how = _plain_forward(ctx, c)
            if w is None:
                continue
            ctx.report(c, "DDP242", f"the training loss comes from {how}, not through the DDP wrapper {w.target or 'DDP(...)'}: DDP synchronises gradients only in its own forward, so backward() all-reduces nothing and the ranks silently train different models; call the wrapper ({w.target}(...)), routing other methods through forward")
            break


def _plain_forward(ctx, c: cst.Call):
    f = ctx.facts
    func = c.func
    d = dotted(func)
    if d is None:
        return None, ""
    if isinstance(func, cst.Attribute) and func.attr.value in NOT_FORWARD:
        return None, ""
    # model.module(x) / model.module.compute_loss(x)
    node = func
    while isinstance(node, cst.Attribute):
        if node.attr.value == "module":
            w = f.wrapper(node.value)
            if w is not None and w.kind == "ddp":
                return w, f"`{code(c.func)}(...)`, the module inside the wrapper"
        node = node.value
    w = f.plain_of(func)
    if w is not None and w.kind == "ddp" and f.after(c, w.stmt):
        return w, f"`{code(c.func)}(...)`, the module {w.target} wraps"
    return None, ""
