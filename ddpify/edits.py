"""Edits planned against the original tree, applied in one LibCST pass.

Every concern plans its changes on the original (analysed) nodes; the Applier then walks
the tree once. Expression edits compose bottom-up, statement edits (insert, guard, wrap,
remove) are applied where the statement's block is rebuilt, so concerns never see each
other's intermediate trees and never re-derive the analysis.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Sequence

import libcst as cst

from ddpify.analysis import child_fields

ExprFn = Callable[[cst.CSTNode], cst.CSTNode]
_RANK0 = cst.parse_expression("RANK == 0")  # nodes are immutable: one is enough


class Edits:
    def __init__(self) -> None:
        self.expr: dict[cst.CSTNode, list[ExprFn]] = defaultdict(list)
        self.before: dict[cst.BaseStatement, list[cst.BaseStatement]] = defaultdict(
            list
        )
        self.after: dict[cst.BaseStatement, list[cst.BaseStatement]] = defaultdict(list)
        self.prepend: dict[cst.CSTNode, list[cst.BaseStatement]] = defaultdict(list)
        self.append: dict[cst.CSTNode, list[cst.BaseStatement]] = defaultdict(list)
        self.removed: set[cst.BaseStatement] = set()
        self.guarded: set[cst.BaseStatement] = set()
        # (first, last, header): wrap first..last (same block) in `with header:`
        self.wraps: list[
            tuple[cst.BaseStatement, cst.BaseStatement, cst.BaseExpression]
        ] = []
        self.guard_test: cst.BaseExpression = _RANK0
        # child -> parent in the analysed tree, when known: the Applier then enters only the
        # subtrees that hold an edit
        self.parent: dict[cst.CSTNode, cst.CSTNode] | None = None

    def replace(self, node: cst.CSTNode, fn: ExprFn | cst.CSTNode) -> None:
        self.expr[node].append(fn if callable(fn) else (lambda _n, new=fn: new))

    def clear(self) -> None:
        """Drop the plan: its functions close over the Context, a cycle that would keep the whole
        tree for the garbage collector, not reference counting, to free."""
        for plan in (
            self.expr,
            self.before,
            self.after,
            self.prepend,
            self.append,
            self.removed,
            self.guarded,
            self.wraps,
        ):
            plan.clear()

    def is_empty(self) -> bool:
        return not (
            self.expr
            or self.before
            or self.after
            or self.prepend
            or self.append
            or self.removed
            or self.guarded
            or self.wraps
        )


def _leading(stmt: cst.BaseStatement) -> Sequence[cst.EmptyLine]:
    return getattr(stmt, "leading_lines", ())


def _with_leading(
    stmt: cst.BaseStatement, lines: Sequence[cst.EmptyLine]
) -> cst.BaseStatement:
    if hasattr(stmt, "leading_lines"):
        return stmt.with_changes(leading_lines=tuple(lines))
    return stmt


class Applier(cst.CSTTransformer):
    def __init__(self, edits: Edits) -> None:
        super().__init__()
        self.e = edits
        self.dirty = _dirty(edits)

    def on_visit(self, node):  # type: ignore[override]
        # an untouched subtree is kept as it is (LibCST would rebuild it node by node)
        return self.dirty is None or node in self.dirty

    def apply(self, module: cst.Module) -> cst.Module:
        """module.visit(self), the same tree, without LibCST's visitor machinery on the way
        down to the edits."""
        if self.dirty is None:
            return module.visit(self)  # type: ignore[return-value]
        return self._visit(module)  # type: ignore[return-value]

    def _visit(self, node: cst.CSTNode) -> cst.CSTNode:
        # what node.visit(self) does: children rebuilt in LibCST's order, sequences as tuples,
        # a block's statement dropped where it became removable (visit_body_sequence)
        if node not in self.dirty:  # type: ignore[operator]
            return node  # on_leave would give it back as it is: no edit in or on it
        changes = {}
        for name in child_fields(node):
            value = getattr(node, name)
            if value is None or value.__class__ is cst.MaybeSentinel:
                continue
            if value.__class__ is tuple or value.__class__ is list:
                new = [self._visit(child) for child in value]
                if name == "body" and isinstance(node, (cst.Module, cst.IndentedBlock)):
                    new = [
                        n
                        for o, n in zip(value, new)
                        if o._is_removable() or not n._is_removable()
                    ]
                changes[name] = tuple(new)
            else:
                changes[name] = self._visit(value)
        return self.on_leave(node, node.with_changes(**changes))

    # -- expressions -----------------------------------------------------------------
    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        updated = super().on_leave(original_node, updated_node)
        fns = self.e.expr.get(original_node)
        if fns and isinstance(updated, cst.CSTNode):
            for fn in fns:
                updated = fn(updated)
        if isinstance(updated, cst.CSTNode) and (
            original_node in self.e.prepend or original_node in self.e.append
        ):
            updated = self._extend_body(original_node, updated)
        return updated

    def _extend_body(self, original, updated):
        body = updated.body
        if not isinstance(body, cst.IndentedBlock):
            return updated
        stmts = list(body.body)
        head = list(self.e.prepend.get(original, ()))
        tail = list(self.e.append.get(original, ()))
        if head:
            at = (
                1
                if isinstance(original, (cst.FunctionDef, cst.ClassDef))
                and _is_docstring(stmts[0])
                else 0
            )
            # keep the block's first comments above the inserted lines
            if stmts and at < len(stmts) and _leading(stmts[at]):
                head[0] = _with_leading(head[0], _leading(stmts[at]))
                stmts[at] = _with_leading(stmts[at], ())
            stmts[at:at] = head
        stmts.extend(tail)
        return updated.with_changes(body=body.with_changes(body=stmts))

    # -- statement lists -------------------------------------------------------------
    def leave_IndentedBlock(self, original_node, updated_node):
        if self.dirty is not None and original_node not in self.dirty:
            return updated_node  # no statement of it has an edit
        body = self._rebuild(original_node.body, updated_node.body)
        if not body:
            body = [cst.SimpleStatementLine([cst.Pass()])]
        elif original_node.body and not _leading(original_node.body[0]):
            # a removed first statement leaves no blank line at the top of the block
            lead = list(_leading(body[0]))
            while lead and lead[0].comment is None:
                lead.pop(0)
            body = [_with_leading(body[0], lead), *body[1:]]
        return updated_node.with_changes(body=body)

    def leave_Module(self, original_node, updated_node):
        return updated_node.with_changes(
            body=self._rebuild(original_node.body, updated_node.body)
        )

    def _rebuild(self, originals, updateds) -> list[cst.BaseStatement]:
        e = self.e
        # units: [first_orig, last_orig, [stmts]]
        units: list[list] = []
        for orig, upd in zip(originals, updateds):
            if orig in e.removed or _emptied_if(orig, e.removed):
                units.append([orig, orig, []])
            else:
                units.append([orig, orig, [upd]])
        index = {id(u[0]): i for i, u in enumerate(units)}
        # wraps, innermost (shortest) first
        spans = []
        for first, last, header in e.wraps:
            if id(first) in index and id(last) in index:
                spans.append((index[id(last)] - index[id(first)], first, last, header))
        for _, first, last, header in sorted(spans, key=lambda s: s[0]):
            i = next(
                k
                for k, u in enumerate(units)
                if u[0] is first or _contains(u, first, originals)
            )
            j = next(
                k
                for k, u in enumerate(units)
                if u[1] is last or _contains(u, last, originals)
            )
            inner = [s for u in units[i : j + 1] for s in u[2]]
            if not inner:
                continue
            lead = _leading(inner[0])
            inner[0] = _with_leading(inner[0], ())
            w = cst.With(
                items=[cst.WithItem(header)],
                body=cst.IndentedBlock(body=inner),
                leading_lines=tuple(lead),
            )
            merged = [units[i][0], units[j][1], [w]]
            merged.append([u[0] for u in units[i : j + 1]])
            units[i : j + 1] = [merged]
        out: list[cst.BaseStatement] = []
        pending_guard: list[cst.BaseStatement] = []

        def flush() -> None:
            if not pending_guard:
                return
            lead = _leading(pending_guard[0])
            pending_guard[0] = _with_leading(pending_guard[0], ())
            out.append(
                cst.If(
                    test=e.guard_test,
                    body=cst.IndentedBlock(body=list(pending_guard)),
                    leading_lines=tuple(lead),
                )
            )
            pending_guard.clear()

        for u in units:
            first, last, stmts = u[0], u[1], u[2]
            before = list(e.before.get(first, ()))
            after = list(e.after.get(last, ()))
            if before:
                flush()
                if stmts and _leading(stmts[0]):
                    # the statement's blank lines go first; a comment of the inserted one stays on it
                    before[0] = _with_leading(
                        before[0], [*_leading(stmts[0]), *_leading(before[0])]
                    )
                    stmts = [_with_leading(stmts[0], ())] + stmts[1:]
                out.extend(before)
            if first is last and first in e.guarded and stmts:
                pending_guard.extend(stmts)
            else:
                flush()
                out.extend(stmts)
            if after:
                flush()
                out.extend(after)
        flush()
        return out


def _dirty(e: Edits) -> set[cst.CSTNode] | None:
    """Nodes holding an edit, or a statement with one in their block, and all their ancestors;
    None (visit everything) where an edit's node has no known place in the tree."""
    parent = e.parent
    if parent is None:
        return None
    dirty: set[cst.CSTNode] = set()
    keys = [*e.expr, *e.prepend, *e.append, *e.before, *e.after, *e.removed, *e.guarded]
    keys += [n for first, last, _ in e.wraps for n in (first, last)]
    for node in keys:
        if node not in parent and not isinstance(node, cst.Module):
            return (
                None  # built by a transform, or not walked by the analysis (whitespace)
            )
    for node in keys[: len(e.expr) + len(e.prepend) + len(e.append)]:
        while node is not None and node not in dirty:
            dirty.add(node)
            node = parent.get(node)
    # a statement's own edits (before, after, removed, guarded, wrapped) are made by its block
    for stmt in keys[len(e.expr) + len(e.prepend) + len(e.append) :]:
        node = parent.get(stmt)
        while node is not None and node not in dirty:
            dirty.add(node)
            node = parent.get(node)
    return dirty


def _contains(unit, node, originals) -> bool:
    members = unit[3] if len(unit) > 3 else [unit[0]]
    return any(m is node for m in members)


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _emptied_if(stmt, removed) -> bool:
    # An `if` whose whole body was removed (e.g. the DataParallel branch) goes too.
    return (
        isinstance(stmt, cst.If)
        and stmt.orelse is None
        and isinstance(stmt.body, cst.IndentedBlock)
        and all(s in removed for s in stmt.body.body)
    )
