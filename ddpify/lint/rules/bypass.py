"""A training forward that bypasses the DDP wrapper: the loss comes from the plain module
(`model.module(x)`, `model.module.compute_loss(x)`, or the module a differently named wrapper
wraps). DDP synchronises gradients only through its own forward: backward then all-reduces
nothing, and the ranks silently train different models."""

from __future__ import annotations

import libcst as cst

import ddpify.match as m

from ddpify.analysis.tree import code, dotted
from ddpify.lint.wrappers import NOT_FORWARD
from ddpify.rules import declare

declare(
    "DDP242",
    "forward-bypasses-ddp",
    "the training loss comes from the plain module, not the DDP wrapper: backward all-reduces nothing and the ranks silently train different models",
    severity="blocking",
    tool="lint",
)


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if not f.ddp_wraps:
        return
    for step in a.steps:
        calls = f.step_calls(step)
        # the wrappers whose forward the step runs (a step may train two models, each wrapped)
        through = {id(w) for c in calls if (w := f.wrapper(c.func)) is not None}
        for c in calls:
            w, how = _plain_forward(ctx, c)
            if w is None or id(w) in through:
                continue
            if through and (_detached(a, c) or f.no_grad(c)):
                continue  # a GAN's D step runs G for its samples only: G is not trained there
            ctx.report(
                c,
                "DDP242",
                f"the training loss comes from {how}, not through the DDP wrapper {w.target or 'DDP(...)'}: DDP synchronises gradients only in its own forward, so backward() all-reduces nothing and the ranks silently train different models; call the wrapper ({w.target}(...)), routing other methods through forward",
            )
            break


def _plain_forward(ctx, c: cst.Call):
    f = ctx.facts
    func = c.func
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
    w = f.plain_of(func) if dotted(func) is not None else None
    if w is not None and w.kind == "ddp" and f.after(c, w.stmt):
        return w, f"`{code(c.func)}(...)`, the module {w.target} wraps"
    # through a name, a getter or `x.module if ddp else x`: the module inside the wrapper
    base = (
        func.value
        if isinstance(func, cst.Attribute)
        and func.attr.value not in ("forward",)
        and not isinstance(func.value, cst.Name)
        else func
    )
    for node in (func, base) if base is not func else (func,):
        got = _inner_module(ctx, node, 0)
        if got is not None:
            w, via = got
            return (
                w,
                f"`{code(c.func)}(...)`, {via}, the module inside the wrapper {w.target}",
            )
    return None, ""


def _inner_module(ctx, node, depth):
    """(wrap, how) when node evaluates to the module inside a DDP wrapper (or a submodule of it):
    `ddp.module.head`, a name bound to it (also by unpacking), `ddp.module if ddp else ddp`, a
    call of the script's own function or method that returns it."""
    a, f = ctx.a, ctx.facts
    if node is None or depth > 4:
        return None
    if isinstance(node, cst.IfExp):
        return _inner_module(ctx, node.body, depth + 1) or _inner_module(
            ctx, node.orelse, depth + 1
        )
    if isinstance(node, cst.Attribute):
        cur = node
        while isinstance(cur, cst.Attribute):
            if cur.attr.value == "module":
                w = _wrapper_of(ctx, cur.value)
                if w is not None and w.kind == "ddp":
                    return w, f"through `{code(node)}`"
            cur = cur.value
        return None
    if isinstance(node, cst.Call) and not node.args and f.own_call(node):
        name = f.own_call(node)
        for fn in a.functions.get(name, [])[:2]:
            for r in a.findall(fn, m.Return()):
                if r.value is not None and a.function_of(r) is fn:
                    got = _inner_module(ctx, r.value, depth + 1)
                    if got is not None:
                        return got[0], f"which {name}() returns"
        return None
    if isinstance(node, cst.Name):
        fn = a.function_of(node)
        for v in _bound(a, fn, node.value):
            if f.order(v) < f.order(node) or a.function_of(v) is not fn:
                got = _inner_module(ctx, v, depth + 1)
                if got is not None:
                    return got[0], f"{node.value} ({got[1]})"
    return None


def _wrapper_of(ctx, node):
    """The wrap whose wrapper node holds: where it is bound, or through a `self` attribute set
    from a constructor argument (`Trainer(ddp_model)` sets `self.model = model`)."""
    a, f = ctx.a, ctx.facts
    w = f.wrapper(node)
    if w is not None:
        return w
    d = dotted(node) or ""
    if not (d.startswith("self.") and d.count(".") == 1):
        return None
    cls = a.class_of(node)
    for asg in a.assigns:
        if not (
            isinstance(asg, cst.Assign)
            and a.class_of(asg) is cls
            and any(dotted(t.target) == d for t in asg.targets)
        ):
            continue
        fn = a.function_of(asg)
        name = dotted(asg.value)
        if (
            fn is None
            or not name
            or "." in name
            or not any(p.name.value == name for p in fn.params.params)
        ):
            continue
        for call in a.callers(fn)[:6]:
            try:
                arg = a.argument_for(call, fn, name)
            except ValueError:
                arg = None
            w = f.wrapper(arg) if arg is not None else None
            if w is not None:
                return w
    return None


def _bound(a, fn, name):
    """Values bound to a plain name in fn: by assignment, and by unpacking `x, y = a, b`."""
    out = (
        list(a._local_values(fn, name))
        if fn is not None and a._is_local(fn, name)
        else list(a._local_values(None, name))
    )
    for asg in a.assigns:
        if (
            isinstance(asg, cst.Assign)
            and a.function_of(asg) is fn
            and isinstance(asg.value, (cst.Tuple, cst.List))
        ):
            for t in asg.targets:
                if isinstance(t.target, (cst.Tuple, cst.List)) and len(
                    t.target.elements
                ) == len(asg.value.elements):
                    for el, val in zip(t.target.elements, asg.value.elements):
                        if isinstance(el.value, cst.Name) and el.value.value == name:
                            out.append(val.value)
    return out


def _detached(a, call: cst.Call) -> bool:
    """`G(z).detach()`: the output leaves the graph, so the call's parameters train nothing here."""
    par = a.parent.get(call)
    return isinstance(par, cst.Attribute) and par.attr.value in ("detach", "detach_")
