"""Uses of a model that decide whether and how it can be wrapped: a name bound again to a new
model after the wrap (`model = Net(); model.load_state_dict(best)`: the wrapper no longer holds
it), and models run through a container that holds them (no wrapper can be named there). Every
other use keeps the plain module under its own name (routes.py)."""

from __future__ import annotations

import libcst as cst

import ddpify.match as m
from ddpify.analysis.core import Analysis
from ddpify.analysis.tree import _path, code, dotted, reads_name


# -- uses after the wrap -------------------------------------------------------------------------
def rebound_unwrapped(
    a: Analysis, name: str, anchor: cst.CSTNode, node: cst.CSTNode
) -> bool:
    """The name was bound to a new (unwrapped) model between the wrap and node, in the same
    function: `model = Net(); model.load_state_dict(torch.load(best))` after training."""
    fn = a.function_of(node)
    if a.function_of(anchor) is not fn:
        return False
    start, end = a.pos[anchor].end.line, a.pos[node].start.line
    for asg in a.assigns:
        if a.function_of(asg) is not fn or not isinstance(
            asg, (cst.Assign, cst.AnnAssign)
        ):
            continue
        line = a.pos[asg].start.line
        if not start < line < end:
            continue
        targets = (
            [t.target for t in asg.targets]
            if isinstance(asg, cst.Assign)
            else [asg.target]
        )
        if any(dotted(t) == name for t in targets) and not _keeps_wrapper(
            asg.value, name
        ):
            return True
    return False


def _keeps_wrapper(value: cst.BaseExpression | None, name: str) -> bool:
    """`model = model.to(x)`, `model = torch.compile(model)`: still the wrapped model."""
    if value is None:
        return True
    return reads_name(value, name)  # not `model = avg.model`: another module


# -- models the wrap cannot name -------------------------------------------------------------------
def container_models(a: Analysis) -> list[tuple[cst.Call, str]]:
    """Optimizers over a model held in a dict or list (`nets["G"].parameters()`): ddpify does not
    rewrite every use of a container's entry, so these are for a manual wrap."""
    out: list[tuple[cst.Call, str]] = []
    for call in a.optimizers.values():
        for c in a.findall(
            call,
            m.Call(
                func=m.Attribute(attr=m.Name("parameters") | m.Name("named_parameters"))
            ),
        ):
            base = c.func.value  # type: ignore[attr-defined]
            if isinstance(base, cst.Subscript) or (_path(base) or "").find(".[]") >= 0:
                out.append((call, code(base)))
    return out


def forward_through_container(a: Analysis, name: str) -> tuple[cst.CSTNode, str] | None:
    """`nets = [encoder, decoder]` then `nets[0](x)` or `for net in nets: net(x)`: the container
    keeps the module itself, so its forwards bypass a wrap of the name (no gradient sync), while
    its state dicts need the plain module: no single wrap serves both. (The container assignment
    and the forward through it, if any.)"""
    for asg in a.assigns:
        if not isinstance(asg, cst.Assign) or len(asg.targets) != 1:
            continue
        holder = dotted(asg.targets[0].target)
        if holder is None or holder == name:
            continue
        held = [
            el
            for el in a.findall(asg.value, m.Name() | m.Attribute())
            if dotted(el) == name and _is_element(a, el)
        ]
        if not held:
            continue
        for c in a.calls:
            if (
                isinstance(c.func, cst.Subscript)
                and dotted(c.func.value) == holder
                or dotted(c.func) == holder
            ):
                return asg, holder
        for loop in a.fors:
            if any(
                dotted(x) == holder
                for x in a.findall(loop.iter, m.Name() | m.Attribute())
            ):
                targets = {x.value for x in a.findall(loop.target, m.Name())}
                if any(
                    dotted(c.func) in targets for c in a.findall(loop.body, m.Call())
                ):
                    return asg, holder
    return None


MODULE_CONTAINERS = (
    "torch.nn.Sequential",
    "torch.nn.ModuleList",
    "torch.nn.ModuleDict",
)


def _is_element(a: Analysis, node: cst.CSTNode) -> bool:
    """node is held as it is: an element of a list, tuple, set or dict, or an argument of
    nn.Sequential (a copy, as AveragedModel makes, is not)."""
    par = a.parent.get(node)
    if (
        isinstance(par, (cst.Element, cst.DictElement))
        and getattr(par, "value", None) is node
    ):
        return True
    call = a.parent.get(par) if isinstance(par, cst.Arg) else None
    return isinstance(call, cst.Call) and a.is_call(call, *MODULE_CONTAINERS)
