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

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)
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


@dataclass(frozen=True)
class Origin:
    """Where a value comes from: a node of the program, and the attribute path read off it
    (`model.backbone` built as Net(): the Net() call, ("backbone",))."""

    node: ast.AST
    path: tuple[str, ...] = ()


@dataclass
class Program:
    text: str
    tree: ast.Module = field(init=False)
    parent: dict[ast.AST, ast.AST] = field(init=False, default_factory=dict)
    functions: dict[str, list[ast.FunctionDef]] = field(
        init=False, default_factory=dict
    )
    classes: dict[str, list[ast.ClassDef]] = field(init=False, default_factory=dict)
    calls: list[ast.Call] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.tree = ast.parse(self.text)
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
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, []).append(node)  # type: ignore[arg-type]
            elif isinstance(node, ast.ClassDef):
                self.classes.setdefault(node.name, []).append(node)
            elif isinstance(node, ast.Call):
                self.calls.append(node)
            elif (
                isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
            ):
                targets = (
                    node.targets if isinstance(node, ast.Assign) else [node.target]
                )
                for t in targets:
                    self._bind(t, node.value, (), node)
            elif isinstance(node, ast.NamedExpr):
                self._bind(node.target, node.value, (), node)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                scope = id(self.scope(node))
                for alias in node.names:
                    if isinstance(node, ast.Import):
                        name = alias.asname or alias.name.split(".")[0]
                        full = alias.name if alias.asname else alias.name.split(".")[0]
                    else:
                        name = alias.asname or alias.name
                        full = f"{node.module or ''}.{alias.name}".lstrip(".")
                    self._imports[(scope, name)] = full
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                self._bind(node.optional_vars, node.context_expr, (), self.parent[node])

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
    def scope(self, node: ast.AST) -> ast.AST:
        cur = self.parent.get(node)
        while cur is not None and not isinstance(cur, SCOPES):
            cur = self.parent.get(cur)
        return cur if cur is not None else self.tree

    def function_of(self, node: ast.AST) -> ast.FunctionDef | None:
        cur = self.parent.get(node)
        while cur is not None and not isinstance(
            cur, (ast.FunctionDef, ast.AsyncFunctionDef)
        ):
            cur = self.parent.get(cur)
        return cur  # type: ignore[return-value]

    def class_of(self, node: ast.AST) -> ast.ClassDef | None:
        cur = self.parent.get(node)
        while cur is not None and not isinstance(cur, ast.ClassDef):
            cur = self.parent.get(cur)
        return cur

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

    # -- names -----------------------------------------------------------------------------------
    def qualname(self, expr: ast.AST) -> str:
        """The dotted name of expr with imports resolved (`nn.Linear` -> torch.nn.Linear); "" for
        what is not a name."""
        if isinstance(expr, ast.Name):
            for scope in self._scopes(expr):
                full = self._imports.get((id(scope), expr.id))
                if full is not None:
                    return full
            return expr.id
        if isinstance(expr, ast.Attribute):
            base = self.qualname(expr.value)
            return f"{base}.{expr.attr}" if base else ""
        return ""

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
        cls = self.class_of(fn)
        if cls is not None and self.function_of(fn) is None and fn.name == "__init__":
            return [c for c in self.calls if self.last(c) == cls.name]
        out = []
        for c in self.calls:
            if self.last(c) != fn.name:
                continue
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
        for node in ast.walk(self.tree):
            if (
                isinstance(node, ast.Name)
                and node.id == fn.name
                and isinstance(node.ctx, ast.Load)
            ):
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
        for node in ast.walk(scope):
            if isinstance(node, (ast.For, ast.comprehension)) and any(
                isinstance(t, ast.Name) and t.id == name for t in ast.walk(node.target)
            ):
                return True
        return False

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
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Return)
                    and node.value is not None
                    and self.function_of(node) is fn
                ):
                    out += self.origins(node.value, depth + 1, seen)
        return out

    def callees(self, call: ast.Call) -> list[ast.FunctionDef]:
        """Functions of the program a call may run (by name; a method by attribute name)."""
        name = self.last(call)
        fns = self.functions.get(name, [])
        if isinstance(call.func, ast.Name):
            return [
                f
                for f in fns
                if self.class_of(f) is None or self.function_of(f) is not None
            ]
        return [
            f
            for f in fns
            if self.class_of(f) is not None or self._module_ref(call.func.value)
        ]  # type: ignore[attr-defined]

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
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                if self.last(node) == "backward" and isinstance(
                    node.func, ast.Attribute
                ):
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
