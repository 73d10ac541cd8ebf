"""Where a model is built: the statement or parameter that binds it for training, what it is
made from (through the callers that hand it over), the node that builds its class, and whether
anything may place it on a device."""

from __future__ import annotations

import libcst as cst

import ddpify.match as m
from ddpify.analysis.core import Analysis
from ddpify.analysis.tree import _flatten_targets, dotted

PLACEMENT_METHODS = ("to", "cuda", "half", "float", "bfloat16", "double", "to_empty")


def binding(a: Analysis, name: str) -> cst.BaseStatement | cst.Param | None:
    """Where the model is bound for the wrap: its assignment in the function that builds its
    optimizer; the parameter of that function when the model is handed in (`def
    train(model, ...): opt = SGD(model.parameters())`: wrapped there, where it trains);
    else its first assignment in a block."""
    opt_fns = {a.function_of(c) for c in a.optimizers_of(name).values()}
    cands = []
    for asg in a.assigns:
        targets = (
            [t.target for t in asg.targets]
            if isinstance(asg, cst.Assign)
            else [asg.target]
        )
        if any(dotted(el) == name for t in targets for el in _flatten_targets(t)):
            stmt = _lift(a, a.statement(asg), name)
            if (
                isinstance(a.block(stmt), (cst.IndentedBlock, cst.Module))
                and stmt not in cands
            ):
                cands.append(stmt)
    # a factory that builds the model and returns it (model, opt, sched = build(cfg)): the
    # model trains where it is returned to, so it is wrapped there
    factories = {
        id(fn)
        for fn in opt_fns
        if fn is not None
        and _returns(a, fn, name)
        and not any(a.function_of(st.stmt) is fn for st in a.steps)
    }
    kept = [s for s in cands if id(a.function_of(s)) not in factories]
    cands = kept or cands
    same = [
        s
        for s in cands
        if a.function_of(s) in opt_fns and id(a.function_of(s)) not in factories
    ]
    if same:
        return same[0]
    for fn in opt_fns:
        if id(fn) in factories:
            continue
        param = next(
            (
                p
                for p in (fn.params.params if fn is not None else ())
                if p.name.value == name
            ),
            None,
        )
        if param is not None and "." not in name:
            return param
    return cands[0] if cands else None


def _lift(a: Analysis, stmt: cst.BaseStatement, name: str) -> cst.BaseStatement:
    """A model built in `if/else` (or try, with) branches is wrapped once, after the
    whole statement, unless the branch goes on to train it."""
    while True:
        block = a.block(stmt)
        if not isinstance(block, cst.IndentedBlock):
            return stmt
        rest = list(block.body)[list(block.body).index(stmt) + 1 :]
        if any(
            isinstance(s, (cst.For, cst.While))
            or a.findall(s, m.For() | m.While())
            or _uses_model(a, s, name)
            for s in rest
        ):
            return stmt
        owner = a.branch_owner(stmt)
        if owner is None:
            return stmt
        stmt = owner


def _uses_model(a: Analysis, stmt: cst.CSTNode, name: str) -> bool:
    """The model runs or is handed to other code: it must be wrapped by then."""
    for c in a.findall(stmt, m.Call()):
        if dotted(c.func) == name:
            return True
        fname = dotted(c.func)
        if (
            fname
            and fname.rsplit(".", 1)[-1] in a.functions
            and any(dotted(x.value) == name for x in c.args)
        ):
            return True
    return False


def module_class(a: Analysis, cls: cst.ClassDef | None) -> bool:
    """cls derives from nn.Module (or another *Module class)."""
    if cls is None:
        return False
    for base in cls.bases:
        d = dotted(base.value) or ""
        if d.endswith("Module") or any(
            q.startswith("torch.nn.") for q in a.qualified(base.value)
        ):
            return True
        inner = a.classes.get(d.rsplit(".", 1)[-1])
        if inner is not None and inner is not cls and module_class(a, inner):
            return True
    return False


def stepped(a: Analysis, name: str) -> bool:
    """Something may step an optimizer over the model's parameters. Only a proof says no: the
    optimizer is bound to a name whose every use in its scope is a learning-rate scheduler's
    argument or one of its own methods other than step() (an auxiliary model whose optimizer
    is built and never stepped). Stepped, handed to a function, returned or kept elsewhere:
    yes (functions of the script are followed to their parameter)."""
    for call in a.optimizer_calls_of(name):
        target = a._assign_target(call)
        par = a.parent.get(call)
        if target is not None:
            if _steps(a, target, None, 0) or not _idle(a, target, a.function_of(call)):
                return True
        elif isinstance(par, cst.Arg) and isinstance(a.parent.get(par), cst.Call):
            # handed over as it is built: train(model, SGD(model.parameters()))
            if _handed_steps(a, a.parent[par], [par], 0):
                return True
        else:
            return True  # returned, kept in a container: unsure means yes
    return False


IDLE = {"zero_grad", "param_groups", "state_dict", "load_state_dict", "add_param_group"}


def _idle(a: Analysis, opt: str, fn: cst.FunctionDef | None) -> bool:
    """Every use of `opt` in fn is a scheduler's argument or an optimizer method that steps
    nothing."""
    scope = fn if fn is not None else a.module
    for node in a.findall(scope, m.Name() | m.Attribute()):
        if (
            dotted(node) != opt
            or isinstance(a.parent.get(node), cst.Attribute)
            and (dotted(a.parent[node]) or "").startswith(opt + ".")
            and a.parent[node].attr.value in IDLE
        ):
            continue
        par = a.parent.get(node)
        if isinstance(par, cst.AssignTarget) or isinstance(par, cst.Attribute):
            continue  # its binding, or a longer path that is not it
        if isinstance(par, cst.Arg):
            call = a.parent.get(par)
            qn = (
                (a.call_qualname(call) or dotted(call.func) or "")
                if isinstance(call, cst.Call)
                else ""
            )
            if "sched" in qn.lower():
                continue
        return False
    return True


def _steps(a: Analysis, opt: str, fn: cst.FunctionDef | None, depth: int) -> bool:
    calls = a.calls if fn is None else a.findall(fn, m.Call())
    # self.opt is stepped through any instance of its class: runner.opt.step()
    attr = opt[5:] if opt.startswith("self.") and opt.count(".") == 1 else None
    for c in calls:
        is_step = isinstance(c.func, cst.Attribute) and c.func.attr.value == "step"
        handed = [x for x in c.args if dotted(x.value) == opt]
        owner = dotted(c.func.value) if is_step else None  # type: ignore[attr-defined]
        if is_step and (
            owner == opt or handed or (attr and (owner or "").endswith("." + attr))
        ):
            return True
        if handed and not is_step and depth <= 3 and _handed_steps(a, c, handed, depth):
            return True
    return False


def _handed_steps(a: Analysis, c: cst.Call, handed: list[cst.Arg], depth: int) -> bool:
    """What `c` is handed as `handed` gets stepped there: in the script's function, followed to
    its parameter (and the attribute it keeps it under); a library's: unless it only
    schedules the learning rate, unsure means yes."""
    fname = (dotted(c.func) or "").rsplit(".", 1)[-1]
    targets = a.functions.get(fname, []) or (
        [
            f
            for f in a.classes[fname].body.body
            if isinstance(f, cst.FunctionDef) and f.name.value == "__init__"
        ]
        if fname in a.classes
        else []
    )
    if not targets:
        return "sched" not in (a.call_qualname(c) or fname).lower()
    for target in targets:
        params = [p.name.value for p in target.params.params]
        for x in handed:
            param = (
                x.keyword.value
                if x.keyword is not None
                else _positional(target, list(c.args).index(x))
            )
            if param is None or param not in params:
                continue
            if _steps(a, param, target, depth + 1):
                return True
            kept = _kept_as(a, target, param)
            cls = a.class_of(target)
            if kept and cls is not None and _steps_in(a, kept, cls):
                return True
    return False


def _positional(fn: cst.FunctionDef, index: int) -> str | None:
    names = [p.name.value for p in fn.params.params]
    if names and names[0] in ("self", "cls") and a_method(fn):
        index += 1
    return names[index] if index < len(names) else None


def a_method(fn: cst.FunctionDef) -> bool:
    return bool(fn.params.params) and fn.params.params[0].name.value == "self"


def _kept_as(a: Analysis, fn: cst.FunctionDef, param: str) -> str | None:
    """`self.optimizer = optimizer` in fn: the attribute a parameter is kept under."""
    for asg in a.findall(fn, m.Assign()):
        if dotted(asg.value) == param:
            for t in asg.targets:
                d = dotted(t.target)
                if d and d.startswith("self."):
                    return d
    return None


def _steps_in(a: Analysis, opt: str, cls: cst.ClassDef) -> bool:
    return any(
        _steps(a, opt, f, 4) for f in cls.body.body if isinstance(f, cst.FunctionDef)
    )


def ever_placed(a: Analysis, name: str, bind) -> bool:
    """Whether anything in the script may put the model on a device: a placement call on
    it, on a name it is handed in under (`model.to(device)` in the entry script, then
    `Trainer(model)`), or in a statement that builds it; a device handed to its constructor,
    or a default device. Unsure means yes: the finding is for scripts that plainly train on CPU."""
    made = origins(a, name, bind)
    names = {name, "self"} | {d for o in made if (d := dotted(o)) is not None}
    names |= a.model_aliases.get(name, set())  # the factory's own name for it
    cls = a.class_of(bind) if name.startswith("self.") else None
    if cls is not None and module_class(a, cls):
        # a part of a module that is placed whole: gan = GAN().to(device) moves self.gen
        for c in a.calls:
            if (dotted(c.func) or "").rsplit(".", 1)[-1] == cls.name.value:
                if (
                    isinstance(a.parent.get(c), cst.Attribute)
                    and a.parent[c].attr.value in PLACEMENT_METHODS
                ):
                    return True
                names |= {
                    dotted(t.target) for t in getattr(a.parent.get(c), "targets", [])
                } - {None}
    names |= {
        dotted(t.target)
        for o in made
        if isinstance(o, cst.SimpleStatementLine)
        for asg in o.body
        if isinstance(asg, cst.Assign)
        for t in asg.targets
    }
    for c in a.calls:
        f = c.func
        if (
            isinstance(f, cst.Attribute)
            and f.attr.value in PLACEMENT_METHODS
            and dotted(f.value) in names
        ):
            return True
        if (
            isinstance(f, cst.Attribute)
            and f.attr.value in PLACEMENT_METHODS
            and isinstance(f.value, cst.Call)
            and any(dotted(x.value) in names for x in f.value.args)
        ):
            return True  # nn.DataParallel(model).cuda() moves the model it holds
        if (
            a.is_call(c, "torch.set_default_device")
            or a.is_call(c, "torch.device")
            and isinstance(a.parent.get(a.parent.get(c)), cst.WithItem)
        ):
            return True
    for node in made:
        for c in a.findall(node, m.Call()) + (
            [node] if isinstance(node, cst.Call) else []
        ):
            if (
                isinstance(c.func, cst.Attribute)
                and c.func.attr.value in PLACEMENT_METHODS
            ):
                return True
            if any(
                x.keyword is not None and "device" in x.keyword.value for x in c.args
            ):
                return True
            if any("device" in (dotted(x.value) or "").lower() for x in c.args):
                return True
            # a model built by the script's own function, or unpickled whole, may already be placed
            if (dotted(c.func) or "").split(".")[0] in a.functions or a.is_call(
                c, "torch.load"
            ):
                return True
    return False


def origins(a: Analysis, name: str, bind) -> list[cst.CSTNode]:
    """What the model is built from: the statement that binds it, and where it is a parameter
    (`def train(model)`, `self.model = model.to(device)` in __init__), what the callers hand it
    and the statements that bind that (the model built in the entry script, handed to a Trainer)."""
    out: list[cst.CSTNode] = []
    work: list[tuple[cst.CSTNode, int]] = [(bind, 0)]
    while work:
        node, depth = work.pop()
        if node is None or any(node is o for o in out) or depth > 4:
            continue
        out.append(node)
        fn = a.function_of(node)
        params: list[str] = []
        if isinstance(node, cst.Param):
            params = [node.name.value]
        elif isinstance(node, cst.SimpleStatementLine) and fn is not None:
            for asg in node.body:
                value = getattr(asg, "value", None)
                while (
                    isinstance(value, cst.Call)
                    and isinstance(value.func, cst.Attribute)
                    and value.func.attr.value in PLACEMENT_METHODS
                ):
                    value = value.func.value  # self.model = model.to(device)
                if isinstance(value, cst.Name) and value.value in {
                    p.name.value for p in fn.params.params
                }:
                    params.append(value.value)
        for p in params:
            for c in a.callers(fn):
                arg = a.argument_for(c, fn, p)
                if arg is None:
                    continue
                work.append((arg, depth + 1))
                if isinstance(arg, cst.Name):  # the caller's binding of it
                    g = a.function_of(c)
                    for asg in a.assigns:
                        if (
                            isinstance(asg, cst.Assign)
                            and a.function_of(asg) is g
                            and any(dotted(t.target) == arg.value for t in asg.targets)
                        ):
                            work.append((a.statement(asg), depth + 1))
                    if g is not None and arg.value in {
                        q.name.value for q in g.params.params
                    }:
                        work.append(
                            (
                                next(
                                    q
                                    for q in g.params.params
                                    if q.name.value == arg.value
                                ),
                                depth + 1,
                            )
                        )
    return out


def build_node(a: Analysis, name: str, bind) -> cst.CSTNode:
    """The node that builds the model (its class's constructor call in it), for reading its class."""
    stmt = (
        bind.body[0]
        if isinstance(bind, cst.SimpleStatementLine) and len(bind.body) == 1
        else bind
    )
    if (
        isinstance(stmt, cst.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0].target, cst.Tuple)
        and isinstance(stmt.value, cst.Tuple)
    ):
        # `actor, critic = Actor(), Critic()`: the element that builds this one
        names = [dotted(el.value) for el in stmt.targets[0].target.elements]
        if name in names and len(names) == len(stmt.value.elements):
            bind = stmt.value.elements[names.index(name)].value
    for node in origins(a, name, bind):
        calls = a.findall(node, m.Call()) + (
            [node] if isinstance(node, cst.Call) else []
        )
        if any(
            (dotted(c.func) or "").rsplit(".", 1)[-1] in a.classes
            or a.call_qualname(c).startswith("torch.nn.")
            for c in calls
        ):
            return node
    return bind


def _returns(a, fn: cst.FunctionDef, name: str) -> bool:
    """fn returns the model to its caller: `return model`, or inside a returned tuple or dict."""
    for ret in a.findall(fn, m.Return()):
        if a.function_of(ret) is not fn or ret.value is None:
            continue
        value = ret.value
        parts = (
            [value]
            if not isinstance(value, (cst.Tuple, cst.List, cst.Dict))
            else (
                [
                    e.value
                    for e in value.elements
                    if isinstance(e, (cst.Element, cst.DictElement))
                ]
            )
        )
        if any(dotted(p) == name for p in parts):
            return True
    return False


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )
