"""Which calls of a model are its training forwards: the calls whose outputs reach a backward().

DDP synchronises gradients only through its own forward, so these calls (and only these) must
run through the wrapper; every other use of the model (evaluation, attributes, state dicts,
copies, whole-object saves) keeps the plain module. They are found by following values back
from each backward's loss: through assignments, augmented and tuple assignments, list appends,
attributes (`self.fake = G(z)` in another method of the class), subscripts and attribute reads
of a result (`out.loss`, `out[0]`), the script's own functions and methods (their returns, and
the arguments callers hand them), loss functions and any other call (their arguments). Values
stop at `.detach()`/`.item()` and at forwards run under `torch.no_grad()`.

The same walk finds what DDP cannot synchronise: parameters read outside forward on the way to
the loss (`model.log_vars[i]`, `model.parameters()` in a penalty), and a model handed to code
outside the program (a library function) whose result reaches the loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

import ddpify.match as m
from ddpify.analysis.core import Analysis
from ddpify.analysis.tree import _flatten_targets, call_args, dotted

# nn.Module's own methods: none of them runs the model's forward
MODULE_API = {
    "parameters",
    "named_parameters",
    "buffers",
    "named_buffers",
    "children",
    "named_children",
    "modules",
    "named_modules",
    "state_dict",
    "load_state_dict",
    "train",
    "eval",
    "to",
    "cuda",
    "cpu",
    "half",
    "float",
    "double",
    "bfloat16",
    "type",
    "zero_grad",
    "requires_grad_",
    "apply",
    "register_buffer",
    "register_parameter",
    "add_module",
    "register_module",
    "get_submodule",
    "get_parameter",
    "get_buffer",
    "register_forward_hook",
    "register_forward_pre_hook",
    "register_full_backward_hook",
    "register_backward_hook",
    "extra_repr",
    "share_memory",
    "to_empty",
    "no_sync",
    "training",
    "module",
}
PARAMETER_READS = {
    "parameters",
    "named_parameters",
}  # in a loss: the parameters outside forward
# a value that carries no gradient from here on
STOPS = {"detach", "detach_", "item", "tolist", "numpy", "requires_grad_"}
MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault"}
NO_GRAD = ("torch.no_grad", "torch.inference_mode")
PLACEMENT = ("to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train")


@dataclass(frozen=True)
class TrainingForward:
    call: cst.Call  # model(x), model.forward(x), model.loss(x, y), model.encoder(x)
    receiver: (
        cst.BaseExpression
    )  # the model in it: `model`, `self.net`, a parameter, an alias
    method: (
        str | None
    )  # None: the model's own forward; else what is called on it ("loss", "encoder.block")


@dataclass
class LossFlow:
    forwards: list[TrainingForward] = field(default_factory=list)
    outside: list[tuple[cst.CSTNode, cst.BaseExpression, str]] = field(
        default_factory=list
    )  # (read, model, what)
    foreign: list[tuple[cst.Call, cst.BaseExpression]] = field(
        default_factory=list
    )  # (call, model handed to it)


def loss_flow(a: Analysis) -> LossFlow:
    """The training forwards of every step of the program (computed once per analysis)."""
    cached = getattr(a, "_loss_flow", None)
    if cached is None:
        cached = a._loss_flow = _Walk(a).run()  # type: ignore[attr-defined]
    return cached


def model_ref(a: Analysis, node: cst.CSTNode) -> cst.BaseExpression | None:
    """The longest prefix of a Name/Attribute chain that is a model (`self.model` in
    `self.model.encoder`), or a local alias of one (`model = self.model`), or None."""
    cur = node
    found = None
    while isinstance(cur, (cst.Name, cst.Attribute)):
        if (
            a.is_model_ref(cur)
            or (isinstance(cur, cst.Name) and alias_of(a, cur) is not None)
            or _instance_attribute(a, cur)
        ):
            found = cur
        cur = cur.value if isinstance(cur, cst.Attribute) else None
    return found  # type: ignore[return-value]


def _instance_attribute(a: Analysis, node: cst.CSTNode) -> bool:
    """`trainer.model`: an object's attribute under the name a class binds its model to
    (`self.model`), read from outside the class."""
    if not isinstance(node, cst.Attribute) or dotted(node.value) in (None, "self"):
        return False
    return f"self.{node.attr.value}" in a.models


def alias_of(a: Analysis, name: cst.Name) -> cst.BaseExpression | None:
    """The model a local name is bound to in its function, where every binding of it there is
    a model (`model, lr = self.model, self.lr`; `net = model`)."""
    fn = a.function_of(name)
    if fn is None or not a._is_local(fn, name.value):
        return None
    cache = a.__dict__.setdefault("_model_aliases", {})
    key = (id(fn), name.value)
    if key in cache:
        return cache[key]
    cache[key] = None  # (a cycle: not an alias)
    found = None
    for asg in a.assigns:
        if not isinstance(asg, cst.Assign) or a.function_of(asg) is not fn:
            continue
        for t in asg.targets:
            pairs = [(t.target, asg.value)]
            if (
                isinstance(t.target, (cst.Tuple, cst.List))
                and isinstance(asg.value, (cst.Tuple, cst.List))
                and len(t.target.elements) == len(asg.value.elements)
            ):
                pairs = [
                    (x.value, v.value)
                    for x, v in zip(t.target.elements, asg.value.elements)
                ]
            for target, value in pairs:
                if any(
                    isinstance(el, cst.Name) and el.value == name.value
                    for el in _flatten_targets(target)
                ):
                    if (
                        not isinstance(target, cst.Name)
                        or model_ref(a, value) is not value
                    ):
                        return None
                    found = value
    if name.value in {p.name.value for p in fn.params.params}:
        return None
    cache[key] = found
    return found


def _detached(a: Analysis, call: cst.Call) -> bool:
    """`G(z).detach()`: the output is cut from autograd where it is made."""
    par = a.parent.get(call)
    return (
        isinstance(par, cst.Attribute)
        and par.attr.value in STOPS
        and isinstance(a.parent.get(par), cst.Call)
    )


def no_grad(a: Analysis, node: cst.CSTNode) -> bool:
    cur = a.parent.get(node)
    while cur is not None:
        if isinstance(cur, cst.With) and any(
            a.is_call(i.item, *NO_GRAD) for i in cur.items
        ):
            return True
        if isinstance(cur, cst.FunctionDef) and any(
            a.is_call(d.decorator, *NO_GRAD) or a.qualified(d.decorator) & set(NO_GRAD)
            for d in cur.decorators
        ):
            return True
        cur = a.parent.get(cur)
    return False


class _Walk:
    def __init__(self, a: Analysis) -> None:
        self.a = a
        self.out = LossFlow()
        self.seen: set[tuple[int, int]] = set()
        self.found: set[int] = set()
        self._assigned: dict[int, dict[str, list[cst.CSTNode]]] = {}

    def run(self) -> LossFlow:
        a = self.a
        for step in a.steps:
            self.visit(step.loss_expr, a.function_of(step.stmt))
        self._in_steps()
        self.out.forwards.sort(key=lambda f: a._order.get(id(f.call), 0))
        return self.out

    def _in_steps(self) -> None:
        """Calls of a model between the previous backward of a step's block and its backward,
        with gradients on, whose value the walk did not follow to the loss: counted as training
        forwards too (a forward through the wrapper that reaches no backward costs nothing; one
        left out of it would train unsynchronised)."""
        a = self.a
        for step in a.steps:
            body = list(step.block.body)  # type: ignore[attr-defined]
            if step.forward_first not in body:
                continue
            for s in body[body.index(step.forward_first) : body.index(step.stmt) + 1]:
                for c in a.findall(s, m.Call()):
                    if (
                        a.is_model_ref(c.func)
                        and id(c) not in self.found
                        and not no_grad(a, c)
                        and not _detached(a, c)
                    ):
                        self.found.add(id(c))
                        self.out.forwards.append(TrainingForward(c, c.func, None))

    # -- expressions --------------------------------------------------------------------
    def visit(self, node: cst.CSTNode | None, fn: cst.FunctionDef | None) -> None:
        if node is None:
            return
        key = (id(node), id(fn))
        if key in self.seen:
            return
        self.seen.add(key)
        a = self.a
        if isinstance(node, cst.Call):
            self.call(node, fn)
        elif isinstance(node, (cst.Name, cst.Attribute)):
            self.reference(node, fn)
        elif isinstance(node, cst.Subscript):
            self.visit(node.value, fn)  # losses[0], out["loss"]: the container's values
        elif isinstance(node, (cst.Lambda, cst.SimpleString, cst.Integer, cst.Float)):
            return
        else:
            for child in a.kids.get(id(node), ()):
                if isinstance(
                    child,
                    (
                        cst.BaseExpression,
                        cst.Arg,
                        cst.Element,
                        cst.DictElement,
                        cst.CompFor,
                        cst.BaseSlice,
                        cst.SubscriptElement,
                        cst.StarredElement,
                        cst.StarredDictElement,
                        cst.ComparisonTarget,
                        cst.FormattedStringExpression,
                    ),
                ):
                    if isinstance(child, cst.CompFor):
                        self.visit(child.iter, fn)
                    else:
                        self.visit(child, fn)

    def call(self, call: cst.Call, fn: cst.FunctionDef | None) -> None:
        a = self.a
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in STOPS:
            return
        ref = model_ref(a, func)
        if ref is not None:
            method = (
                None
                if ref is func
                else (dotted(func) or "")[len(dotted(ref) or "") + 1 :]
            )
            if method == "forward":
                method = None
            if method in PARAMETER_READS:
                self.out.outside.append((call, ref, f"{dotted(ref)}.{method}()"))
                return
            if method is None or (
                method.split(".")[0] not in MODULE_API
                and self._runs_parameters(ref, method)
            ):
                if not no_grad(a, call) and id(call) not in self.found:
                    self.found.add(id(call))
                    self.out.forwards.append(TrainingForward(call, ref, method))
            for arg in call.args:
                self.visit(arg.value, fn)
            return
        defs = self._script_functions(call, fn)
        if defs:
            for d in defs:
                for ret in a.findall(d.body, m.Return()):
                    if a.function_of(ret) is d:
                        self.visit(ret.value, d)
            for arg in (
                call.args
            ):  # values handed in may come back (model refs go through the def)
                if model_ref(a, arg.value) is not arg.value:
                    self.visit(arg.value, fn)
            if isinstance(func, cst.Attribute):
                self.visit(func.value, fn)
            return
        for arg in call.args:
            if a.is_optimizer_ref(arg.value):
                continue  # amp.scale_loss(loss, optimizer): the optimizer is no value of the loss
            if (
                model_ref(a, arg.value) is arg.value
                and not self._is_own_class(func)
                and call not in a.functional_dp_calls
            ):
                self.out.foreign.append((call, arg.value))  # type: ignore[arg-type]
            self.visit(arg.value, fn)
        self.visit(func.value if isinstance(func, cst.Attribute) else func, fn)

    def reference(
        self, node: cst.Name | cst.Attribute, fn: cst.FunctionDef | None
    ) -> None:
        a = self.a
        ref = model_ref(a, node)
        if ref is not None:
            if ref is not node and self._is_parameter(
                ref, node
            ):  # model.log_vars: read outside forward
                self.out.outside.append((node, ref, dotted(node) or ""))
            return
        path = dotted(node)
        if path is None:
            if isinstance(node, cst.Attribute):
                self.visit(node.value, fn)
            return
        values = self._values(path, fn, node)
        for value, scope in values:
            self.visit(value, scope)
        if isinstance(node, cst.Attribute):
            self.visit(node.value, fn)  # out.loss: the attribute of a result
        elif not values:
            self._parameter(node.value, fn)

    # -- where a value comes from -----------------------------------------------------------
    def _values(
        self, path: str, fn: cst.FunctionDef | None, at: cst.CSTNode
    ) -> list[tuple[cst.CSTNode, cst.FunctionDef | None]]:
        """What the name or attribute path is bound to in fn (or, for a global, at module level;
        for `self.x`, in every method of the class): assigned values, loop iterables, with
        items, and what is appended or stored into it."""
        a = self.a
        scopes: list[cst.FunctionDef | None] = [fn]
        if "." not in path and fn is not None and not a._is_local(fn, path):
            scopes = [None]
        if path.startswith("self.") and fn is not None and not self._bound_in(path, fn):
            cls = a.class_of(fn)
            scopes = [
                s
                for s in (cls.body.body if cls is not None else [])
                if isinstance(s, cst.FunctionDef)
            ]
        out = []
        for scope in scopes:
            out += [(v, scope) for v in self._bound_in(path, scope)]
        comp = self._comprehension_target(at, path)
        if comp is not None:
            out.append((comp.iter, fn))
        return out

    def _bound_in(self, path: str, fn: cst.FunctionDef | None) -> list[cst.CSTNode]:
        index = self._assigned.get(id(fn))
        if index is None:
            index = self._assigned[id(fn)] = self._index(fn)
        return index.get(path, [])

    def _index(self, fn: cst.FunctionDef | None) -> dict[str, list[cst.CSTNode]]:
        a = self.a
        out: dict[str, list[cst.CSTNode]] = {}
        scope = fn.body if fn is not None else a.module

        def add(target: cst.CSTNode, value: cst.CSTNode | None) -> None:
            for el in _flatten_targets(target):  # type: ignore[arg-type]
                if isinstance(el, cst.StarredElement):
                    el = el.value
                if isinstance(el, cst.Subscript):
                    el = el.value  # losses[k] = v: a value of losses
                d = dotted(el)
                if d is not None and value is not None:
                    out.setdefault(d, []).append(value)

        for node in a.findall(
            scope,
            m.Assign()
            | m.AnnAssign()
            | m.AugAssign()
            | m.For()
            | m.WithItem()
            | m.NamedExpr()
            | m.Call(),
        ):
            if a.function_of(node) is not fn:
                continue
            if isinstance(node, cst.Assign):
                for t in node.targets:
                    add(t.target, node.value)
            elif isinstance(node, (cst.AnnAssign, cst.AugAssign)):
                add(node.target, node.value)
            elif isinstance(node, cst.For):
                add(node.target, node.iter)
            elif isinstance(node, cst.WithItem):
                if node.asname is not None:
                    add(node.asname.name, node.item)
            elif isinstance(node, cst.NamedExpr):
                add(node.target, node.value)
            elif (
                isinstance(node.func, cst.Attribute)
                and node.func.attr.value in MUTATORS
            ):
                d = dotted(node.func.value)
                if d is not None:
                    out.setdefault(d, []).extend(x.value for x in node.args)
        return out

    def _comprehension_target(self, at: cst.CSTNode, name: str) -> cst.CompFor | None:
        cur = self.a.parent.get(at)
        while cur is not None and not isinstance(cur, (cst.FunctionDef, cst.Module)):
            if isinstance(
                cur, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)
            ):
                comp = cur.for_in
                while comp is not None:
                    if any(dotted(el) == name for el in _flatten_targets(comp.target)):
                        return comp
                    comp = comp.inner_for_in
            cur = self.a.parent.get(cur)
        return None

    def _parameter(self, name: str, fn: cst.FunctionDef | None) -> None:
        """A parameter of fn: what its callers hand it (`def step(loss): loss.backward()`)."""
        a = self.a
        if fn is None or name not in {p.name.value for p in fn.params.params}:
            return
        for c in a.callers(fn):
            arg = a.argument_for(c, fn, name)
            if arg is not None:
                self.visit(arg, a.function_of(c))

    # -- what is called ---------------------------------------------------------------------
    def _script_functions(
        self, call: cst.Call, fn: cst.FunctionDef | None
    ) -> list[cst.FunctionDef]:
        """The script's functions (or methods) a call may run: by name, `self.meth` in the
        caller's class, an instance of a class of the script called (its forward/__call__)."""
        a = self.a
        name = dotted(call.func)
        if name is None:
            return []
        bound = self._partial_target(name, fn)
        if (
            bound is not None
        ):  # run = functools.partial(step, model, loss_fn); run(x, y)
            return a.functions.get(bound, [])
        last = name.rsplit(".", 1)[-1]
        if name.startswith("self.") and name.count(".") == 1 and fn is not None:
            cls = a.class_of(fn)
            own = [
                f
                for f in (cls.body.body if cls is not None else [])
                if isinstance(f, cst.FunctionDef) and f.name.value == last
            ]
            if own:
                return own
        if last in a.classes:
            return []  # a constructor: its arguments flow on (criterion = Loss(); done by the caller)
        if "." not in name:
            cls = self._instance_class(name, fn)
            if cls is not None:
                return [
                    f
                    for f in cls.body.body
                    if isinstance(f, cst.FunctionDef)
                    and f.name.value in ("forward", "__call__")
                ]
        defs = a.functions.get(last, [])
        if "." in name and not name.startswith("self."):
            # obj.meth(...): a method of one of the script's classes, or a module's function
            return [
                d for d in defs if a.class_of(d) is not None or a._local_module(name)
            ]
        return [d for d in defs if a.class_of(d) is None or name.startswith("self.")]

    def _partial_target(
        self, name: str, fn: cst.FunctionDef | None, depth: int = 0
    ) -> str | None:
        """The function of the program a name bound to functools.partial(f, ...) runs."""
        a = self.a
        if (
            name.startswith("self.")
            and name.count(".") == 1
            and fn is not None
            and a.class_of(fn) is not None
        ):
            for asg in a.findall(
                a.class_of(fn), m.Assign()
            ):  # self.fwd = functools.partial(...)
                if any(dotted(t.target) == name for t in asg.targets) and any(
                    asg.value is c for c in a.partial_calls()
                ):
                    return dotted(asg.value.args[0].value)
            return None
        if "." in name:
            return None
        for value in a._local_values(fn, name) or a._local_values(None, name):
            if isinstance(value, cst.Call) and any(
                value is c for c in a.partial_calls()
            ):
                return dotted(value.args[0].value)
        if (
            fn is not None
            and depth < 4
            and name in {p.name.value for p in fn.params.params}
        ):
            callers = a.callers(
                fn
            )  # run_epoch(loader, step_fn): the partial its one caller hands it
            if len(callers) == 1:
                arg = a.argument_for(callers[0], fn, name)
                if isinstance(arg, cst.Name):
                    return self._partial_target(
                        arg.value, a.function_of(callers[0]), depth + 1
                    )
        return None

    def _instance_class(
        self, name: str, fn: cst.FunctionDef | None
    ) -> cst.ClassDef | None:
        """The script's class whose instance `name` holds in fn (or globally)."""
        a = self.a
        for scope in (fn, None):
            for v in self._bound_in(name, scope):
                if isinstance(v, cst.Call):
                    cls = a.classes.get((dotted(v.func) or "").rsplit(".", 1)[-1])
                    if cls is not None:
                        return cls
        return None

    def _is_parameter(self, ref: cst.BaseExpression, node: cst.Attribute) -> bool:
        """`model.log_vars` (and `model.head.weight`) where the model's class makes it a
        parameter or module; a class ddpify cannot read: unknown, so no."""
        cls = model_class(self.a, ref)
        if cls is None:
            return False
        head = (dotted(node) or "")[len(dotted(ref) or "") + 1 :].split(".")[0]
        return head in owned_attributes(self.a, cls)

    def _is_own_class(self, func: cst.BaseExpression) -> bool:
        return (dotted(func) or "").rsplit(".", 1)[-1] in self.a.classes

    def _runs_parameters(self, ref: cst.BaseExpression, method: str) -> bool:
        """model.method(...) may compute with the model's parameters: a submodule, or a method
        that reaches its forward, a submodule or a parameter. A method of a class ddpify cannot
        read may: it counts."""
        a = self.a
        cls = model_class(a, ref)
        if cls is None:
            return True
        methods = {
            f.name.value: f for f in cls.body.body if isinstance(f, cst.FunctionDef)
        }
        head = method.split(".")[0]
        if head not in methods:
            return True  # a submodule (or an attribute of a base class ddpify does not read)
        owned = owned_attributes(a, cls)
        todo, seen = [methods[head]], set()
        while todo:
            f = todo.pop()
            if f.name.value in seen:
                continue
            seen.add(f.name.value)
            for node in a.findall(f, m.Call() | m.Attribute()):
                d = dotted(node.func if isinstance(node, cst.Call) else node) or ""
                if d in ("self", "self.forward"):
                    return True
                if d.startswith("self.") and d.count(".") == 1:
                    attr = d[5:]
                    if attr in methods:
                        todo.append(methods[attr])
                    elif attr in owned:
                        return True
        return False


def model_class(a: Analysis, ref: cst.BaseExpression) -> cst.ClassDef | None:
    """The script's class the model `ref` is an instance of, following assignments (through
    placement calls: `Net().to(device)`) and, for a parameter, what its callers hand it."""
    work: list[cst.CSTNode] = [ref]
    seen: set[str] = set()
    while work:
        node = work.pop()
        path, fn = dotted(node), a.function_of(node)
        if path is None or f"{id(fn)}:{path}" in seen or len(seen) > 16:
            continue
        seen.add(f"{id(fn)}:{path}")
        if (
            isinstance(node, cst.Name)
            and fn is not None
            and path in {p.name.value for p in fn.params.params}
        ):
            work += [
                x
                for c in a.callers(fn)
                if (x := a.argument_for(c, fn, path)) is not None
            ]
        for asg in a.assigns:
            if not isinstance(asg, cst.Assign) or (
                "." not in path and a.function_of(asg) not in (fn, None)
            ):
                continue
            if not any(
                dotted(el) == path
                for t in asg.targets
                for el in _flatten_targets(t.target)
            ):
                continue
            value = asg.value
            while (
                isinstance(value, cst.Call)
                and isinstance(value.func, cst.Attribute)
                and value.func.attr.value in PLACEMENT
            ):
                value = value.func.value  # Net().to(device)
            if isinstance(value, cst.Call):
                cls = a.classes.get((dotted(value.func) or "").rsplit(".", 1)[-1])
                if cls is not None:
                    return cls
            elif isinstance(value, (cst.Name, cst.Attribute)):
                work.append(value)
    return None


def owned_attributes(a: Analysis, cls: cst.ClassDef) -> set[str]:
    """Attributes a model class sets to modules or parameters (`self.fc = nn.Linear(...)`,
    `self.log_vars = nn.Parameter(...)`) in any of its methods."""
    out: set[str] = set()
    for asg in a.findall(cls, m.Assign()):
        if not isinstance(asg.value, cst.Call):
            continue
        d = (dotted(asg.value.func) or "").rsplit(".", 1)[-1]
        if not (
            d[:1].isupper()
            or any(q.startswith("torch.nn.") for q in a.qualified(asg.value.func))
        ):
            continue
        for t in asg.targets:
            td = dotted(t.target)
            if td and td.startswith("self.") and td.count(".") == 1:
                out.add(td[5:])
    for c in a.findall(
        cls, m.Call(func=m.Attribute(attr=m.Name("register_parameter")))
    ):
        pos, _ = call_args(c)
        if pos and isinstance(pos[0].value, cst.SimpleString):
            out.add(pos[0].value.evaluated_value)  # type: ignore[arg-type]
    return out
