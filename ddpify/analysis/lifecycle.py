"""The model's lifecycle: what changes the model after it is built, and where the DDP wrap goes.

DDP broadcasts rank 0's parameters and fixes the set of parameters that need gradients when it
is built, and refuses (on GPUs) a module that is not yet on its one device. So the wrap goes
after the last statement that still changes the model (placement, initialisation, freezing,
torch.compile, SyncBatchNorm, a new submodule; loaded weights are the same on every rank and do
not move it) and before its first training forward. A change the wrap cannot be moved after (in
the training loop, in a function called later) is reported, not guessed around. The model keeps
its name (the plain module) and the wrapper gets one of its own (ddpify/analysis/routes.py), so
uses that are not training forwards neither need the wrap before them nor move it.
"""

from __future__ import annotations

import libcst as cst

import ddpify.match as m
from ddpify.analysis.core import Analysis
from ddpify.analysis.tree import (
    _flatten_targets,
    _inside,
    _path,
    call_args,
    code,
    dotted,
)

PLACEMENT = (
    "to",
    "cuda",
    "cpu",
    "half",
    "float",
    "bfloat16",
    "double",
    "to_empty",
    "type",
)
# method on the model (or a submodule) -> kind of change
METHODS = {
    **{p: "move" for p in PLACEMENT},
    "apply": "init",
    "reset_parameters": "init",
    "load_state_dict": "load",
    "requires_grad_": "freeze",
    "add_module": "structure",
    "register_module": "structure",
    "register_parameter": "structure",
}
# kinds that are wrong once DDP holds the model: its parameter set, device and buffers are fixed
# (a load is not: every rank loads the same weights, through .module)
UNSAFE_AFTER_WRAP = {"move", "init", "freeze", "structure", "syncbn"}
# loaded weights are the same on every rank, before or after the wrap (there through .module):
# they do not move it (with --amp apex, amp state must be restored after amp.initialize)
NEUTRAL = {"load"}
# nn.Module's own methods that change nothing DDP holds (the model's class may not override them)
MODULE_API = {
    "train",
    "eval",
    "forward",
    "parameters",
    "named_parameters",
    "state_dict",
    "modules",
    "children",
    "zero_grad",
}
RANDOM_INPLACE = {
    "normal_",
    "uniform_",
    "bernoulli_",
    "random_",
    "exponential_",
    "cauchy_",
    "log_normal_",
    "geometric_",
}
FIXED_INIT = {
    "zeros_",
    "ones_",
    "constant_",
    "eye_",
    "dirac_",
}  # nn.init.* that give every rank the same
WHAT = {
    "move": "moves it to another device or dtype",
    "init": "initialises its parameters",
    "freeze": "changes which parameters need gradients",
    "structure": "replaces a submodule or adds parameters",
    "syncbn": "converts its BatchNorm layers",
    "load": "loads weights into it",
    "inplace": "changes its parameters in place",
    "attr": "sets an attribute on it",
    "rebind": "binds the name to a new module",
    "compile": "compiles it with torch.compile",
}


# calls that want the plain module as their first argument: a copy or a trace of the wrapper
# carries 'module.' keys, and a traced DDP forward runs collectives on one rank alone
def _under(d: str | None, name: str) -> bool:
    return d is not None and (d == name or d.startswith(name + "."))


def _resolve(a: Analysis, path: str | None, at: cst.CSTNode, name: str) -> str | None:
    """path as a part of the model where it is one: itself, or through a loop over the model's
    parts (`for m in model.modules(): nn.init.normal_(m.weight)` gives "model.[].weight")."""
    if path is None or _under(path, name):
        return path
    head, _, rest = path.partition(".")
    loop = a.ancestor(at, cst.For)
    while loop is not None:
        if head in {x.value for x in a.findall(loop.target, m.Name())}:
            if any(
                _under(_path(x), name)
                for x in a.findall(loop.iter, m.Attribute() | m.Name())
            ):
                return f"{name}.[]" + (f".{rest}" if rest else "")
            return path
        loop = a.ancestor(loop, cst.For)
    return path


def change_in(
    a: Analysis, node: cst.CSTNode, name: str
) -> tuple[cst.CSTNode, str] | None:
    """The first thing in node's subtree that changes the model `name`, and its kind."""
    found = changes_in(a, node, name)
    return found[0] if found else None


def changes_in(
    a: Analysis, node: cst.CSTNode, name: str
) -> list[tuple[cst.CSTNode, str]]:
    out: list[tuple[cst.CSTNode, str]] = []
    for c in a.findall(node, m.Call()):
        kind = _call_change(a, c, name)
        if kind:
            out.append((c, kind))
    for asg in a.findall(node, m.Assign() | m.AnnAssign() | m.AugAssign()):
        targets = (
            [t.target for t in asg.targets]
            if isinstance(asg, cst.Assign)
            else [asg.target]
        )
        for t in targets:
            kind = _target_change(a, asg, t, name)
            if kind:
                out.append((asg, kind))
    out.sort(key=lambda x: a._order.get(id(x[0]), 0))
    return out


def _call_change(a: Analysis, c: cst.Call, name: str) -> str | None:
    f = c.func
    if isinstance(f, cst.Attribute):
        base = _resolve(a, _path(f.value), c, name)
        attr = f.attr.value
        if (
            base == name
            and attr not in METHODS
            and attr not in MODULE_API
            and attr in a.functions
        ):
            return _own_method_change(
                a, f.value, attr
            )  # the model's own init_weights(), not init_hidden()
        if attr in METHODS and _under(base, name):
            if METHODS[attr] == "move" and base != name:
                return None  # a submodule's buffer or a tensor copy, not the model's placement
            return METHODS[attr]
        # in-place on a parameter: model.fc.weight.data.normal_(0, 0.02)
        if (
            attr.endswith("_")
            and not attr.startswith("_")
            and base is not None
            and base.startswith(name + ".")
            and ".grad" not in base
        ):
            return "init" if attr in RANDOM_INPLACE else "inplace"
    if a.is_call(
        c,
        "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
        "apex.parallel.convert_syncbn_model",
    ):
        pos, _ = call_args(c)
        if pos and dotted(pos[0].value) == name:
            return "syncbn"
    if any(q.startswith("torch.nn.init.") for q in a.qualified(c.func)):
        pos, _ = call_args(c)
        arg = _resolve(a, _path(pos[0].value), c, name) if pos else None
        if _under(arg, name) and arg != name:
            return (
                "inplace"
                if (dotted(c.func) or "").rsplit(".", 1)[-1] in FIXED_INIT
                else "init"
            )
    return None


def _own_method_change(
    a: Analysis, ref: cst.CSTNode | None, attr: str, depth: int = 0
) -> str | None:
    """What the model's own method `attr` does to it: its body read, not its name (`init_hidden`
    that only returns fresh zeros changes nothing), in the model's class where ddpify can tell
    which that is, else in any class of the script that defines it."""
    from ddpify.analysis.loss_flow import model_class

    cls = model_class(a, ref) if ref is not None else None
    kinds: list[str] = []
    for meth in a.functions.get(attr, []):
        if a.class_of(meth) is None or (
            cls is not None and a.class_of(meth) is not cls
        ):
            continue
        kinds += [
            k
            for _, k in changes_in(a, meth.body, "self")
            if k not in ("attr", "rebind", "load")
        ]
        for c in a.findall(meth.body, m.Call()):
            d = dotted(c.func) or ""
            if (
                depth < 3
                and d.startswith("self.")
                and d.count(".") == 1
                and d[5:] in a.functions
                and d[5:] != attr
            ):
                inner = _own_method_change(a, None, d[5:], depth + 1)
                if inner:
                    kinds.append(inner)
    for k in ("freeze", "init", "structure", "move", "syncbn", "inplace"):
        if k in kinds:
            return k
    return None


def _target_change(
    a: Analysis, asg: cst.CSTNode, t: cst.BaseExpression, name: str
) -> str | None:
    for el in _flatten_targets(t):
        d = _resolve(a, _path(el), asg, name)
        if d is None:
            continue
        if d == name:
            value = getattr(asg, "value", None)
            if isinstance(value, cst.Call) and a.is_call(
                value,
                "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
                "apex.parallel.convert_syncbn_model",
            ):
                return "syncbn"
            if isinstance(value, cst.Call) and a.is_call(value, "torch.compile"):
                return "compile"  # (after the wrap it compiles DDP itself, which DDP supports)
            return "rebind"
        if d.startswith(name + "."):
            if d.endswith(".requires_grad"):
                return "freeze"
            if d.endswith(".training"):
                return None
            value = getattr(asg, "value", None)
            if isinstance(value, cst.Call) and _builds_module(a, value):
                return "structure"  # model.fc = nn.Linear(...), model.w = nn.Parameter(...)
            return "attr"
    return None


def _builds_module(a: Analysis, call: cst.Call) -> bool:
    d = dotted(call.func) or ""
    last = d.rsplit(".", 1)[-1]
    return bool(last[:1].isupper()) or any(
        q.startswith("torch.nn.") for q in a.qualified(call.func)
    )


# -- functions of the script that take the model --------------------------------------------------
def _param_for(fn: cst.FunctionDef, call: cst.Call, name: str) -> str | None:
    fname = dotted(call.func) or ""
    params = [p.name.value for p in fn.params.params]
    offset = 1 if params and params[0] in ("self", "cls") and "." in fname else 0
    pos, kw = call_args(call)
    for i, arg in enumerate(pos):
        if dotted(arg.value) == name and i + offset < len(params):
            return params[i + offset]
    for k, arg in kw.items():
        if dotted(arg.value) == name and k in params:
            return k
    return None


def helper_effect(
    a: Analysis, call: cst.Call, name: str, depth: int = 0
) -> tuple[str, cst.CSTNode | None, str | None]:
    """What a call of the script's own function does to the model handed to it:
    ("use", ...) it runs, returns or hands on the model (it must be wrapped by then);
    ("change", node, kind) it only changes it (the wrap can go after the call);
    ("none", ...) it takes no model or only reads it."""
    fname = dotted(call.func)
    if not fname:
        return ("none", None, None)
    effect: tuple[str, cst.CSTNode | None, str | None] = ("none", None, None)
    for fn in a.functions.get(fname.rsplit(".", 1)[-1], []):
        param = _param_for(fn, call, name)
        if param is None:
            continue
        if depth > 3 or _runs(a, fn, param, depth):
            return ("use", None, None)
        ch = change_in(a, fn.body, param)
        if ch is not None:
            effect = ("change", ch[0], ch[1])
    return effect


def _runs(a: Analysis, fn: cst.FunctionDef, param: str, depth: int) -> bool:
    for c in a.findall(fn.body, m.Call()):
        if dotted(c.func) == param:
            return True
        if (
            any(dotted(x.value) == param for x in c.args)
            and helper_effect(a, c, param, depth + 1)[0] == "use"
        ):
            return True
    for ret in a.findall(fn.body, m.Return()):
        items = (
            [e.value for e in ret.value.elements]
            if isinstance(ret.value, cst.Tuple)
            else [ret.value]
            if ret.value is not None
            else []
        )
        if any(dotted(x) == param for x in items):
            return (
                True  # model = prepare(model): the caller goes on with what it returns
            )
    return False


def changes(a: Analysis, stmt: cst.CSTNode, name: str) -> bool:
    """stmt changes the model (the wrap must come after it), whatever else it does with it:
    directly or through a part, rebinding the name (`model = prepare(model)`), through a
    function of the script it is handed to, or (for `self.X`) a method of the class."""
    if any(
        k not in NEUTRAL
        for part in (name, *model_parts(a, name))
        for _, k in changes_in(a, stmt, part)
    ):
        return True
    if holder_changes(a, stmt, name):
        return True
    for c in a.findall(stmt, m.Call()):
        fname = dotted(c.func)
        if (
            fname
            and fname.rsplit(".", 1)[-1] in a.functions
            and any(dotted(x.value) == name for x in c.args)
        ):
            if any(k not in NEUTRAL for k in _helper_changes(a, c, name, 0)):
                return True
        elif (
            name.startswith("self.")
            and fname
            and fname.startswith("self.")
            and fname.count(".") == 1
        ):
            meth = _method_of(a, c)
            if meth is not None and changes(a, meth.body, name):
                return True
    return False


def holder_changes(
    a: Analysis, node: cst.CSTNode, name: str
) -> list[tuple[cst.Call, str]]:
    """For a part `self.X` of the object whose method holds node: what node does to the whole
    object that changes its parts too (`self.to(device)`, `self.apply(init)`)."""
    if not name.startswith("self.") or name.count(".") != 1:
        return []
    out = []
    for c in a.findall(node, m.Call(func=m.Attribute())):
        attr = c.func.attr.value  # type: ignore[attr-defined]
        if (
            dotted(c.func.value) == "self"
            and attr in METHODS
            and METHODS[attr] not in NEUTRAL | {"structure"}
        ):  # type: ignore[attr-defined]
            out.append((c, METHODS[attr]))
    return out


def _helper_changes(a: Analysis, call: cst.Call, name: str, depth: int) -> list[str]:
    """Kinds of change a function of the script makes to the model handed to it (also when it
    runs the model too), through the functions it hands it on to."""
    kinds: list[str] = []
    fname = dotted(call.func) or ""
    for fn in a.functions.get(fname.rsplit(".", 1)[-1], []):
        param = _param_for(fn, call, name)
        if param is None or depth > 3:
            continue
        kinds += [k for _, k in changes_in(a, fn.body, param) if k != "rebind"]
        for c in a.findall(fn.body, m.Call()):
            if (
                any(dotted(x.value) == param for x in c.args)
                and (dotted(c.func) or "").rsplit(".", 1)[-1] in a.functions
            ):
                kinds += _helper_changes(a, c, param, depth + 1)
    return kinds


def _method_of(a: Analysis, call: cst.Call) -> cst.FunctionDef | None:
    """The method of the caller's own class that `self.meth(...)` calls."""
    fn = a.function_of(call)
    cls = a.class_of(fn) if fn is not None else None
    meth = (dotted(call.func) or "").rsplit(".", 1)[-1]
    return next(
        (
            f
            for f in (cls.body.body if cls is not None else [])
            if isinstance(f, cst.FunctionDef) and f.name.value == meth
        ),
        None,
    )


def trains(a: Analysis, stmt: cst.CSTNode) -> bool:
    """A statement that holds a training step (or is a loop that runs the model)."""
    return any(s.stmt is stmt or _inside(a, s.stmt, stmt) for s in a.steps) or (
        isinstance(stmt, (cst.For, cst.While)) and a.runs_model(stmt)
    )


# -- changes the wrap cannot go after ---------------------------------------------------------


def model_parts(a: Analysis, name: str) -> list[str]:
    """Modules the model is built from, held under names of their own: a change made through
    `backbone` (freezing it, moving it) changes `model = nn.Sequential(backbone, head)` too."""
    parts: list[str] = []
    for asg in a.assigns:
        if not isinstance(asg, cst.Assign) or asg.value is None:
            continue
        if not any(
            dotted(el) == name for t in asg.targets for el in _flatten_targets(t.target)
        ):
            continue
        args = [x for c in a.findall(asg.value, m.Call()) for x in c.args]
        for arg in args:
            part = dotted(arg.value) if isinstance(arg.value, cst.Name) else None
            if part and part != name and part not in parts and _is_module(a, part):
                parts.append(part)
    return parts


def _is_module(a: Analysis, var: str) -> bool:
    """var is bound to an nn module built in the script (torch.nn.X(...) or a class of its own)."""
    for asg in a.assigns:
        if (
            isinstance(asg, cst.Assign)
            and isinstance(asg.value, cst.Call)
            and any(dotted(t.target) == var for t in asg.targets)
        ):
            q = a.call_qualname(asg.value) or ""
            if (
                q.startswith("torch.nn.")
                or (dotted(asg.value.func) or "").rsplit(".", 1)[-1] in a.classes
            ):
                return True
    return False


def _move_key(call: cst.Call) -> str:
    return code(call.func.attr) + "(" + ", ".join(code(x) for x in call.args) + ")"  # type: ignore[attr-defined]


# -- changes while the model trains -------------------------------------------------------------
def changes_in_training(a: Analysis, name: str) -> list[tuple[cst.CSTNode, str]]:
    """Changes DDP cannot take once it has run the model, made while the model trains. DDP
    applied in place starts at the model's first forward: from then on its parameters, their
    device and which of them need gradients are fixed. So a change counts when it runs inside a
    loop that holds one of the model's training steps (or in a function such a loop calls), or
    between two such loops of one function; changes before the first step (placement,
    initialisation, weights, freezing) and after the last (export, evaluation) do not."""
    loops = _training_loops(a, name)
    if not loops:
        return []
    parts = (name, *model_parts(a, name))
    # the placement the model got where it was built: the same again each epoch moves nothing
    placed: set[str] = set()
    for n in parts:
        for c in a.calls:
            if (
                isinstance(c.func, cst.Attribute)
                and c.func.attr.value in PLACEMENT
                and not any(_inside(a, c, loop) for loop in loops)
                and any(_built_here(a, c, n, loop) for loop in loops)
            ):
                placed.add(_move_key(c))
    regions: list[cst.CSTNode] = list(loops)
    by_fn: dict[int, list[cst.CSTNode]] = {}
    for loop in loops:
        by_fn.setdefault(id(a.function_of(loop)), []).append(loop)
    for group in by_fn.values():
        if len(group) > 1:  # between the first and the last training loop of a function
            lo = min(a.pos[x].start.line for x in group)
            hi = max(a.pos[x].end.line for x in group)
            block = a.block(group[0])
            regions += [
                s
                for s in getattr(block, "body", ())
                if lo < a.pos[s].start.line < hi and s not in group
            ]
    out: list[tuple[cst.CSTNode, str]] = []
    seen: set[int] = set()
    for region in regions:
        for node, kind in _changes_reached(a, region, parts, 0, seen):
            if (
                kind == "move"
                and isinstance(node, cst.Call)
                and _move_key(node) in placed
            ):
                continue  # the same placement again each epoch: nothing moves
            if kind in UNSAFE_AFTER_WRAP and id(node) not in {id(n) for n, _ in out}:
                out.append((node, kind))
    return out


def _built_here(a: Analysis, call: cst.Call, name: str, loop: cst.CSTNode) -> bool:
    """call places the model (name.to(...), or the expression bound to name) before `loop`, in
    the same function."""
    if a.function_of(call) is not a.function_of(loop):
        return False
    if a.pos[call].end.line >= a.pos[loop].start.line:
        return False
    if dotted(call.func.value) == name:  # type: ignore[attr-defined]
        return True
    stmt = a.statement(call)
    return any(kind == "move" for _, kind in changes_in(a, stmt, name)) or any(
        dotted(t.target) == name
        for asg in a.findall(stmt, m.Assign())
        for t in asg.targets
    )


def _changes_reached(
    a: Analysis, node: cst.CSTNode, names: tuple[str, ...], depth: int, seen: set[int]
) -> list[tuple[cst.CSTNode, str]]:
    """Changes of the model in node, and in the script's functions node calls (the model
    handed to them, or `self.X` in the methods of its class)."""
    out = [hit for n in names for hit in changes_in(a, node, n)]
    out += [hit for n in names for hit in holder_changes(a, node, n)]
    if depth > 3:
        return out
    for c in a.findall(node, m.Call()):
        fname = (dotted(c.func) or "").rsplit(".", 1)[-1]
        for fn in a.functions.get(fname, []):
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            inner = [p for n in names if (p := _param_for(fn, c, n)) is not None]
            own = [
                n for n in names if n.startswith("self.") and a.class_of(fn) is not None
            ]
            if inner or own:
                out += _changes_reached(a, fn.body, (*inner, *own), depth + 1, seen)
    return out


def _training_loops(a: Analysis, name: str) -> list[cst.CSTNode]:
    """The statements that run the model's training: the outermost loop around each of its
    steps in the step's function, or, where the step's function has none, each call of that
    function (followed through up to three callers: a train_step called from the epoch loop,
    fit(model) called twice from main)."""
    out: list[cst.CSTNode] = []
    several = len(a.models) > 1
    bound = a._propagate([name]) if several else {}
    for step in a.steps:
        fn = a.function_of(step.stmt)
        names = bound.get(fn, set()) | {name}
        if several and not names & set(step.models):
            continue
        work: list[tuple[cst.CSTNode, int]] = [(step.stmt, 0)]
        while work:
            node, depth = work.pop()
            outer, cur = None, a.parent.get(node)
            fn = a.function_of(node)
            while cur is not None and cur is not fn:
                if isinstance(cur, (cst.For, cst.While)):
                    outer = cur
                cur = a.parent.get(cur)
            if outer is None and depth > 0:
                outer = a.statement(node)  # a call of the function that trains
            if outer is not None and not any(outer is o for o in out):
                out.append(outer)
            if fn is not None and depth < 3:
                work += [(c, depth + 1) for c in a.callers(fn)]
    return out


def training_start(a: Analysis, name: str) -> int | None:
    """The first line of the model's training (see _training_loops), or None."""
    loops = _training_loops(a, name)
    return min((a.pos[x].start.line for x in loops), default=None)
