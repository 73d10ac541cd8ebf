"""Which expressions are provably the same on every rank: built only from literals, the
script's configuration, loop counters and other such values. Anything else (a loss, a
metric, a batch, a call of the script's own) may differ per rank, so a decision taken on it
must be shared. Fail-safe: what cannot be proved the same counts as per rank."""

from __future__ import annotations

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import code, dotted

# calls whose result is the same on every rank when their arguments are
PURE = {
    "len",
    "min",
    "max",
    "abs",
    "int",
    "float",
    "round",
    "str",
    "bool",
    "range",
    "sum",
    "any",
    "all",
    "isinstance",
    "math.isfinite",
    "math.isnan",
    "math.ceil",
    "math.floor",
    "math.sqrt",
    "math.log",
    "math.exp",
}
# the configuration: the same argv and files on every rank
CONFIG = {
    "parse_args",
    "parse_known_args",
    "load",
    "loads",
    "safe_load",
    "full_load",
    "open",
    "read",
    "read_text",
    "vars",
    "dict",
    "SimpleNamespace",
    "Path",
    "join",
    "getenv",
    "create",
    "to_container",
    "basicConfig",
}
PURE_METHODS = {
    "get",
    "keys",
    "values",
    "items",
    "startswith",
    "endswith",
    "lower",
    "upper",
    "format",
}
CONSTANTS = {"True", "False", "None"}
_DEPTH = 6


class RankInvariance:
    def __init__(self, a) -> None:
        self.a = a
        self._assigned: dict[int, dict[str, list[cst.BaseExpression | None]]] = {}
        self._self_attrs: (
            dict[str, list[tuple[cst.BaseExpression | None, cst.CSTNode]]] | None
        ) = None

    def same_on_every_rank(self, expr: cst.BaseExpression, where: cst.CSTNode) -> bool:
        return self._inv(expr, self.a.function_of(where), 0, set())

    # -- the proof ---------------------------------------------------------------------
    def _inv(self, e, scope, depth, seen) -> bool:
        if depth > _DEPTH:
            return False
        if isinstance(e, (cst.SimpleString, cst.ConcatenatedString)):
            return "RANK" not in code(e)  # os.environ["LOCAL_RANK"] differs per rank
        if isinstance(e, (cst.Integer, cst.Float, cst.Imaginary)):
            return True
        if isinstance(e, cst.FormattedString):
            return all(
                self._inv(p.expression, scope, depth, seen)
                for p in e.parts
                if isinstance(p, cst.FormattedStringExpression)
            )
        if isinstance(e, cst.Name):
            return self._name(e.value, scope, depth, seen)
        if isinstance(e, cst.Attribute):
            base = dotted(e.value)
            if base == "self":
                return self._self_attr(e.attr.value, depth, seen)
            return self._inv(e.value, scope, depth, seen)
        if isinstance(e, cst.Subscript):
            idx = [s.slice.value for s in e.slice if isinstance(s.slice, cst.Index)]
            return (
                len(idx) == len(e.slice)
                and self._inv(e.value, scope, depth, seen)
                and all(self._inv(i, scope, depth, seen) for i in idx)
            )
        if isinstance(e, (cst.BinaryOperation, cst.BooleanOperation)):
            return self._inv(e.left, scope, depth, seen) and self._inv(
                e.right, scope, depth, seen
            )
        if isinstance(e, cst.UnaryOperation):
            return self._inv(e.expression, scope, depth, seen)
        if isinstance(e, cst.Comparison):
            return self._inv(e.left, scope, depth, seen) and all(
                self._inv(c.comparator, scope, depth, seen) for c in e.comparisons
            )
        if isinstance(e, cst.IfExp):
            return all(
                self._inv(x, scope, depth, seen) for x in (e.test, e.body, e.orelse)
            )
        if isinstance(e, (cst.Tuple, cst.List, cst.Set)):
            return all(
                self._inv(x.value, scope, depth, seen)
                for x in e.elements
                if isinstance(x, (cst.Element, cst.StarredElement))
            )
        if isinstance(e, cst.Call):
            name = dotted(e.func) or ""
            args_ok = all(self._inv(arg.value, scope, depth, seen) for arg in e.args)
            if name in PURE and name not in self.a.functions:
                return args_ok
            if isinstance(e.func, cst.Attribute) and e.func.attr.value in PURE_METHODS:
                return args_ok and self._inv(e.func.value, scope, depth, seen)
            if name.rsplit(".", 1)[-1] in CONFIG and "RANK" not in code(e):
                return args_ok or name.rsplit(".", 1)[-1] in (
                    "parse_args",
                    "parse_known_args",
                )
            return False
        return False

    def _name(self, name, scope, depth, seen) -> bool:
        if name in CONSTANTS:
            return True
        key = (id(scope), name)
        if key in seen:
            return True  # a cycle (`n = n + 1`): decided by the other assignments
        seen = seen | {key}
        table = self._assignments(scope)
        if name in table:
            return all(
                v is not None and self._inv(v, scope, depth + 1, seen)
                for v in table[name]
            )
        if scope is not None and self._is_param(scope, name):
            return True  # the caller's configuration (a per-rank value passed in is a call's result, checked there)
        if scope is not None:
            return self._name(name, self.a.function_of(scope), depth + 1, seen)
        return name in self.a.bindings.get(None, {})  # a module constant or import

    def _is_param(self, fn: cst.FunctionDef, name: str) -> bool:
        p = fn.params
        return any(
            x.name.value == name
            for x in [*p.posonly_params, *p.params, *p.kwonly_params]
        )

    def _self_attr(self, attr, depth, seen) -> bool:
        if self._self_attrs is None:
            self._self_attrs = {}
            for node in self.a.findall(self.a.module, m.Assign()):
                for t in node.targets:
                    self._record_self(t.target, node.value, node)
            for node in self.a.findall(self.a.module, m.AugAssign()):
                self._record_self(node.target, node.value, node)
        key = (0, "self." + attr)
        if key in seen:
            return True
        found = self._self_attrs.get(attr)
        if not found:
            return False
        return all(
            v is not None
            and self._inv(v, self.a.function_of(n), depth + 1, seen | {key})
            for v, n in found
        )

    def _record_self(self, target, value, node) -> None:
        if isinstance(target, cst.Attribute) and dotted(target.value) == "self":
            self._self_attrs.setdefault(target.attr.value, []).append((value, node))
        elif isinstance(target, (cst.Tuple, cst.List)):
            for el in target.elements:
                self._record_self(el.value, None, node)  # unpacked: not followed

    def _assignments(self, scope) -> dict[str, list[cst.BaseExpression | None]]:
        """name -> the values bound to it in scope (None: bound by something not followed)."""
        got = self._assigned.get(id(scope))
        if got is not None:
            return got
        table: dict[str, list[cst.BaseExpression | None]] = {}
        root = scope if scope is not None else self.a.module

        def bind(target, value):
            if isinstance(target, cst.Name):
                table.setdefault(target.value, []).append(value)
            elif isinstance(target, (cst.Tuple, cst.List)):
                vals = (
                    value.elements
                    if isinstance(value, (cst.Tuple, cst.List))
                    and len(value.elements) == len(target.elements)
                    else None
                )
                for k, el in enumerate(target.elements):
                    bind(el.value, vals[k].value if vals else None)

        for node in self.a.findall(
            root,
            m.Assign()
            | m.AugAssign()
            | m.AnnAssign()
            | m.For()
            | m.WithItem()
            | m.NamedExpr(),
        ):
            if self.a.function_of(node) is not scope and node is not scope:
                continue
            if isinstance(node, cst.Assign):
                for t in node.targets:
                    bind(t.target, node.value)
            elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
                bind(node.target, node.value)
            elif isinstance(node, cst.NamedExpr):
                bind(node.target, node.value)
            elif isinstance(node, cst.For):
                self._bind_for(node, bind)
            elif isinstance(node, cst.WithItem) and node.asname is not None:
                bind(node.asname.name, node.item)
        self._assigned[id(scope)] = table
        return table

    def _bind_for(self, node: cst.For, bind) -> None:
        """`for i in range(n)`: i is n's; `for i, b in enumerate(x)`: i counts, b is x's item."""
        it, target = node.iter, node.target
        name = dotted(it.func) if isinstance(it, cst.Call) else None
        if name == "range":
            bind(target, it)
        elif (
            name == "enumerate"
            and isinstance(target, (cst.Tuple, cst.List))
            and len(target.elements) == 2
        ):
            bind(target.elements[0].value, cst.Integer("0"))
            bind(target.elements[1].value, None)
        else:
            bind(target, None)
