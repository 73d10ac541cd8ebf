"""The one collecting walk over the tree (LibCST's visit is not used: it rebuilds every node):
parents, children, pre-order numbers, nodes by type, name bindings per scope, the lists of
calls, functions, loops, assignments, ... that the other questions start from; and findall
over that index (a subtree's nodes of a type are a slice of the type's pre-order list).
"""

from __future__ import annotations

from bisect import bisect_left

import libcst as cst
import ddpify.match as m
from ddpify.analysis.tree import (
    _FIELDS,
    _SCOPE_TYPES,
    _flatten_targets,
    _leaf_types,
    _walk_fields,
    codegen,
)


class WalkMixin:
    def _collect(self) -> None:
        """One pre-order walk over the fields (LibCST's visit rebuilds every node on the way, a
        CSTVisitor costs about a parse): parents, children, pre-order numbers, nodes by type,
        name bindings per scope, and the calls, functions, loops, ... concerns ask about.
        Whitespace and comments are not entered: they have no parent, number or type entry."""
        a = self
        parent = self.parent
        kids = self.kids
        order = self._order
        bytype = self._bytype
        bindings = self.bindings
        scopes: list[int | None] = [None]
        declared: list[set[str]] = [set()]  # global / nonlocal names per scope

        def bind(name: str, what: str) -> None:
            if name in declared[-1]:
                return  # `global x`: not a local of this scope
            bindings.setdefault(scopes[-1], {}).setdefault(name, []).append(what)

        def bind_target(target: cst.CSTNode) -> None:
            for el in _flatten_targets(target):  # type: ignore[arg-type]
                if isinstance(el, cst.StarredElement):
                    el = el.value
                if isinstance(el, cst.Name):
                    bind(el.value, "<value>")

        def declare(node) -> None:
            declared[-1].update(n.name.value for n in node.names)

        def import_(node) -> None:
            for alias in node.names:
                full = alias.evaluated_name
                if alias.asname is not None:
                    bind(alias.evaluated_alias, full)
                else:  # `import torch.nn` binds `torch`
                    head = full.split(".")[0]
                    bind(head, head)

        def import_from(node) -> None:
            if isinstance(node.names, cst.ImportStar):
                return
            mod = "." * len(node.relative) + (
                codegen(node.module) if node.module is not None else ""
            )
            for alias in node.names:
                full = (
                    f"{mod}.{alias.evaluated_name}"
                    if mod and not mod.endswith(".")
                    else f"{mod}{alias.evaluated_name}"
                )
                bind(alias.evaluated_alias or alias.evaluated_name, full)

        def for_(node) -> None:
            a.fors.append(node)
            bind_target(node.target)

        def assign(node) -> None:
            a.assigns.append(node)
            for t in node.targets:
                bind_target(t.target)

        def ann_assign(node) -> None:
            a.assigns.append(node)
            bind_target(node.target)

        def with_item(node) -> None:
            if node.asname is not None:
                bind_target(node.asname.name)

        def except_handler(node) -> None:
            if node.name is not None:
                bind_target(node.name.name)

        # what CSTVisitor's visit_<Type> methods did, by exact type
        handlers = {
            cst.Param: lambda n: bind(n.name.value, "<value>"),
            cst.Global: declare,
            cst.Nonlocal: declare,
            cst.Import: import_,
            cst.ImportFrom: import_from,
            cst.AugAssign: lambda n: bind_target(n.target),
            cst.CompFor: lambda n: bind_target(n.target),
            cst.WithItem: with_item,
            cst.ExceptHandler: except_handler,
            cst.NamedExpr: lambda n: bind_target(n.target),
            cst.Call: a.calls.append,
            cst.FunctionDef: lambda n: a.functions.setdefault(n.name.value, []).append(
                n
            ),
            cst.ClassDef: lambda n: a.classes.__setitem__(n.name.value, n),
            cst.For: for_,
            cst.While: a.whiles.append,
            cst.Assign: assign,
            cst.AnnAssign: ann_assign,
            cst.Attribute: a.attributes.append,
            cst.With: a.withs.append,
            cst.If: a.ifs.append,
        }
        sentinel = cst.MaybeSentinel
        # type -> (child fields, None where they depend on the node; handler; opens a scope;
        # bytype list): one lookup per node
        info: dict[type, tuple] = {}
        stack: list[cst.CSTNode | None] = [
            self.module
        ]  # None: leave the innermost scope
        n = 0
        while stack:
            node = stack.pop()
            if node is None:
                scopes.pop()
                declared.pop()
                continue
            t = type(node)
            ti = info.get(t)
            if ti is None:
                names = _walk_fields(node)
                ti = info[t] = (
                    None if _FIELDS[t][1] else names,
                    handlers.get(t),
                    t in _SCOPE_TYPES,
                    bytype.setdefault(t, []),
                )
            names, h, opens_scope, same = ti
            i = id(node)
            order[i] = n
            n += 1
            same.append(node)
            if opens_scope:
                if t is cst.FunctionDef or t is cst.ClassDef:
                    bind(node.name.value, "<value>")  # in the enclosing scope
                scopes.append(i)
                declared.append(set())
                bindings.setdefault(i, {})
                stack.append(None)
            if h is not None:
                h(node)
            if names is None:
                names = _walk_fields(node)
            children: list[cst.CSTNode] = []
            for f in names:
                v = getattr(node, f)
                if v is None or v.__class__ is sentinel:
                    continue
                if v.__class__ is tuple or v.__class__ is list:
                    children.extend(v)
                else:
                    children.append(v)
            if children:
                kids[i] = children
                for c in children:
                    parent[c] = node
                stack.extend(reversed(children))

    def findall(self, node: cst.CSTNode, matcher) -> list[cst.CSTNode]:
        """m.findall over the analysed tree without a LibCST visit: a subtree is a run of
        pre-order numbers, so its nodes of a type are a slice of that type's pre-order list."""
        start = self._order.get(id(node))
        if start is None:
            return m.findall(node, matcher)  # a node built by a transform
        options = matcher.options if isinstance(matcher, m.OneOf) else (matcher,)
        end = self._subtree_end(node)
        out: list[cst.CSTNode] = []
        for opt in options:
            orders, nodes = self._of_type(opt.cls)
            lo = bisect_left(orders, start)
            found = nodes[lo : bisect_left(orders, end, lo)]
            out.extend(
                found if m.bare(opt) else [n for n in found if m.matches(n, opt)]
            )
        if len(options) > 1:  # back to tree order
            out.sort(key=lambda n: self._order[id(n)])
        return out

    def _subtree_end(self, node: cst.CSTNode) -> int:
        """Pre-order number just past node's subtree (its last descendant is a last child's last child ...)."""
        kids = self.kids
        cur = node
        while True:
            last = kids.get(id(cur))
            if not last:
                return self._order[id(cur)] + 1
            cur = last[-1]

    def _of_type(self, cls: type) -> tuple[list[int], list[cst.CSTNode]]:
        """Pre-order numbers and nodes of the analysed nodes that are instances of cls."""
        found = self._index.get(cls)
        if found is None:
            order = self._order
            if _leaf_types(
                (cls,)
            ):  # the usual m.Call(), m.Name(), ...: one list, no issubclass scan
                lists = [self._bytype[cls]] if cls in self._bytype else []
            else:
                lists = [v for t, v in self._bytype.items() if issubclass(t, cls)]
            nodes = (
                lists[0]
                if len(lists) == 1
                else sorted((n for v in lists for n in v), key=lambda n: order[id(n)])
            )
            found = self._index[cls] = ([order[id(n)] for n in nodes], nodes)
        return found
