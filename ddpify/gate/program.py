"""The converted program as the gate reads it: Python's own ast over the output text, with the
few questions every invariant asks (what a name holds, who calls a function, which statements
lead to a backward). It shares no code with the planners' analysis, so a shape that fooled a
planner is read afresh here.

Values are followed by their origins: the expressions a name, attribute or call may hold
(assignments in the scope and at module level, `self.x` anywhere in the class, the arguments a
parameter is called with, what a function of the program returns, tuple and dict elements,
placement calls such as `.to(device)`). An origin that cannot be followed is the expression
itself; each invariant decides what an unknown origin means for it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ddpify.parsed import parse

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# methods that hand back the object they are called on (a module moved, a loader wrapped)
SAME_OBJECT = frozenset(
    {
        "to",
        "cuda",
        "cpu",
        "float",
        "half",
        "double",
        "bfloat16",
        "train",
        "eval",
        "requires_grad_",
        "share_memory",
        "to_empty",
        "apply",
    }
)
MAX_DEPTH = 8
_SCOPE_TYPES = frozenset(SCOPES)
_FUNCTION_TYPES = frozenset(FUNCTIONS)
_FIELDS: dict[type, tuple[str, ...]] = {}
# the node types the index records (besides names and calls)
_INDEXED = frozenset(
    {
        ast.FunctionDef,
        ast.AsyncFunctionDef,
        ast.ClassDef,
        ast.Assign,
        ast.AnnAssign,
        ast.NamedExpr,
        ast.Import,
        ast.ImportFrom,
        ast.withitem,
        ast.Return,
        ast.Yield,
        ast.YieldFrom,
        ast.For,
        ast.comprehension,
    }
)


def _fields(kind: type) -> tuple[str, ...]:
    """The fields of a node type that may hold nodes (not `ctx`, the Load/Store mark)."""
    got = _FIELDS.get(kind)
    if got is None:
        got = _FIELDS[kind] = tuple(f for f in kind._fields if f != "ctx")
    return got


@dataclass(frozen=True)
class Origin:
    """Where a value comes from: a node of the program, and the attribute path read off it
    (`model.backbone` built as Net(): the Net() call, ("backbone",))."""

    node: ast.AST
    path: tuple[str, ...] = ()


@dataclass
class Program:
    """The output read once: one breadth-first pass (ast.walk's order, which the answers keep)
    indexes parents, scopes, bindings, calls by name, returns, loop targets and name reads, and
    every question is answered from that index instead of walking the tree again."""

    text: str
    tree: ast.Module = field(init=False)
    parent: dict[ast.AST, ast.AST] = field(init=False, default_factory=dict)
    functions: dict[str, list[ast.FunctionDef]] = field(
        init=False, default_factory=dict
    )
    classes: dict[str, list[ast.ClassDef]] = field(init=False, default_factory=dict)
    calls: list[ast.Call] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.tree = tree = parse(self.text)
        self._assigned: dict[
            tuple[int, str], list[tuple[ast.AST, tuple[int | str, ...]]]
        ] = {}
        self._attrs: dict[
            tuple[int, str], list[ast.AST]
        ] = {}  # (class, attr) -> values of self.attr
        self._imports: dict[
            tuple[int, str], str
        ] = {}  # (scope, name) -> qualified name
        self._trains: dict[int, bool] = {}
        # the index: each node's scope, function and class; calls by the name they call;
        # each function's returns and yields; names a loop binds in each function; name reads
        self._scope: dict[ast.AST, ast.AST] = {tree: tree}
        self._fn: dict[ast.AST, ast.AST | None] = {tree: None}
        self._cls: dict[ast.AST, ast.ClassDef | None] = {tree: None}
        self._by_last: dict[str, list[ast.Call]] = {}
        self._returns_of: dict[int, list[ast.Return]] = {}
        self._yields: set[int] = set()  # functions that yield
        self._loop_names: set[tuple[int, str]] = set()  # (function, name) a for binds
        self._loads: dict[str, list[ast.Name]] = {}
        self._attr_loads: dict[str, list[ast.Attribute]] = {}
        self._memo: dict[tuple, object] = {}
        self._walks: dict[ast.AST, list[ast.AST]] = {}
        self._kids: dict[
            ast.AST, list[ast.AST]
        ] = {}  # a node's children, in field order
        parent, scope_of, fn_of, cls_of = self.parent, self._scope, self._fn, self._cls
        kids = self._kids
        order: list[ast.AST] = [tree]
        AST = ast.AST
        i = 0
        while i < len(
            order
        ):  # ast.walk's breadth-first order (less the Load/Store marks)
            node = order[i]
            i += 1
            kind = type(node)
            sc = node if kind in _SCOPE_TYPES else scope_of[node]
            fn = node if kind in _FUNCTION_TYPES else fn_of[node]
            cl = node if kind is ast.ClassDef else cls_of[node]
            here: list[ast.AST] = []
            for name in _fields(kind):
                value = getattr(node, name, None)
                if type(value) is list:
                    here += [c for c in value if isinstance(c, AST)]
                elif isinstance(value, AST):
                    here.append(value)
            if here:
                kids[node] = here
                order += here
                for child in here:
                    parent[child] = node
                    scope_of[child] = sc
                    fn_of[child] = fn
                    cls_of[child] = cl
        self._walks[tree] = order
        for node in order:
            kind = type(node)
            if kind is ast.Name:
                if type(node.ctx) is ast.Load:
                    self._loads.setdefault(node.id, []).append(node)
            elif kind is ast.Call:
                self.calls.append(node)
                self._by_last.setdefault(self.last(node), []).append(node)
            elif kind is ast.Attribute:
                if type(node.ctx) is ast.Load:
                    self._attr_loads.setdefault(node.attr, []).append(node)
                continue
            elif kind not in _INDEXED:
                continue
            elif kind is ast.FunctionDef or kind is ast.AsyncFunctionDef:
                self.functions.setdefault(node.name, []).append(node)  # type: ignore[arg-type]
            elif kind is ast.ClassDef:
                self.classes.setdefault(node.name, []).append(node)
            elif kind is ast.Assign or kind is ast.AnnAssign:
                if node.value is not None:
                    targets = node.targets if kind is ast.Assign else [node.target]
                    for t in targets:
                        self._bind(t, node.value, (), node)
            elif kind is ast.NamedExpr:
                self._bind(node.target, node.value, (), node)
            elif kind is ast.Import or kind is ast.ImportFrom:
                scope = id(scope_of[node])
                for alias in node.names:
                    if kind is ast.Import:
                        name = alias.asname or alias.name.split(".")[0]
                        full = alias.name if alias.asname else alias.name.split(".")[0]
                    else:
                        name = alias.asname or alias.name
                        full = f"{node.module or ''}.{alias.name}".lstrip(".")
                    self._imports[(scope, name)] = full
            elif kind is ast.withitem:
                if node.optional_vars is not None:
                    self._bind(node.optional_vars, node.context_expr, (), parent[node])
            elif kind is ast.Return:
                if node.value is not None and fn_of[node] is not None:
                    self._returns_of.setdefault(id(fn_of[node]), []).append(node)
            elif kind is ast.Yield or kind is ast.YieldFrom:
                if fn_of[node] is not None:
                    self._yields.add(id(fn_of[node]))
            elif kind is ast.For or kind is ast.comprehension:
                # a loop target binds its names in every function around the loop
                names = {t.id for t in ast.walk(node.target) if isinstance(t, ast.Name)}
                f = fn_of[node]
                while f is not None:
                    self._loop_names.update((id(f), n) for n in names)
                    f = fn_of[f]

    def _bind(
        self, target: ast.AST, value: ast.AST, index: tuple[int | str, ...], at: ast.AST
    ) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for i, el in enumerate(target.elts):
                if isinstance(el, ast.Starred):
                    return
                self._bind(el, value, index + (i,), at)
        elif isinstance(target, ast.Name):
            self._assigned.setdefault((id(self.scope(target)), target.id), []).append(
                (value, index, at)
            )
        elif (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
        ):
            cls = self.class_of(target)
            if cls is not None:
                self._attrs.setdefault((id(cls), target.attr), []).append(
                    _indexed(value, index)
                )

    # -- structure -------------------------------------------------------------------------------
    def walk(self, node: ast.AST) -> list[ast.AST]:
        """ast.walk(node) as a list (less the Load/Store marks), made once per node asked
        about."""
        got = self._walks.get(node)
        if got is None:
            if node not in self._kids and node not in self.parent:
                return list(ast.walk(node))  # not a node of the program
            got = self._walks[node] = [node]
            kids = self._kids
            for n in got:  # breadth-first: the list grows as it is read
                more = kids.get(n)
                if more:
                    got += more
        return got

    def calls_in(self, node: ast.AST) -> list[ast.Call]:
        """The calls of ast.walk(node), in its order."""
        key = ("calls_in", id(node))
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = [
                n for n in self.walk(node) if isinstance(n, ast.Call)
            ]
        return got  # type: ignore[return-value]

    def scope(self, node: ast.AST) -> ast.AST:
        return self._scope.get(node, self.tree)

    def function_of(self, node: ast.AST) -> ast.FunctionDef | None:
        return self._fn.get(node)  # type: ignore[return-value]

    def class_of(self, node: ast.AST) -> ast.ClassDef | None:
        return self._cls.get(node)

    def ancestors(self, node: ast.AST):
        cur = self.parent.get(node)
        while cur is not None:
            yield cur
            cur = self.parent.get(cur)

    def inside(self, node: ast.AST, container: ast.AST) -> bool:
        return node is container or any(a is container for a in self.ancestors(node))

    def statement(self, node: ast.AST) -> ast.stmt:
        cur = node
        while not isinstance(cur, ast.stmt):
            cur = self.parent[cur]
        return cur

    def calls_named(self, name: str) -> list[ast.Call]:
        """The calls of `name(...)` or `x.name(...)`, in ast.walk's order."""
        return self._by_last.get(name, [])

    def reads(self, name: str) -> list[ast.Name]:
        """The names `name` read (Load), in ast.walk's order."""
        return self._loads.get(name, [])

    def attribute_reads(self, attr: str) -> list[ast.Attribute]:
        """The attributes `x.attr` read (Load), in ast.walk's order."""
        return self._attr_loads.get(attr, [])

    def unparse(self, node: ast.AST) -> str:
        """ast.unparse(node), made once a node."""
        key = ("unparse", id(node))
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = ast.unparse(node)
        return got  # type: ignore[return-value]

    def yields(self, fn: ast.AST) -> bool:
        """fn is a generator (a yield of its own, not of a function inside it)."""
        return id(fn) in self._yields

    # -- names -----------------------------------------------------------------------------------
    def qualname(self, expr: ast.AST) -> str:
        """The dotted name of expr with imports resolved (`nn.Linear` -> torch.nn.Linear); "" for
        what is not a name."""
        key = ("qualname", id(expr))
        got = self._memo.get(key)
        if got is not None:
            return got  # type: ignore[return-value]
        out = ""
        if isinstance(expr, ast.Name):
            out = expr.id
            for scope in self._scopes(expr):
                full = self._imports.get((id(scope), expr.id))
                if full is not None:
                    out = full
                    break
        elif isinstance(expr, ast.Attribute):
            base = self.qualname(expr.value)
            out = f"{base}.{expr.attr}" if base else ""
        self._memo[key] = out
        return out

    def call_name(self, call: ast.Call) -> str:
        return self.qualname(call.func)

    def last(self, call: ast.Call) -> str:
        f = call.func
        return (
            f.attr
            if isinstance(f, ast.Attribute)
            else f.id
            if isinstance(f, ast.Name)
            else ""
        )

    def _scopes(self, node: ast.AST):
        scope = self.scope(node)
        while True:
            yield scope
            if scope is self.tree:
                return
            scope = self.scope(scope)

    def is_import(self, name: ast.Name) -> bool:
        return any((id(s), name.id) in self._imports for s in self._scopes(name))

    def params(self, fn: ast.AST) -> list[str]:
        args = fn.args  # type: ignore[attr-defined]
        return [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]

    def callers(self, fn: ast.FunctionDef) -> list[ast.Call]:
        """Calls that may run fn: by its name (a method by attribute name), the class's
        constructor for __init__."""
        key = ("callers", id(fn))
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self._callers(fn)
        return list(got)  # type: ignore[call-overload]

    def _callers(self, fn: ast.FunctionDef) -> list[ast.Call]:
        cls = self.class_of(fn)
        if cls is not None and self.function_of(fn) is None and fn.name == "__init__":
            return list(self._by_last.get(cls.name, []))
        out = []
        for c in self._by_last.get(fn.name, []):
            if (
                isinstance(c.func, ast.Name)
                and cls is not None
                and self.function_of(fn) is None
            ):
                continue  # a plain call does not reach a method
            if (
                isinstance(c.func, ast.Attribute)
                and cls is None
                and not self._module_ref(c.func.value)
            ):
                continue  # obj.f() is a method, not the module-level f
            out.append(c)
        return out

    def _module_ref(self, expr: ast.AST) -> bool:
        return isinstance(expr, ast.Name) and (
            self.is_import(expr) or expr.id.startswith("__ddpify_import_")
        )

    def passed_as_value(self, fn: ast.FunctionDef) -> bool:
        """fn is handed on as a value (a callback, fire.Fire(main), a decorator's target)."""
        for node in self._loads.get(fn.name, []):
            par = self.parent.get(node)
            if not (isinstance(par, ast.Call) and par.func is node):
                return True
        return bool(fn.decorator_list)

    def argument(self, call: ast.Call, fn: ast.AST, param: str) -> ast.AST | None:
        names = self.params(fn)
        for kw in call.keywords:
            if kw.arg == param:
                return kw.value
        if param not in names:
            return None
        i = names.index(param)
        if (
            names
            and names[0] in ("self", "cls")
            and (isinstance(call.func, ast.Attribute) or self.class_of(fn) is not None)
        ):
            i -= 1
        pos = [a for a in call.args if not isinstance(a, ast.Starred)]
        return pos[i] if 0 <= i < len(pos) else None

    # -- values ----------------------------------------------------------------------------------
    def origins(
        self, expr: ast.AST, depth: int = 0, seen: set | None = None
    ) -> list[Origin]:
        """What expr may hold, followed through the program (see the module's docstring)."""
        if seen is None and depth == 0:
            # a question asked afresh has one answer: kept, as the gate asks it again
            key0 = ("origins", id(expr))
            got = self._memo.get(key0)
            if got is None:
                got = self._memo[key0] = self.origins(expr, 0, set())
            return list(got)  # type: ignore[call-overload]
        seen = set() if seen is None else seen
        key = id(expr)
        if depth > MAX_DEPTH or key in seen:
            return [Origin(expr)]
        seen.add(key)
        if isinstance(expr, ast.Name):
            found = self._name_values(expr, depth, seen)
            return found or [Origin(expr)]
        if isinstance(expr, ast.Attribute):
            if isinstance(expr.value, ast.Name) and expr.value.id == "self":
                cls = self.class_of(expr)
                values = (
                    self._attrs.get((id(cls), expr.attr), []) if cls is not None else []
                )
                if values:
                    return [o for v in values for o in self.origins(v, depth + 1, seen)]
            base = self.origins(expr.value, depth + 1, seen)
            out = []
            for o in base:
                got = self._attr_of(o, expr.attr, depth, seen)
                out += got if got else [Origin(o.node, o.path + (expr.attr,))]
            return out or [Origin(expr)]
        if isinstance(expr, ast.Call):
            f = expr.func
            if isinstance(f, ast.Attribute) and f.attr in SAME_OBJECT:
                return self.origins(f.value, depth + 1, seen)
            returned = self._returns(expr, depth, seen)
            return returned or [Origin(expr)]
        if isinstance(expr, ast.Subscript):
            key_ = _literal(expr.slice)
            out = []
            for o in self.origins(expr.value, depth + 1, seen):
                el = _element(o.node, key_)
                out += (
                    self.origins(el, depth + 1, seen)
                    if el is not None
                    else [Origin(expr)]
                )
            return out or [Origin(expr)]
        if isinstance(expr, ast.IfExp):
            return self.origins(expr.body, depth + 1, seen) + self.origins(
                expr.orelse, depth + 1, seen
            )
        if isinstance(expr, ast.BoolOp):
            return [o for v in expr.values for o in self.origins(v, depth + 1, seen)]
        if isinstance(expr, ast.NamedExpr):
            return self.origins(expr.value, depth + 1, seen)
        return [Origin(expr)]

    def _name_values(self, name: ast.Name, depth: int, seen: set) -> list[Origin]:
        for scope in self._scopes(name):
            values = self._assigned.get((id(scope), name.id))
            if values:
                out = []
                for value, index, _ in (
                    self._reaching(name, values)
                    if scope is self.scope(name)
                    else values
                ):
                    out += self._indexed_origins(value, index, depth, seen)
                return out
            if isinstance(
                scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            ) and name.id in self.params(scope):
                if isinstance(scope, ast.Lambda):
                    return []
                out = []
                for c in self.callers(scope):  # type: ignore[arg-type]
                    arg = self.argument(c, scope, name.id)
                    if arg is not None:
                        out += self.origins(arg, depth + 1, seen)
                return out
            if isinstance(
                scope, (ast.FunctionDef, ast.AsyncFunctionDef)
            ) and self._binds_in_loop(scope, name.id):
                return []
        return []

    def _reaching(self, use: ast.Name, values: list) -> list:
        """The assignments of the use's own scope that may reach it: from the last one before it
        that always runs on the way to it (in a block around the use), plus, in a loop, those
        later in the loop (the next pass sees them). A use before every assignment sees them all."""
        line = use.lineno
        # the answer depends on the line and the blocks around the use: the same for the uses
        # of one name under one parent
        key = ("reaching", id(values), id(self.parent.get(use)), line)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self._reaching_from(use, values, line)
        return got  # type: ignore[return-value]

    def _reaching_from(self, use: ast.Name, values: list, line: int) -> list:
        before = [v for v in values if v[2].lineno < line]
        if not before:
            return values
        chain = {id(a) for a in self.ancestors(use)}
        start = 0
        for k, v in enumerate(before):
            holder = self.parent.get(v[2])
            if holder is None or id(holder) in chain or holder is self.tree:
                start = k  # its block holds the use: every later path passes it
        kept = before[start:]
        loop = next(
            (
                a
                for a in self.ancestors(use)
                if isinstance(a, (ast.For, ast.While, ast.AsyncFor))
            ),
            None,
        )
        if loop is not None:
            kept += [
                v for v in values if v[2].lineno >= line and self.inside(v[2], loop)
            ]
        return kept

    def _binds_in_loop(self, scope: ast.AST, name: str) -> bool:
        """A for loop or comprehension in scope (or in a function inside it) binds name."""
        return (id(scope), name) in self._loop_names

    def _indexed_origins(
        self, value: ast.AST, index: tuple, depth: int, seen: set
    ) -> list[Origin]:
        if not index:
            return self.origins(value, depth + 1, seen)
        out = []
        for o in self.origins(value, depth + 1, seen):
            el = _element(o.node, index[0])
            if (
                el is None
                and isinstance(o.node, ast.Call)
                and not self.callees(o.node)
                and isinstance(index[0], int)
                and index[0] < len(o.node.args)
                and not isinstance(o.node.args[index[0]], ast.Starred)
            ):
                # `model, opt = amp.initialize(model, opt)`: a library call handing back its arguments
                out += self._indexed_origins(
                    o.node.args[index[0]], index[1:], depth + 1, seen
                )
            elif el is None:
                out.append(Origin(value))
            else:
                out += self._indexed_origins(el, index[1:], depth + 1, seen)
        return out

    def _attr_of(self, o: Origin, attr: str, depth: int, seen: set) -> list[Origin]:
        """obj.attr where obj is an instance of a class of the program: self.attr there."""
        if o.path or not isinstance(o.node, ast.Call):
            return []
        cls_name = self.last(o.node)
        out = []
        for cls in self.classes.get(cls_name, []):
            if self.is_module_class(cls):
                continue  # model.backbone: a part of the model, kept as a path from it
            for v in self._attrs.get((id(cls), attr), []):
                out += self.origins(v, depth + 1, seen)
        return out

    def is_module_class(self, cls: ast.ClassDef, depth: int = 0) -> bool:
        """cls derives from a torch module (through classes of the program)."""
        for b in cls.bases:
            name = self.qualname(b)
            if name.startswith("torch.nn") or name.endswith("Module"):
                return True
            if depth < 5 and any(
                self.is_module_class(c, depth + 1)
                for c in self.classes.get(name.rsplit(".", 1)[-1], [])
                if c is not cls
            ):
                return True
        return False

    def _returns(self, call: ast.Call, depth: int, seen: set) -> list[Origin]:
        """What a call of a function of the program returns (not a class: its instance is the call)."""
        name = self.last(call)
        if name in self.classes:
            return []
        out = []
        for fn in self.callees(call):
            for node in self.returns(fn):
                out += self.origins(node.value, depth + 1, seen)  # type: ignore[arg-type]
        return out

    def returns(self, fn: ast.AST) -> list[ast.Return]:
        """fn's own `return value` statements (not those of functions inside it)."""
        return self._returns_of.get(id(fn), [])

    def callees(self, call: ast.Call) -> list[ast.FunctionDef]:
        """Functions of the program a call may run (by name; a method by attribute name)."""
        key = ("callees", id(call))
        got = self._memo.get(key)
        if got is not None:
            return got  # type: ignore[return-value]
        name = self.last(call)
        fns = self.functions.get(name, [])
        if not fns:
            out: list[ast.FunctionDef] = []
        elif isinstance(call.func, ast.Name):
            out = [
                f
                for f in fns
                if self.class_of(f) is None or self.function_of(f) is not None
            ]
        else:
            out = [
                f
                for f in fns
                if self.class_of(f) is not None or self._module_ref(call.func.value)
            ]  # type: ignore[attr-defined]
        self._memo[key] = out
        return out

    # -- training --------------------------------------------------------------------------------
    def backwards(self) -> list[ast.Call]:
        return [
            c
            for c in self.calls
            if self.last(c) == "backward"
            and isinstance(c.func, ast.Attribute)
            or self.call_name(c) == "torch.autograd.backward"
        ]

    def trains(self, fn: ast.AST, depth: int = 0) -> bool:
        """fn runs a backward, itself or through functions of the program it calls."""
        key = id(fn)
        if key in self._trains:
            return self._trains[key]
        self._trains[key] = False  # recursion
        found = False
        for node in self.calls_in(fn):
            if self.last(node) == "backward" and isinstance(node.func, ast.Attribute):
                found = True
                break
            if depth < 6 and any(
                self.trains(g, depth + 1) for g in self.callees(node) if g is not fn
            ):
                found = True
                break
        self._trains[key] = found
        return found


def _indexed(value: ast.AST, index: tuple) -> ast.AST:
    for i in index:
        el = _element(value, i)
        if el is None:
            return value
        value = el
    return value


def _literal(node: ast.AST):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, str)):
        return node.value
    return None


def _element(node: ast.AST, key) -> ast.AST | None:
    """The element `key` of a tuple/list literal (an index) or a dict literal (a key)."""
    if key is None:
        return None
    if (
        isinstance(node, (ast.Tuple, ast.List))
        and isinstance(key, int)
        and -len(node.elts) <= key < len(node.elts)
    ):
        el = node.elts[key]
        return None if isinstance(el, ast.Starred) else el
    if isinstance(node, ast.Dict):
        for k, v in zip(node.keys, node.values):
            if k is not None and _literal(k) == key:
                return v
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "dict"
    ):
        for kw in node.keywords:
            if kw.arg == key:
                return kw.value
    return None
