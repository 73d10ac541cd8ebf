"""apex imports once apex is rewritten to torch-native: removed where nothing of theirs is left,
kept for what stays (FusedLAMB). An import fallback keeps the author's intent as valid code: a
name bound in both branches (`except ImportError: AdamImpl = torch.optim.Adam`) is bound to
the torch replacement in place of the import, never replaced by an assignment to a library
attribute; a try that can no longer fail (its only imports were apex's) becomes its body, so
an availability flag (`APEX = True` / `except ImportError: APEX = False`) is simply True.
"""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import dotted
from ddpify.transforms.apex_common import NATIVE, also_bound, apex_q
from ddpify.transforms.base import Context

CATCHES = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def plan_imports(ctx: Context, alias_native: dict[str, str], kept: set[str]) -> None:
    a = ctx.a
    left = _left(ctx, kept)
    plans: dict[
        cst.SimpleStatementLine, list[cst.BaseStatement] | None
    ] = {}  # None: left as it is
    for s in a.findall(a.module, m.SimpleStatementLine()):
        if (
            len(s.body) != 1
            or not isinstance(s.body[0], (cst.Import, cst.ImportFrom))
            or not ctx.editable(s)
        ):
            continue
        plan = _plan_import(ctx, s, s.body[0], left, alias_native)
        if plan is not None:
            plans[s] = plan
    done: set[int] = set()
    for s, new in plans.items():
        try_ = _fallback_try(a, s)
        if try_ is not None and id(try_) not in done and _collapse(ctx, try_, plans):
            done.add(id(try_))
            continue
        if try_ is not None and id(try_) in done:
            continue
        if new:
            ctx.edits.replace(
                s, lambda n, new=new: new[0].with_changes(leading_lines=n.leading_lines)
            )
            ctx.edits.after[s].extend(new[1:])
        else:
            ctx.edits.removed.add(s)
    _keep_spacing(ctx)


def _plan_import(
    ctx: Context, s, imp, left: set[str], alias_native: dict[str, str]
) -> list[cst.BaseStatement] | None:
    """The statements the import becomes (the names it keeps, then fallback-bound names bound to
    their torch replacement), or None where it is not apex's or stays whole."""
    a = ctx.a
    if isinstance(imp, cst.ImportFrom):
        if isinstance(imp.names, cst.ImportStar) or imp.module is None or imp.relative:
            return None
        base = dotted(imp.module) or ""
        items = [
            (x, x.evaluated_alias or x.evaluated_name, f"{base}.{x.evaluated_name}")
            for x in imp.names
        ]
    else:
        items = [
            (
                x,
                x.evaluated_alias or x.evaluated_name.split(".")[0],
                x.evaluated_name if x.asname else x.evaluated_name.split(".")[0],
            )
            for x in imp.names
        ]
    if not any(q == "apex" or q.startswith("apex.") for _, _, q in items):
        return None
    keep, binds = [], []
    for node, bound, q in items:
        apex = q == "apex" or q.startswith("apex.")
        if not apex or any(r == q or r.startswith(q + ".") for r in left):
            keep.append(node)
            continue
        native = alias_native.get(bound) or NATIVE.get(q)
        if native is not None and _bound_to_value(a, s, bound):
            binds.append(ctx.stmt(f"{bound} = {native}\n"))
    if len(keep) == len(items):
        return None
    out: list[cst.BaseStatement] = []
    if keep:
        names = [
            x.with_changes(comma=cst.MaybeSentinel.DEFAULT) if i == len(keep) - 1 else x
            for i, x in enumerate(keep)
        ]
        out.append(
            s.with_changes(
                body=[
                    imp.with_changes(
                        names=names,
                        rpar=imp.rpar
                        if isinstance(imp, cst.ImportFrom) and len(keep) > 1
                        else None,
                        lpar=imp.lpar
                        if isinstance(imp, cst.ImportFrom) and len(keep) > 1
                        else None,
                    )
                    if isinstance(imp, cst.ImportFrom)
                    else imp.with_changes(names=names)
                ]
            )
        )
    return out + binds


def _bound_to_value(a, s, name: str) -> bool:
    """`name` is also bound to a value in the import's scope (an import fallback)."""
    fn = a.function_of(s)
    return "<value>" in a.bindings.get(None if fn is None else id(fn), {}).get(name, [])


def _left(ctx: Context, kept: set[str]) -> set[str]:
    """apex names the rewritten script still reads: kept parts, parts with no rewrite."""
    a = ctx.a
    out: set[str] = set()
    for node in [*a.attributes, *a.findall(a.module, m.Name())]:
        par = a.parent.get(node)
        if (
            isinstance(par, cst.Attribute)
            and par.value is node
            or a.ancestor(node, cst.Import, cst.ImportFrom) is not None
        ):
            continue
        if (
            isinstance(node, cst.Name)
            and isinstance(par, cst.Attribute)
            and par.attr is node
        ):
            continue
        q = apex_q(a, node)
        if (
            q is None
            or (q.startswith("apex.amp") and q not in kept)
            or (q in NATIVE and q not in kept)
        ):
            continue
        if also_bound(a, node) and q in NATIVE:
            continue
        out.add(q)
    return out


def _fallback_try(a, s) -> cst.Try | None:
    """The try whose body holds s, when one of its handlers catches a failed import."""
    block = a.block(s)
    try_ = a.parent.get(block)
    if not isinstance(try_, cst.Try) or try_.body is not block:
        return None
    for h in try_.handlers:
        if h.type is None:
            return try_
        types = (
            [e.value for e in h.type.elements]
            if isinstance(h.type, cst.Tuple)
            else [h.type]
        )
        if any((dotted(t) or "").rsplit(".", 1)[-1] in CATCHES for t in types):
            return try_
    return None


def _collapse(ctx: Context, try_: cst.Try, plans) -> bool:
    """A try that can no longer fail (every import in it was apex's and is gone) becomes its body
    (and else block): its handlers are the fallback for an import that is not made any more."""
    a = ctx.a
    if try_.finalbody is not None or not ctx.editable(try_):
        return False
    out: list[cst.BaseStatement] = []
    for st in try_.body.body:
        if st in plans:
            new = plans[st]
            if any(
                isinstance(x, cst.SimpleStatementLine)
                and isinstance(x.body[0], (cst.Import, cst.ImportFrom))
                for x in new
            ):
                return False  # an import stays: the handler may still run
            out.extend(new)
            continue
        if a.findall(st, m.Import() | m.ImportFrom()) or _has_edits(ctx, st):
            return False
        out.append(st)
    if try_.orelse is not None:
        if _has_edits(ctx, try_.orelse):
            return False
        out.extend(try_.orelse.body.body)
    ctx.edits.removed.add(try_)
    if out:
        out = [
            x.with_changes(leading_lines=())
            if i
            else x.with_changes(leading_lines=try_.leading_lines)
            for i, x in enumerate(out)
        ]
        ctx.edits.before[try_].extend(out)
    return True


def _has_edits(ctx: Context, node: cst.CSTNode) -> bool:
    e = ctx.edits
    nodes = set(
        ctx.a.findall(
            node, m.Call() | m.Name() | m.Attribute() | m.SimpleStatementLine()
        )
    )
    return any(n in nodes for n in (*e.expr, *e.before, *e.after, *e.removed))


def _keep_spacing(ctx: Context) -> None:
    """A removed import's blank line (between import groups) moves to the next statement."""
    a = ctx.a
    body = list(a.module.body)
    for i, s in enumerate(body[:-1]):
        if s not in ctx.edits.removed or not s.leading_lines or s in ctx.edits.before:
            continue
        nxt = body[i + 1]
        if (
            nxt in ctx.edits.removed
            or nxt in ctx.edits.before
            or nxt.leading_lines
            or nxt in ctx.edits.expr
        ):
            continue
        ctx.edits.replace(
            nxt, lambda n, lead=s.leading_lines: n.with_changes(leading_lines=lead)
        )
