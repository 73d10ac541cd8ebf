"""How each training forward of a model reaches the DDP wrapper: the model keeps its name (the
plain module) and the wrapper gets one of its own, so every training forward (loss_flow.py) must
name the wrapper where it runs. Directly, where the wrapper is in scope (the function that wraps
the model, a global wrap read from a function, `self.ddp_model` in the methods of the class that
wraps `self.model`, `trainer.ddp_model` on an instance of it, a local alias of any of these), or
by handing the wrapper to the function whose parameter runs the forward (`train(ddp_model, ...)`,
through as many calls as it takes). What cannot be reached is said, not guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

import ddpify.match as m
from ddpify.analysis.core import Analysis
from ddpify.analysis.loss_flow import TrainingForward, alias_of, loss_flow, model_ref
from ddpify.analysis.tree import dotted


@dataclass
class Route:
    name: str  # the model as the wrap names it: "model", "self.model"
    scope: cst.FunctionDef | None  # the function that binds (and wraps) it
    cls: (
        cst.ClassDef | None
    )  # for `self.X`: the class whose methods reach the wrapper as self.<W>
    direct: list[tuple[TrainingForward, cst.BaseExpression, str]] = field(
        default_factory=list
    )  # (forward, node to replace, holder)
    handed: list[tuple[cst.Call, cst.BaseExpression, str]] = field(
        default_factory=list
    )  # (call, argument to replace, holder)
    holders: list[tuple[cst.FunctionDef, str]] = field(
        default_factory=list
    )  # functions whose parameter is the wrapper
    holder_forwards: list[tuple[TrainingForward, str]] = field(
        default_factory=list
    )  # forwards run by a holder's parameter
    unresolved: list[tuple[TrainingForward, str]] = field(default_factory=list)

    def forwards(self) -> list[TrainingForward]:
        return [f for f, _, _ in self.direct] + [f for f, _ in self.holder_forwards]

    def sites(self) -> list[cst.CSTNode]:
        """Every node the wrapper is needed at, in the scope that wraps it or below."""
        return [n for _, n, _ in self.direct] + [c for c, _, _ in self.handed]


def route(a: Analysis, name: str, bind: cst.CSTNode) -> Route:
    """The route of every training forward that runs the model bound to `name` at `bind`."""
    scope = a.function_of(bind)
    cls = a.class_of(scope) if name.startswith("self.") and scope is not None else None
    r = Route(name, scope, cls)
    for tf in loss_flow(a).forwards:
        _route_forward(a, r, bind, tf)
    return r


def _route_forward(
    a: Analysis, r: Route, bind: cst.CSTNode, tf: TrainingForward
) -> None:
    how = reaches(a, r, bind, tf.receiver)
    if how is not None:
        r.direct.append((tf, how[0], how[1]))
        return
    recv = tf.receiver
    fn = a.function_of(recv)
    if isinstance(recv, cst.Name) and fn is not None and recv.value in _params(fn):
        found = _hand(a, r, bind, fn, recv.value, 0)
        if found:
            r.holder_forwards.append((tf, recv.value))
        elif found is None:
            r.unresolved.append(
                (
                    tf,
                    f"`{recv.value}` is a parameter of {fn.name.value}(), and a caller hands it a model ddpify cannot follow",
                )
            )
        return
    d = dotted(recv) or ""
    attr = r.name.split(".", 1)[1] if r.cls is not None else None
    if d == r.name or (
        attr is not None
        and isinstance(recv, cst.Attribute)
        and recv.attr.value == attr
        and "." not in attr
    ):
        # the model's name, where its wrapper is not in scope: another function's own `model`,
        # an instance's attribute ddpify cannot tie to the class that wraps it
        r.unresolved.append(
            (tf, f"`{d}` names the model here, where its wrapper is not in scope")
        )


def _hand(
    a: Analysis,
    r: Route,
    bind: cst.CSTNode,
    fn: cst.FunctionDef,
    param: str,
    depth: int,
) -> bool | None:
    """The callers of fn that hand this model to `param` get the wrapper there (or, through
    their own parameter, from their callers). True: some caller hands this model; False: none
    does (another model, or a plain one); None: a caller hands something ddpify cannot follow."""
    if depth > 4:
        return None
    if (fn, param) in r.holders:
        return True
    hit, lost = False, False
    for c in a.callers(fn):
        arg = a.argument_for(c, fn, param)
        if arg is None:
            continue
        how = reaches(a, r, bind, arg)
        if how is not None:
            if all(x is not c for x, _, _ in r.handed):
                r.handed.append((c, how[0], how[1]))
            hit = True
            continue
        g = a.function_of(c)
        if isinstance(arg, cst.Name) and g is not None and arg.value in _params(g):
            sub = _hand(a, r, bind, g, arg.value, depth + 1)
            hit = hit or bool(sub)
            lost = lost or sub is None
        elif model_ref(a, arg) is None:
            lost = lost or a.is_model_ref(arg)
    if hit:
        r.holders.append((fn, param))
        return True
    return None if lost else False


def reaches(
    a: Analysis, r: Route, bind: cst.CSTNode, node: cst.CSTNode
) -> tuple[cst.BaseExpression, str] | None:
    """(the node to replace, the expression that names the wrapper's holder there) where node
    names this model and the wrapper is in scope: "" for the wrapper's own name, "self" for
    self.<W>, "trainer" for trainer.<W>. None elsewhere."""
    d = dotted(node)
    if d is None:
        return None
    fn = a.function_of(node)
    if d == r.name:
        if r.cls is not None:
            return (
                (node, "self") if fn is not None and a.class_of(fn) is r.cls else None
            )  # type: ignore[return-value]
        if fn is r.scope or _nested_in(a, fn, r.scope):
            return node, ""  # type: ignore[return-value]
        if (
            r.scope is None
            and fn is not None
            and not a._is_local(fn, d.split(".")[0])
            and a.global_visible(d, node, bind)
        ):
            return node, ""  # type: ignore[return-value]
        return None
    if isinstance(node, cst.Name):
        value = alias_of(a, node)
        if value is not None and reaches(a, r, bind, value) is not None:
            return node, reaches(a, r, bind, value)[1]  # type: ignore[index,return-value]
        return None
    if (
        r.cls is not None
        and isinstance(node, cst.Attribute)
        and isinstance(node.value, cst.Name)
        and "." in r.name
    ):
        # trainer.model, where trainer = Trainer(...) and Trainer wraps self.model
        attr = r.name.split(".", 1)[1]
        if (
            node.attr.value == attr
            and "." not in attr
            and _instance_of(a, node.value, r.cls)
        ):
            return node, node.value.value  # type: ignore[return-value]
    return None


def _instance_of(a: Analysis, name: cst.Name, cls: cst.ClassDef) -> bool:
    """`name` holds an instance of cls: built by it, or by a function of the script that returns one."""
    fn = a.function_of(name)
    for asg in a.assigns:
        if (
            not isinstance(asg, cst.Assign)
            or a.function_of(asg) not in (fn, None)
            or not isinstance(asg.value, cst.Call)
        ):
            continue
        if any(dotted(t.target) == name.value for t in asg.targets) and _builds(
            a, asg.value, cls, 0
        ):
            return True
    return False


def _builds(a: Analysis, call: cst.Call, cls: cst.ClassDef, depth: int) -> bool:
    last = (dotted(call.func) or "").rsplit(".", 1)[-1]
    if last == cls.name.value:
        return True
    for f in a.functions.get(last, []) if depth < 3 else []:
        for ret in a.findall(f.body, m.Return()):
            if isinstance(ret.value, cst.Call) and _builds(
                a, ret.value, cls, depth + 1
            ):
                return True
    return False


def _nested_in(
    a: Analysis, fn: cst.FunctionDef | None, outer: cst.FunctionDef | None
) -> bool:
    """fn is defined inside outer (a closure sees outer's names)."""
    while fn is not None and outer is not None:
        fn = a.function_of(fn)
        if fn is outer:
            return True
    return False


def _params(fn: cst.FunctionDef) -> set[str]:
    return {p.name.value for p in fn.params.params} | {
        p.name.value for p in fn.params.kwonly_params
    }


# What DDP itself answers the same way as the wrapped module.
PASSTHROUGH = {
    "train",
    "eval",
    "parameters",
    "named_parameters",
    "zero_grad",
    "forward",
    "no_sync",
    "to",
    "cuda",
    "cpu",
    "training",
    "requires_grad_",
    "module",
    "float",
    "half",
    "bfloat16",
    "double",
    "type",
    "register_forward_hook",
    "register_forward_pre_hook",
}


def module_uses(
    a: Analysis, r: Route, fn: cst.FunctionDef, param: str
) -> list[cst.Name]:
    """Reads of a holder's parameter (the wrapper there) that need the plain module: every use
    but its training forwards, what DDP answers like the module (train(), parameters(),
    no_sync(), ...), handing it on to another holder, and binding the name."""
    holders = {(id(f), p) for f, p in r.holders}
    training = {id(tf.call) for tf, _ in r.holder_forwards}
    out = []
    for n in a.findall(fn.body, m.Name(param)):
        if (
            a.function_of(n) is fn
            and not _is_attr_name(a, n)
            and not _keeps_wrapper(a, n, holders, training)
        ):
            out.append(n)
    return out


def _keeps_wrapper(
    a: Analysis, use: cst.Name, holders: set, training: set[int]
) -> bool:
    par = a.parent.get(use)
    if isinstance(par, cst.Call) and par.func is use:
        return id(par) in training
    if isinstance(par, cst.Attribute) and par.value is use:
        call = a.parent.get(par)
        if isinstance(call, cst.Call) and call.func is par and id(call) in training:
            return True  # model.loss(x): routed through the adapter (routing.py)
        return par.attr.value in PASSTHROUGH
    if isinstance(par, cst.Arg):
        call = a.parent.get(par)
        if isinstance(call, cst.Call):
            for g in a.functions.get((dotted(call.func) or "").rsplit(".", 1)[-1], []):
                for p in _params(g):
                    if (id(g), p) in holders and a.argument_for(call, g, p) is use:
                        return True
        return False
    if isinstance(par, (cst.AssignTarget, cst.Param)) or (
        isinstance(par, (cst.AugAssign, cst.AnnAssign)) and par.target is use
    ):
        return True
    if (
        isinstance(par, cst.Element)
        and isinstance(a.parent.get(par), (cst.Tuple, cst.List))
        and isinstance(a.parent.get(a.parent.get(par)), cst.AssignTarget)
    ):
        return True  # model, opt = ...
    return False


def _is_attr_name(a: Analysis, n: cst.Name) -> bool:
    par = a.parent.get(n)
    return (isinstance(par, cst.Attribute) and par.attr is n) or (
        isinstance(par, cst.Arg) and par.keyword is n
    )
