"""A value all-reduced by hand where the reduction is already done, or done again and again:
the gradients of a model DDP wraps (its backward has averaged them already), or a running total
all-reduced inside the loop that keeps adding to it (each reduction sums the totals again, so
they grow by the world size each time)."""

from __future__ import annotations

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import call_args, code, dotted
from ddpify.lint.rules.common import torch_ddp
from ddpify.rules import declare

declare(
    "DDP244",
    "gradients-reduced-twice",
    "gradients (or a norm of them) all-reduced by hand although the model is wrapped in DDP, whose backward has already averaged them on every rank",
    severity="blocking",
    tool="lint",
)
declare(
    "DDP227",
    "running-total-reduced-repeatedly",
    "a running total all-reduced in place inside the loop that keeps adding to it: each reduction sums the ranks' totals again, so they grow by the world size at every iteration",
    severity="blocking",
    tool="lint",
)

REDUCES = ("torch.distributed.all_reduce", "torch.distributed.reduce")


def check(ctx) -> None:
    a = ctx.a
    if not torch_ddp(ctx):
        return
    for c in a.calls:
        if not a.is_call(c, *REDUCES):
            continue
        pos, kw = call_args(c)
        arg = pos[0].value if pos else kw["tensor"].value if "tensor" in kw else None
        if arg is None:
            continue
        owner = _gradients_of(ctx, arg)
        if owner is not None:
            ctx.report(
                c,
                "DDP244",
                f"`{code(c).strip()}` reduces gradients of {owner}, which DDP's backward has already averaged on every rank: "
                "they are reduced twice (a sum of equal averages, or a norm counted once a rank); drop the manual reduction, "
                "or do it under model.no_sync() with DDP out of the way",
            )
            continue
        total = _running_total(ctx, c, arg)
        if total is not None:
            ctx.report(
                c,
                "DDP227",
                f"`{code(c).strip()}` all-reduces {total} in place inside the loop that keeps adding to it: every reduction sums "
                "the ranks' totals again (the totals grow by the world size each time); reduce a copy, or all-reduce once "
                "after the loop",
            )


# ------------------------------------------------------------------------ gradients


def _gradients_of(ctx, expr: cst.BaseExpression, depth: int = 0) -> str | None:
    """The DDP model whose parameters' .grad the expression reads (through names bound in its
    function, comprehensions and loops over `model.parameters()`), or None."""
    a = ctx.a
    if depth > 3:
        return None
    for node in [expr, *a.findall(expr, m.Attribute())]:
        if isinstance(node, cst.Attribute) and node.attr.value == "grad":
            owner = _parameters_owner(ctx, node.value)
            if owner is not None:
                return owner
    fn = a.function_of(expr)
    for name in {
        n.value for n in [expr, *a.findall(expr, m.Name())] if isinstance(n, cst.Name)
    }:
        if fn is None or not a._is_local(fn, name):
            continue
        added = [
            aug.value
            for aug in a.findall(fn, m.AugAssign())
            if dotted(aug.target) == name
        ]  # `total += p.grad.norm() ** 2` builds it up
        for value in [*a._local_values(fn, name), *added]:
            found = _gradients_of(ctx, value, depth + 1)
            if found is not None:
                return found
        for loop in a.findall(fn, m.For()):
            if isinstance(loop.target, cst.Name) and loop.target.value == name:
                found = _gradients_of(ctx, loop.iter, depth + 1)
                if found is not None:
                    return found
    return None


def _parameters_owner(ctx, base: cst.BaseExpression) -> str | None:
    """`p` in `p.grad`, bound by a loop or comprehension over X.parameters() (or a parameter
    of the function that a caller gives X.parameters()), X a DDP model: its name."""
    a = ctx.a
    while isinstance(base, cst.Attribute) and base.attr.value == "data":
        base = base.value
    if not isinstance(base, cst.Name):
        return None
    for it in _iterables_of(a, base):
        for src in _argument_values(ctx, it):
            owner = _ddp_parameters(ctx, src)
            if owner is not None:
                return owner
    return None


def _iterables_of(a, name: cst.Name) -> list[cst.BaseExpression]:
    """What the loop or comprehension that binds `name` around it iterates."""
    out = []
    cur = a.parent.get(name)
    while cur is not None and not isinstance(cur, (cst.FunctionDef, cst.Module)):
        if isinstance(cur, (cst.ListComp, cst.GeneratorExp, cst.SetComp, cst.DictComp)):
            comp = cur.for_in
            while comp is not None:
                if (
                    isinstance(comp.target, cst.Name)
                    and comp.target.value == name.value
                ):
                    out.append(comp.iter)
                comp = comp.inner_for_in
        if (
            isinstance(cur, cst.For)
            and isinstance(cur.target, cst.Name)
            and cur.target.value == name.value
        ):
            out.append(cur.iter)
        cur = a.parent.get(cur)
    return out


def _argument_values(ctx, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """expr, or what the callers pass for it when it is a parameter of its function."""
    a = ctx.a
    d = dotted(expr)
    fn = a.function_of(expr)
    if d is None or "." in d or fn is None:
        return [expr]
    if not any(p.name.value == d for p in fn.params.params):
        return [*ctx.facts.sources(expr)]
    out = []
    for call in a.callers(fn)[:8]:
        try:
            arg = a.argument_for(call, fn, d)
        except ValueError:
            arg = None
        if arg is not None:
            out.append(arg)
    return out or [expr]


def _ddp_parameters(ctx, expr: cst.BaseExpression) -> str | None:
    """`X.parameters()` (or list(X.parameters())) with X a DDP model or its module: X's name."""
    f = ctx.facts
    if isinstance(expr, cst.Call) and dotted(expr.func) == "list" and expr.args:
        expr = expr.args[0].value
    if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)):
        return None
    if expr.func.attr.value not in ("parameters", "named_parameters"):
        return None
    holder = expr.func.value
    name = dotted(holder) or code(holder)
    plain = name[: -len(".module")] if name.endswith(".module") else name
    scope = ctx.a.function_of(holder)
    for w in f.ddp_wraps:
        if not f.trained(w):
            continue
        if f.wrapper(holder) is w or (
            name.endswith(".module") and f.wrapper(holder.value) is w
        ):
            return f"`{w.target or w.inner or name}`"
        # the module the wrap holds, by its name where the wrap is made
        if w.inner and w.inner == plain and ctx.a.function_of(w.stmt) is scope:
            return f"`{w.target or w.inner}`"
    return None


# ------------------------------------------------------------------------ running totals


def _running_total(ctx, c: cst.Call, arg: cst.BaseExpression) -> str | None:
    """What `arg` holds when it is a total kept across the loop's iterations (a name bound
    before the loop, or an attribute of self) that the loop, or c's method, adds to."""
    a = ctx.a
    fn = a.function_of(c)
    stores = _stores(a, arg)
    if not stores:
        return None
    loop = a.enclosing_loop(c)
    scope = (
        loop if loop is not None and (fn is None or a.function_of(loop) is fn) else None
    )
    for store in stores:
        if store.startswith("self."):
            if fn is None or not _adds_to(a, fn, store):
                continue
            if scope is not None or any(
                a.enclosing_loop(x) is not None for x in a.callers(fn)
            ):
                return f"`{store}`"
        elif (
            scope is not None
            and _adds_to(a, scope, store)
            and not _reset_in(a, scope, store)
        ):
            if fn is not None and a._is_local(fn, store) or fn is None:
                return f"`{store}`"
    return None


def _stores(a, arg: cst.BaseExpression) -> list[str]:
    """The names or self attributes a reduced tensor lives in: `total`, `self.metrics` for
    `self.metrics["x"]`, and for the loop variable of `for v in self.metrics.values()`."""
    out = []
    base = arg
    while isinstance(base, cst.Subscript):
        base = base.value
    d = dotted(base)
    if d:
        out.append(d)
    if isinstance(base, cst.Name):
        for it in _iterables_of(a, base):
            if (
                isinstance(it, cst.Call)
                and isinstance(it.func, cst.Attribute)
                and it.func.attr.value in ("values", "items")
            ):
                inner = dotted(it.func.value)
                if inner:
                    out.append(inner)
            elif dotted(it):
                out.append(dotted(it))
    return out


def _adds_to(a, scope: cst.CSTNode, store: str) -> bool:
    for node in a.findall(scope, m.AugAssign()):
        target = node.target
        while isinstance(target, cst.Subscript):
            target = target.value
        if dotted(target) == store and isinstance(node.operator, cst.AddAssign):
            return True
    return False


def _reset_in(a, scope: cst.CSTNode, store: str) -> bool:
    """The loop binds the name again (a fresh total each iteration)."""
    return any(
        isinstance(asg, cst.Assign)
        and any(dotted(t.target) == store for t in asg.targets)
        for asg in a.findall(scope, m.Assign())
    )
