"""The weights of a model DDP wraps changed on some ranks only by a helper of the script that
writes into it (an EMA copied back into the online model, a restore method) under a test on the
rank. DDP broadcasts the parameters at construction only, so the ranks keep training different
models, silently. (A state loaded into the model itself on some ranks is DDP241.)"""

from __future__ import annotations

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import code, dotted
from ddpify.lint.rules.common import torch_ddp
from ddpify.rules import declare

declare(
    "DDP245",
    "weights-changed-on-some-ranks",
    "a helper of the script writes into the weights of a model DDP wraps (an EMA copied back, a restore) under a test on the rank: the other ranks keep the old weights, and the replicas drift apart silently",
    severity="blocking",
    tool="lint",
)

WRITES = ("load_state_dict", "copy_")


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if not torch_ddp(ctx) or not f.ddp_wraps:
        return
    for c in a.calls:
        conds = f.reach.rank_conditions(c)
        if not conds or not f.reach.divergent(c):
            continue
        hit = _writes_model(ctx, c)
        if hit is None:
            continue
        w, how = hit
        if not f.after(c, w.stmt):
            continue  # before the wrap: DDP's construction broadcasts rank 0's weights
        test, taken = conds[0]
        ctx.report(
            c,
            "DDP245",
            f"`{code(c).strip()}` {how}, only where `if {'' if taken else 'not '}{code(test)}` holds: the other ranks keep the "
            "old weights and the replicas drift apart silently (DDP broadcasts parameters only when it is built); "
            "run it on every rank",
        )


def _model_wrap(ctx, expr: cst.BaseExpression | None):
    """The trained DDP wrap whose weights expr holds: the wrapper, its .module, the module it
    wraps (by name)."""
    f = ctx.facts
    d = dotted(expr) if expr is not None else None
    if d is None:
        return None
    plain = d[: -len(".module")] if d.endswith(".module") else d
    for w in f.ddp_wraps:
        if not f.trained(w):
            continue
        if f.wrapper(expr) is w or plain == w.target or (w.inner and d == w.inner):
            return w
    return None


def _writes_model(ctx, c: cst.Call):
    """(wrap, how) when the call is a helper of the script whose code writes into an object
    built from a DDP model."""
    a, f = ctx.a, ctx.facts
    # helper.update() where helper = Helper(model) and Helper.update writes into self.<attr>
    if not isinstance(c.func, cst.Attribute):
        return None
    receiver = c.func.value
    method = c.func.attr.value
    for built in f.sources(receiver):
        if not isinstance(built, cst.Call):
            continue
        cls = a.classes.get((dotted(built.func) or "").rsplit(".", 1)[-1])
        if cls is None:
            continue
        methods = {
            fn.name.value: fn for fn in cls.body.body if isinstance(fn, cst.FunctionDef)
        }
        target = methods.get(method)
        init = methods.get("__init__")
        if target is None or init is None:
            continue
        for attr, param in _attrs_from_params(a, init):
            if not _writes_attr(a, target, attr):
                continue
            arg = _constructor_arg(init, built, param)
            w = _model_wrap(ctx, arg)
            if w is not None:
                return (
                    w,
                    f"writes into `{code(arg).strip()}`, which DDP wraps ({cls.name.value}.{method} changes self.{attr})",
                )
    return None


def _attrs_from_params(a, init: cst.FunctionDef) -> list[tuple[str, str]]:
    """(attr, param) for `self.attr = param` in __init__."""
    params = {p.name.value for p in init.params.params}
    out = []
    for stmt in a.findall(init, m.Assign()):
        if isinstance(stmt.value, cst.Name) and stmt.value.value in params:
            for t in stmt.targets:
                d = dotted(t.target) or ""
                if d.startswith("self.") and d.count(".") == 1:
                    out.append((d[len("self.") :], stmt.value.value))
    return out


def _writes_attr(a, fn: cst.FunctionDef, attr: str) -> bool:
    for c in a.findall(fn, m.Call()):
        if isinstance(c.func, cst.Attribute) and c.func.attr.value in WRITES:
            base = dotted(c.func.value) or ""
            if base == f"self.{attr}" or base.startswith(f"self.{attr}."):
                return True
    return False


def _constructor_arg(init: cst.FunctionDef, built: cst.Call, param: str):
    names = [p.name.value for p in init.params.params][1:]  # after self
    for x in built.args:
        if x.keyword is not None and x.keyword.value == param:
            return x.value
    positional = [x for x in built.args if x.keyword is None and not x.star]
    if param in names and names.index(param) < len(positional):
        return positional[names.index(param)].value
    return None
