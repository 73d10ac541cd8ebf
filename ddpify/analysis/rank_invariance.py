"""Which expressions are provably the same on every rank: built only from literals, the
script's configuration, loop counters and other such values. Anything else (a loss, a
metric, a batch, a call of the script's own that reads one) may differ per rank, so a
decision taken on it must be shared. Fail-safe: what cannot be proved the same counts as per
rank.

A name is the same on every rank when every value bound to it is, and every statement that
binds it (or changes it in place: `history.append(x)`) runs as often on every rank: under
tests that are themselves the same everywhere (or that rank 0 decides for all), in loops
that run as many times everywhere (a range of such values, a loader ddpify sharded), with no
per-rank `continue` on the way, in a function whose every call does the same. So a step
counter moved once per iteration is the same everywhere, and so is an attribute of an
object of the program's own classes built from such values (a timer whose `done` property
compares its step count with the configured steps); a clock reading or a loss is not."""

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
# methods that change a container in place: their arguments become part of its value
MUTATORS = {
    "append",
    "extend",
    "insert",
    "update",
    "add",
    "setdefault",
    "pop",
    "popitem",
    "remove",
    "discard",
    "clear",
    "sort",
    "reverse",
    "appendleft",
    "extendleft",
}
CONSTANTS = {"True", "False", "None", "__name__"}
# wrappers a loop iterates through: as many items as what they wrap
SAME_LENGTH = {"enumerate", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "iter", "zip"}
PROPERTIES = {"property", "functools.cached_property", "cached_property"}
_DEPTH = 6
# how many calls a statement's count is followed through, and how many steps one proof may
# take (fail-safe: a proof that runs out counts as per rank)
_HOPS = 12
_FUEL = 4000
# a binding statement with no value to follow, only where it runs (`x.clear()`)
_NO_VALUE = cst.Name("None")


class RankInvariance:
    def __init__(
        self,
        a,
        shared: set[int] | None = None,
        training_loops: set[int] | frozenset[int] = frozenset(),
        sharded: list | tuple = (),
    ) -> None:
        self.a = a
        # ifs whose test rank 0 decides for every rank (decisions.py adds to it as it goes)
        self.shared = shared if shared is not None else set()
        # loops whose exits decisions.py shares (or finds the same everywhere)
        self.training_loops = training_loops
        # loaders ddpify sharded: as many batches on every rank
        self.sharded = list(sharded)
        self._assigned: dict[
            int, dict[str, list[tuple[cst.BaseExpression | None, cst.CSTNode]]]
        ] = {}
        self._self_attrs: (
            dict[str, list[tuple[cst.BaseExpression | None, cst.CSTNode]]] | None
        ) = None
        self._steady_ok: set[tuple] = (
            set()
        )  # statements known to run as often everywhere
        self._fuel = _FUEL

    def same_on_every_rank(self, expr: cst.BaseExpression, where: cst.CSTNode) -> bool:
        self._fuel = _FUEL
        return self._inv(expr, self.a.function_of(where), 0, set())

    # -- the proof ---------------------------------------------------------------------
    def _inv(self, e, scope, depth, seen) -> bool:
        self._fuel -= 1
        if depth > _DEPTH or self._fuel < 0:
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
            if self._inv(e.value, scope, depth, seen):
                return True
            # an object of a class of the program: what its class makes of that attribute
            cls = self._instance_class(e.value, scope, depth + 1, seen)
            return cls is not None and self._member(cls, e.attr.value, depth + 1, seen)
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
            if (
                name == "len"
                and len(e.args) == 1
                and self._sharded(e.args[0].value, scope)
            ):
                return True  # a sharded loader: as many batches on every rank
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
            if args_ok and isinstance(e.func, cst.Name) and name in self.a.functions:
                # a function of the program: what it returns from those arguments
                return self._returns_same(self.a.functions[name], depth + 1, seen)
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
            # a local's value is made within each call: only its own function's control matters
            return all(
                v is not None
                and self._inv(v, scope, depth + 1, seen)
                and self._steady(n, depth + 1, seen, local=scope is not None)
                for v, n in table[name]
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
            for node in self.a.findall(self.a.module, m.AugAssign() | m.AnnAssign()):
                if node.value is not None:
                    self._record_self(node.target, node.value, node)
        key = (0, "self." + attr)
        if key in seen:
            return True
        found = self._self_attrs.get(attr)
        if not found:
            return False
        seen = seen | {key}
        return all(
            v is not None
            and self._inv(v, self.a.function_of(n), depth + 1, seen)
            and self._steady(n, depth + 1, seen)
            for v, n in found
        )

    def _record_self(self, target, value, node) -> None:
        if isinstance(target, cst.Attribute) and dotted(target.value) == "self":
            self._self_attrs.setdefault(target.attr.value, []).append((value, node))
        elif isinstance(target, (cst.Tuple, cst.List)):
            for el in target.elements:
                self._record_self(el.value, None, node)  # unpacked: not followed

    # -- objects of the program's classes -----------------------------------------------
    def _instance_class(self, e, scope, depth, seen) -> cst.ClassDef | None:
        """The class of the program every value of e is built by, with arguments the same on
        every rank, where each binding runs as often everywhere (None otherwise)."""
        if depth > _DEPTH:
            return None
        if isinstance(e, cst.Name):
            values = self._values_of(e.value, scope)
        elif isinstance(e, cst.Attribute) and dotted(e.value) == "self":
            self._self_attr(e.attr.value, depth, seen)  # fills the table
            values = (self._self_attrs or {}).get(e.attr.value, [])
        else:
            return None
        found = None
        for v, n in values or []:
            if not isinstance(v, cst.Call):
                return None
            cls = self.a.classes.get((dotted(v.func) or "").rsplit(".", 1)[-1])
            if cls is None or found is not None and cls is not found:
                return None
            if not all(self._inv(arg.value, scope, depth + 1, seen) for arg in v.args):
                return None
            if not self._steady(n, depth + 1, seen, local=isinstance(e, cst.Name)):
                return None
            found = cls
        return found

    def _values_of(self, name: str, scope):
        """The bindings of name seen from scope (its own, else the enclosing scopes')."""
        while True:
            table = self._assignments(scope)
            if name in table:
                return table[name]
            if scope is None or self._is_param(scope, name):
                return None
            scope = self.a.function_of(scope)

    def _member(self, cls: cst.ClassDef, attr: str, depth, seen) -> bool:
        """obj.attr for an object of cls: a property's returned values, or what cls's methods
        assign to self.attr, or its class-level value."""
        for s in cls.body.body:
            if isinstance(s, cst.FunctionDef) and s.name.value == attr:
                props = {dotted(d.decorator) for d in s.decorators}
                return bool(props & PROPERTIES) and self._returns_same([s], depth, seen)
        if self._self_attr(attr, depth, seen):
            return True
        if (self._self_attrs or {}).get(attr):
            return False
        for s in cls.body.body:  # a class attribute, a dataclass field's default
            for small in (
                getattr(s, "body", ()) if isinstance(s, cst.SimpleStatementLine) else ()
            ):
                if isinstance(small, cst.Assign) and any(
                    dotted(t.target) == attr for t in small.targets
                ):
                    return self._inv(small.value, None, depth + 1, seen)
                if (
                    isinstance(small, cst.AnnAssign)
                    and dotted(small.target) == attr
                    and small.value is not None
                ):
                    return self._inv(small.value, None, depth + 1, seen)
        return False

    def _returns_same(self, fns, depth, seen) -> bool:
        """Every value the function returns is the same on every rank when its arguments are."""
        if depth > _DEPTH or len(fns) != 1:
            return False
        fn = fns[0]
        if self.a.findall(fn, m.Global() | m.Nonlocal() | m.Yield()) or (
            self.a.class_of(fn) is not None
            and self.a.function_of(fn) is None
            and not {dotted(d.decorator) for d in fn.decorators} & PROPERTIES
        ):
            return False
        returns = [
            r for r in self.a.findall(fn, m.Return()) if self.a.function_of(r) is fn
        ]
        return bool(returns) and all(
            r.value is not None and self._inv(r.value, fn, depth + 1, seen)
            for r in returns
        )

    # -- how often a statement runs ------------------------------------------------------
    def _steady(self, node, hops, seen, local: bool = False) -> bool:
        """node runs as often on every rank (local: within one call of its function); hops:
        the calls followed so far."""
        key = (id(node), local)
        if key in self._steady_ok or ("steady", key) in seen:
            return True  # known, or being proved (a loop's counter and its test)
        self._fuel -= 1
        if hops > _HOPS or self._fuel < 0:
            return False
        top = not any(isinstance(k, tuple) and k[0] == "steady" for k in seen)
        seen = seen | {("steady", key)}
        a = self.a
        fn = a.function_of(node)
        if not self._path_same(node, fn, fn, 0, seen):
            return False
        if fn is not None and not local:
            # as often as each call of its function, and nothing else runs it (a callback,
            # a Dataset's methods in loader workers, forward through model(x))
            calls = a.callers(fn)
            implicit = (
                fn.decorators
                or fn.name.value.startswith("__")
                and fn.name.value != "__init__"
                or fn.name.value == "forward"
            )
            if (
                a.runs_per_item(node)
                or not calls
                and implicit
                or not all(self._steady(c, hops + 1, seen) for c in calls)
            ):
                return False
        if top:  # a whole proof: the statements it assumed on the way were proved too
            self._steady_ok.add(key)
        return True

    def _path_same(self, node, stop, fn, depth, seen) -> bool:
        """Every test, loop and handler between node and stop (its function, or a loop) lets
        node run as often on every rank."""
        a = self.a
        child, cur = node, a.parent.get(node)
        while cur is not None and cur is not stop:
            if isinstance(cur, (cst.FunctionDef, cst.ClassDef)):
                break
            if isinstance(cur, cst.If):
                if child is not cur.test and not self._decided(cur, fn, depth, seen):
                    return False
            elif isinstance(cur, cst.IfExp):
                if child is not cur.test and not self._inv(
                    cur.test, fn, depth + 1, seen
                ):
                    return False
            elif isinstance(cur, cst.BooleanOperation):
                if child is cur.right and not self._inv(cur.left, fn, depth + 1, seen):
                    return False
            elif isinstance(cur, cst.While):
                if child is not cur.test and not (
                    self._inv(cur.test, fn, depth + 1, seen)
                    and self._exits_same(cur, fn, depth, seen)
                ):
                    return False
            elif isinstance(cur, cst.For):
                if child is not cur.iter and not (
                    self._same_length(cur.iter, fn, depth, seen)
                    and self._exits_same(cur, fn, depth, seen)
                ):
                    return False
            elif isinstance(
                cur,
                (
                    cst.ExceptHandler,
                    cst.Lambda,
                    cst.ListComp,
                    cst.SetComp,
                    cst.DictComp,
                    cst.GeneratorExp,
                ),
            ):
                return False  # runs when something failed, or once per item
            child, cur = cur, a.parent.get(cur)
        return True

    def _decided(self, if_: cst.If, fn, depth, seen) -> bool:
        return id(if_) in self.shared or self._inv(if_.test, fn, depth + 1, seen)

    def _exits_same(self, loop, fn, depth, seen) -> bool:
        """Every way out of a pass of the loop is taken alike on every rank: a break or return
        of a training loop is shared (decisions.py); any other, and every continue, must sit
        under tests that are the same everywhere."""
        a = self.a
        for x in a.findall(loop, m.Break() | m.Continue() | m.Return()):
            if a.function_of(x) is not fn:
                continue
            if not isinstance(x, cst.Return) and a.enclosing_loop(x) is not loop:
                continue  # leaves a loop inside this one
            if not isinstance(x, cst.Continue) and id(loop) in self.training_loops:
                continue
            if not self._path_same(x, loop, fn, depth + 1, seen):
                return False
        return True

    def _same_length(self, it, fn, depth, seen) -> bool:
        """The loop over it runs as many passes on every rank."""
        while (
            isinstance(it, cst.Call)
            and (dotted(it.func) or "") in SAME_LENGTH
            and it.args
            and (dotted(it.func) != "zip" or len(it.args) == 1)
        ):
            it = it.args[0].value
        return self._sharded(it, fn) or self._inv(it, fn, depth + 1, seen)

    def _sharded(self, e, scope) -> bool:
        """e is a loader ddpify sharded (a DistributedSampler pads: as many batches on every
        rank), read where it was bound."""
        name = dotted(e)
        if not name:
            return False
        for ld in self.sharded:
            if ld.target != name:
                continue
            home = self.a.function_of(ld.stmt)
            if name.startswith("self.") or home is scope or home is None:
                return True
        return False

    # -- bindings -------------------------------------------------------------------------
    def _assignments(
        self, scope
    ) -> dict[str, list[tuple[cst.BaseExpression | None, cst.CSTNode]]]:
        """name -> (a value bound to it in scope, the statement that binds it); None: bound by
        something not followed. A container changed in place binds what it is handed."""
        got = self._assigned.get(id(scope))
        if got is not None:
            return got
        table: dict[str, list[tuple[cst.BaseExpression | None, cst.CSTNode]]] = {}
        a = self.a
        root = scope if scope is not None else a.module

        def bind(target, value, node):
            if isinstance(target, cst.Name):
                table.setdefault(target.value, []).append((value, node))
            elif isinstance(target, (cst.Tuple, cst.List)):
                vals = (
                    value.elements
                    if isinstance(value, (cst.Tuple, cst.List))
                    and len(value.elements) == len(target.elements)
                    else None
                )
                for k, el in enumerate(target.elements):
                    bind(el.value, vals[k].value if vals else None, node)
            elif isinstance(target, cst.Subscript) and isinstance(
                target.value, cst.Name
            ):
                # x[i] = v: x now holds v
                bind(target.value, value, node)
                for s in target.slice:
                    if isinstance(s.slice, cst.Index):
                        bind(target.value, s.slice.value, node)
            elif (
                isinstance(target, cst.Attribute)
                and isinstance(target.value, cst.Name)
                and target.value.value != "self"
            ):
                bind(target.value, value, node)  # cfg.stop = ...: cfg now holds it

        # `global x` in a function: its bindings of x are the module's
        globals_: dict[int, set[str]] = {}
        for g in a.findall(a.module, m.Global()):
            f = a.function_of(g)
            if f is not None:
                globals_.setdefault(id(f), set()).update(n.name.value for n in g.names)

        for node in a.findall(
            a.module if scope is None else root,
            m.Assign()
            | m.AugAssign()
            | m.AnnAssign()
            | m.For()
            | m.WithItem()
            | m.NamedExpr()
            | m.Call(func=m.Attribute()),
        ):
            f = a.function_of(node)
            declared = globals_.get(id(f), set()) if f is not None else set()
            if scope is None:
                if f is not None and not declared:
                    continue
            elif f is not scope and node is not scope:
                continue

            def bind_here(target, value, node=node, declared=declared, f=f):
                if scope is None and f is not None:
                    # a function's `global` names only
                    if not (isinstance(target, cst.Name) and target.value in declared):
                        return
                elif isinstance(target, cst.Name) and target.value in declared:
                    return  # the module's, not this function's
                bind(target, value, node)

            if isinstance(node, cst.Assign):
                for t in node.targets:
                    bind_here(t.target, node.value)
            elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
                bind_here(node.target, node.value)
            elif isinstance(node, cst.NamedExpr):
                bind_here(node.target, node.value)
            elif isinstance(node, cst.For):
                self._bind_for(node, bind_here)
            elif isinstance(node, cst.WithItem) and node.asname is not None:
                bind_here(node.asname.name, node.item)
            elif (
                isinstance(node, cst.Call)
                and node.func.attr.value in MUTATORS
                and isinstance(node.func.value, cst.Name)
            ):
                target = node.func.value
                if not node.args:
                    bind_here(target, _NO_VALUE)
                for arg in node.args:
                    bind_here(target, arg.value)
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
