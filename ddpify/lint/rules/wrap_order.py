"""A wrap made before the model's last move, dtype change, initialisation or freeze (DDP fixes
its device, its parameters and which need gradients at construction), or weights loaded on some
ranks only after the wrap (DDP broadcasts rank 0's weights once, at construction)."""

from __future__ import annotations

import libcst as cst

import ddpify.match as m
from ddpify.analysis.lifecycle import PLACEMENT, UNSAFE_AFTER_WRAP, changes_in
from ddpify.analysis.tree import code, dotted
from ddpify.rules import declare

declare(
    "DDP241",
    "wrap-before-model-change",
    "the model changes after its DDP wrap (moved, cast, re-initialised, frozen, or weights loaded on some ranks only): DDP fixed its device, parameters and rank 0's weights at construction",
    severity="blocking",
    tool="lint",
)

PHRASES = {
    "move": "moves {m} to another device or dtype",
    "init": "re-initialises parameters of {m}",
    "freeze": "changes which parameters of {m} need gradients",
    "structure": "replaces a submodule of {m} or adds parameters",
    "syncbn": "converts the BatchNorm layers of {m}",
}


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if not f.distributed:
        return
    for w in f.ddp_wraps:
        anchor = a.statement(w.call)
        wrap = f"`{w.target + ' = ' if w.target else ''}{dotted(w.call.func)}({w.inner or '...'}, ...)`"
        late = _late(ctx, w, anchor, w.inner) if w.inner else []
        if (
            w.target and w.target != w.inner
        ):  # the wrapper itself moved or cast later (`ddp.to(torch.float64)`)
            late += [(n, k) for n, k in _late(ctx, w, anchor, w.target) if k == "move"]
        for node, kind in late:
            what = PHRASES.get(kind, "changes {m}").format(m=w.inner or w.target)
            ctx.report(
                node,
                "DDP241",
                f"this {what} after its DDP wrap {wrap}: DDP fixed the model's device, its parameters and which need gradients when it was built (its gradient hooks stay on the old parameters); do this before the wrap",
            )
        for c in a.calls:
            if (
                not isinstance(c.func, cst.Attribute)
                or c.func.attr.value != "load_state_dict"
            ):
                continue
            target = c.func.value
            d = dotted(target) or ""
            if not (
                f.wrapper(target) is w
                or (w.inner and d == w.inner and f.after(c, anchor))
                or (d.endswith(".module") and f.wrapper(target.value) is w)
            ):  # type: ignore[attr-defined]
                continue
            if f.reach.divergent(c):
                ctx.report(
                    c,
                    "DDP241",
                    f"weights loaded on some ranks only, after the DDP wrap {wrap}: DDP broadcast rank 0's weights once, at construction, so the ranks now train different models; load on every rank, or before the wrap",
                )


def _late(ctx, w, anchor, name) -> list[tuple[cst.CSTNode, str]]:
    """Changes DDP cannot take, after the wrap: later in its function (up to the end of its
    last training loop, also inside the script's functions it hands the model to), and for
    `self.model`, in the class's other methods."""
    a, f = ctx.a, ctx.facts
    fn = a.function_of(anchor)
    scope = fn if fn is not None else a.module
    start = a._subtree_end(anchor)
    # `model.to(device)` again each epoch: the same placement, a no-op
    placed = {
        code(c)
        for c in a.findall(scope, m.Call(func=m.Attribute()))
        if f.order(c) < start and c.func.attr.value in PLACEMENT
    }  # type: ignore[attr-defined]
    loops = [
        lp
        for lp in a.findall(scope, m.For() | m.While())
        if a.function_of(lp) is fn
        and f.order(lp) >= start
        and any(f.sync_point(c) is not None for c in a.findall(lp, m.Call()))
    ]
    end = max((a._subtree_end(lp) for lp in loops), default=None)
    out: list[tuple[cst.CSTNode, str]] = []
    for s in a.findall(scope, m.SimpleStatementLine()):
        if (
            a.function_of(s) is not fn
            or f.order(s) < start
            or (end is not None and f.order(s) >= end)
        ):
            continue
        if f.exclusive(s, anchor):
            continue  # the other branch of the if that wraps: never both
        found = changes_in(a, s, name) + _through_own_functions(ctx, s, name)
        if any(
            k == "rebind"
            and not any(wr.call is getattr(n, "value", None) for wr in f.wraps)
            for n, k in found
        ):
            break  # the name holds another module from here on
        out += [
            (n, k)
            for n, k in found
            if k in UNSAFE_AFTER_WRAP and not (k == "move" and code(n) in placed)
        ]
    if not f.trained(
        w
    ):  # a model only evaluated (a DDP teacher for its SyncBatchNorm): freezing it is fine
        out = [(n, k) for n, k in out if k != "freeze"]
        return out
    if name.startswith("self.") and fn is not None:
        cls = a.class_of(fn)
        for meth in cls.body.body if cls is not None else []:
            if (
                isinstance(meth, cst.FunctionDef)
                and meth is not fn
                and meth.name.value != "__init__"
                and not f._only_before(meth, w)
            ):
                out += [
                    (n, k)
                    for n, k in changes_in(a, meth.body, name)
                    if k in UNSAFE_AFTER_WRAP
                    and not (k == "move" and code(n) in placed)
                ]
    return out


def _through_own_functions(ctx, stmt, name: str) -> list[tuple[cst.CSTNode, str]]:
    """`apply_recipe(model)`: a function of the script handed the model that changes it (swaps
    its submodules with setattr, re-initialises, freezes, moves it)."""
    a, f = ctx.a, ctx.facts
    out: list[tuple[cst.CSTNode, str]] = []
    for c in a.findall(stmt, m.Call()):
        callee = f.own_call(c)
        if (
            not callee
            or isinstance(c.func, cst.Attribute)
            and dotted(c.func.value) == name
        ):
            continue
        for fn in a.functions.get(callee, [])[:2]:
            for param in fn.params.params:
                try:
                    arg = a.argument_for(c, fn, param.name.value)
                except ValueError:
                    arg = None
                if arg is None or dotted(arg) != name:
                    continue
                kinds = [
                    k
                    for _, k in changes_in(a, fn.body, param.name.value)
                    if k in UNSAFE_AFTER_WRAP
                ]
                if any(
                    a.is_call(x, "setattr")
                    and x.args
                    and dotted(x.args[0].value) == param.name.value
                    for x in a.findall(fn, m.Call())
                ):
                    kinds.append("structure")
                if kinds:
                    out.append((c, kinds[0]))
    return out
