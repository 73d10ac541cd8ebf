"""Models whose forward runs more than once before one backward (a GAN discriminator run on
real and on fake images, then one backward of the summed loss): DDP broadcasts the module's
buffers in place at every forward, which (before torch 2.13) invalidates what the first
forward saved for backward, such as cudnn BatchNorm's running statistics."""

from __future__ import annotations

import re

import libcst as cst

import ddpify.match as m
from ddpify.analysis.core import Analysis
from ddpify.analysis.lifecycle import _param_for
from ddpify.analysis.model_code import model_code
from ddpify.analysis.tree import call_args, dotted

# what gives a module buffers: torch.nn's normalisation layers with running statistics, spectral
# norm's power-iteration vectors, and the module's own register_buffer
BUFFERED = re.compile(
    r"^(Lazy)?(Sync)?(BatchNorm|InstanceNorm)\dd?$|^spectral_norm$|^register_buffer$"
)
LOOPS = (cst.For, cst.While, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


def repeated_forward(
    a: Analysis, name: str, methods: list[str] | tuple[str, ...] = ()
) -> tuple[cst.Call, cst.Call] | None:
    """(a later forward of the model, the backward it precedes) where the model runs again, or
    in a loop, between the previous backward of the same block and this one; None if each
    backward follows one forward. Forwards in the two arms of one if/else count once, and one
    under torch.no_grad() saves nothing for backward: it harms only a forward before it. `methods`:
    the model's methods that also run as DDP's forward (model.encode(x) through the wrapper)."""
    for step in a.steps:
        names = _names_in(a, name, a.function_of(step.stmt))
        body = list(step.block.body)  # type: ignore[attr-defined]
        idx = body.index(step.stmt)
        start = next(
            (
                k + 1
                for k in range(idx - 1, -1, -1)
                if a.findall(body[k], m.Call(func=m.Attribute(attr=m.Name("backward"))))
            ),
            0,
        )
        calls = [
            c
            for s in body[start : idx + 1]
            for c in a.findall(s, m.Call())
            if _forward_of(c, names, methods)
        ]
        for i, c in enumerate(calls):
            if _in_loop(a, c, step.block) and not _no_grad(a, c):
                return c, step.backward
            if any(
                not _exclusive(a, prev, c) and not _no_grad(a, prev)
                for prev in calls[:i]
            ):
                return c, step.backward
    return None


def _names_in(a: Analysis, name: str, fn: cst.FunctionDef | None) -> set[str]:
    """The model's own name, and the parameter of fn that callers hand it to."""
    names = {name}
    if fn is None:
        return names
    for c in a.calls:
        if (dotted(c.func) or "").rsplit(".", 1)[-1] == fn.name.value and any(
            dotted(x.value) == name for x in c.args
        ):
            p = _param_for(fn, c, name)
            if p is not None:
                names.add(p)
    return names


def _forward_of(call: cst.Call, names: set[str], methods=()) -> bool:
    f = dotted(call.func)
    if f is None:
        return False
    head, _, last = f.rpartition(".")
    return f in names or (head in names and (last == "forward" or last in methods))


def _no_grad(a: Analysis, node: cst.CSTNode) -> bool:
    cur = a.parent.get(node)
    while cur is not None:
        if isinstance(cur, cst.With) and any(
            a.is_call(i.item, "torch.no_grad", "torch.inference_mode")
            for i in cur.items
        ):
            return True
        cur = a.parent.get(cur)
    return False


def _in_loop(a: Analysis, node: cst.CSTNode, block: cst.CSTNode) -> bool:
    cur = a.parent.get(node)
    while cur is not None and cur is not block:
        if isinstance(cur, LOOPS):
            return True
        cur = a.parent.get(cur)
    return False


def _exclusive(a: Analysis, one: cst.CSTNode, other: cst.CSTNode) -> bool:
    """One runs in an if's body and the other in its else (or elif): never both."""
    seen: dict[int, cst.CSTNode] = {}
    child, cur = one, a.parent.get(one)
    while cur is not None:
        if isinstance(cur, (cst.If, cst.IfExp)):
            seen[id(cur)] = child
        child, cur = cur, a.parent.get(cur)
    child, cur = other, a.parent.get(other)
    while cur is not None:
        if id(cur) in seen and isinstance(cur, (cst.If, cst.IfExp)):
            mine, theirs = seen[id(cur)], child
            test = cur.test
            return mine is not theirs and mine is not test and theirs is not test
        child, cur = cur, a.parent.get(cur)
    return False


def may_hold_buffers(a: Analysis, bind: cst.CSTNode, path: str) -> bool:
    """False only where the model's code is read (its class in this file or beside it, or an
    nn.Sequential of torch.nn layers) and nothing in it makes a buffer: a repeated forward of such
    a model broadcasts nothing, and its DDP call stays as it is."""
    mc = model_code(a, bind, path)
    if isinstance(mc, str) or mc.unknown:
        return True
    return any(_makes_buffers(c) for s in mc.scopes for c in mc.a.findall(s, m.Call()))


def _makes_buffers(call: cst.Call) -> bool:
    last = (dotted(call.func) or "").rsplit(".", 1)[-1]
    if not BUFFERED.match(last):
        return False
    if "InstanceNorm" in last:  # running statistics only when asked for
        _, kw = call_args(call)
        return "track_running_stats" in kw and not m.matches(
            kw["track_running_stats"].value, m.Name("False")
        )
    return True
