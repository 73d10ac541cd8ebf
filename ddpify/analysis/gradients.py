"""Parameters that may get no gradient in a training step (DDP then needs
find_unused_parameters=True), and models whose every parameter is frozen (never wrapped)."""

from __future__ import annotations

import re

import libcst as cst

import ddpify.match as m
from ddpify.analysis.core import Analysis
from ddpify.analysis.lifecycle import _builds_module, changes_in
from ddpify.analysis.tree import call_args, dotted

# -- parameters that may get no gradient ----------------------------------------------------------
PARAM_FREE = re.compile(
    r"^(ReLU\d*|GELU|SiLU|Mish|LeakyReLU|ELU|Tanh|Sigmoid|Softmax|LogSoftmax|Dropout\d?d?|Identity|Flatten|Unflatten|"
    r"(Adaptive)?(Max|Avg)Pool\dd|Upsample|ZeroPad\dd|Softplus|Hardswish|Hardtanh)$"
)


def unused_parameters(
    a: Analysis,
    bind: cst.CSTNode,
    entries: list[str] | tuple[str, ...] = ("forward",),
    used: set[str] = frozenset(),
) -> list[str]:
    """Why some parameters of the model built in `bind` may get no gradient in a step, where its
    class is defined in this file: a submodule or parameter its forward (and the other methods
    or submodules trained through the wrapper, `entries`) never reaches, one run under
    torch.no_grad() in forward. `used`: attributes (self.x) that get their gradient outside forward,
    read on the way to the loss. Empty where none is seen (or the class is elsewhere)."""
    cls = next(
        (
            a.classes[n]
            for c in a.findall(bind, m.Call())
            if (n := (dotted(c.func) or "").rsplit(".", 1)[-1]) in a.classes
        ),
        None,
    )
    if cls is None:
        return []
    methods = {f.name.value: f for f in cls.body.body if isinstance(f, cst.FunctionDef)}
    init, forward = methods.get("__init__"), methods.get("forward")
    if init is None or forward is None:
        return []
    owned: dict[str, cst.CSTNode] = {}
    for asg in a.findall(init, m.Assign()):
        for t in asg.targets:
            d = dotted(t.target)
            if (
                d
                and d.startswith("self.")
                and d.count(".") == 1
                and isinstance(asg.value, cst.Call)
                and _builds_module(a, asg.value)
            ):
                if not PARAM_FREE.match(
                    (dotted(asg.value.func) or "").rsplit(".", 1)[-1]
                ):
                    owned[d] = asg
    # what forward reaches, through the methods it calls on self
    reached: set[str] = {f"self.{e}" for e in entries if e not in methods} | set(
        used
    )  # run through the wrapper, or read in the loss
    no_grad: set[str] = set()
    always: set[str] = set(reached)
    sides: dict[str, set[tuple[int, bool]]] = {}
    todo, seen = [methods[e] for e in entries if e in methods], set()
    while todo:
        fn = todo.pop()
        if fn.name.value in seen:
            continue
        seen.add(fn.name.value)
        if any(dotted(c.func) == "self" for c in a.findall(fn, m.Call())):
            todo.append(forward)  # self(x) in a method: its forward
        for attr in a.findall(fn, m.Attribute()):
            d = dotted(attr)
            if d and d.startswith("self.") and d.count(".") == 1:
                reached.add(d)
                if d[5:] in methods:
                    todo.append(methods[d[5:]])
                if any(
                    a.is_call(i.item, "torch.no_grad", "torch.inference_mode")
                    for w in _withs_around(a, attr, fn)
                    for i in w.items
                ):
                    no_grad.add(d)
                if fn.name.value in entries:
                    side = _branch_of(a, attr, fn)
                    if side is None:
                        always.add(d)
                    elif (side[0], not side[1]) in sides.get(d, set()):
                        always.add(d)  # in the if and in its else: every step
                    else:
                        sides.setdefault(d, set()).add(side)
    why = [f"{d} is not used in forward" for d in owned if d not in reached]
    why += [f"{d} runs under torch.no_grad() in forward" for d in owned if d in no_grad]
    why += [
        f"{d} is used in forward only under an if"
        for d in owned
        if d in sides and d not in always and d not in no_grad
    ]
    return why


def _branch_of(
    a: Analysis, node: cst.CSTNode, fn: cst.FunctionDef
) -> tuple[int, bool] | None:
    """(id of the innermost if of fn around node, whether node is in its else); None outside any
    if other than `if self.training` (every training step takes that one)."""
    child, cur = node, a.parent.get(node)
    while cur is not None and cur is not fn:
        if (
            isinstance(cur, (cst.If, cst.IfExp))
            and dotted(cur.test) != "self.training"
            and child is not cur.test
        ):
            return id(cur), child is cur.orelse
        child, cur = cur, a.parent.get(cur)
    return None


def _withs_around(
    a: Analysis, node: cst.CSTNode, fn: cst.FunctionDef
) -> list[cst.With]:
    out = []
    cur = a.parent.get(node)
    while cur is not None and cur is not fn:
        if isinstance(cur, cst.With):
            out.append(cur)
        cur = a.parent.get(cur)
    return out


def fully_frozen(
    a: Analysis, name: str, stmts: list[cst.CSTNode]
) -> cst.CSTNode | None:
    """The statement among stmts (those up to the wrap) that freezes every parameter of the
    model, and nothing after it unfreezes any: `name.requires_grad_(False)`, or `p.requires_grad
    = False` for each p in `name.parameters()`. DDP refuses such a module."""
    frozen = None
    for stmt in stmts:
        for node, kind in changes_in(a, stmt, name):
            if kind != "freeze":
                continue
            if (
                isinstance(node, cst.Call)
                and dotted(node.func) == f"{name}.requires_grad_"
            ):
                pos, kw = call_args(node)
                value = (
                    pos[0].value
                    if pos
                    else kw["requires_grad"].value
                    if "requires_grad" in kw
                    else None
                )
                frozen = node if m.matches(value, m.Name("False")) else None
            elif isinstance(node, cst.Assign) and m.matches(
                node.value, m.Name("False")
            ):
                loop = a.ancestor(node, cst.For)
                whole = (
                    loop is not None
                    and m.matches(
                        loop.iter, m.Call(func=m.Attribute(attr=m.Name("parameters")))
                    )
                    and dotted(loop.iter.func.value) == name
                )  # type: ignore[attr-defined]
                direct = whole and a.ancestor(node, cst.If, cst.For) is loop
                frozen = node if direct else frozen
            else:
                frozen = None  # a part unfrozen again, or frozen by a rule
    if frozen is None:
        return None
    later = [
        k
        for s in a.findall(a.function_of(frozen) or a.module, m.SimpleStatementLine())
        if a.pos[s].start.line > a.pos[frozen].start.line
        for _, k in changes_in(a, s, name)
    ]
    return None if "freeze" in later else frozen


def discarded_outputs(a: Analysis, name: str) -> list[cst.CSTNode]:
    """Training forwards of the model whose outputs are partly thrown away (`validity, _, _ =
    D(x)` before a backward in the same block): the parameters behind the discarded ones get no
    gradient from that loss."""
    out: list[cst.CSTNode] = []
    for step in a.steps:
        body = list(step.block.body)  # type: ignore[attr-defined]
        for s in body[: body.index(step.stmt)]:
            for c in a.findall(s, m.Call()):
                par = a.parent.get(c)
                if (
                    dotted(c.func) == name
                    and isinstance(par, cst.Assign)
                    and isinstance(par.targets[0].target, (cst.Tuple, cst.List))
                ):
                    if any(
                        isinstance(e.value, cst.Name) and e.value.value.strip("_") == ""
                        for e in par.targets[0].target.elements
                    ):
                        out.append(c)
    return out
