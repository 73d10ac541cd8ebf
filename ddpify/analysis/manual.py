"""Parameters updated by hand, with no optimizer (a language model's default path):

    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)

The loop names the model (there is no optimizer over its parameters to find it by), and the
training step around it must keep DDP's gradient averaging (no no_sync()) and cannot go
through a GradScaler (SCALER.step needs an optimizer)."""

from __future__ import annotations

import libcst as cst
import ddpify.match as m
from ddpify.analysis.tree import dotted

# in-place tensor methods that write a parameter
_UPDATES = ("add_", "sub_", "copy_", "addcdiv_", "addcmul_", "mul_", "div_", "lerp_")


def _root(node: cst.CSTNode) -> cst.CSTNode:
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        node = node.value
    return node


class ManualUpdatesMixin:
    def _param_loop_source(self, loop: cst.For) -> tuple[str, str] | None:
        """(module whose parameters the loop walks, loop variable holding each parameter)."""
        it = loop.iter
        if isinstance(
            it, cst.Name
        ):  # params = list(model.parameters()); for p in params
            values = self._local_values(self.function_of(loop), it.value)
            it = values[-1] if values else it
            if m.matches(it, m.Call(func=m.Name("list"))) and it.args:
                it = it.args[0].value
        if not m.matches(
            it,
            m.Call(
                func=m.Attribute(attr=m.Name("parameters") | m.Name("named_parameters"))
            ),
        ):
            return None
        module = dotted(it.func.value)
        target = loop.target
        if (
            it.func.attr.value == "named_parameters"
            and isinstance(target, cst.Tuple)
            and len(target.elements) == 2
        ):
            target = target.elements[1].value
        if not module or not isinstance(target, cst.Name):
            return None
        return module, target.value

    def updates_by_hand(self, loop: cst.For) -> str | None:
        """The module whose parameters `loop` updates from their gradients, or None."""
        found = self._param_loop_source(loop)
        if found is None:
            return None
        module, var = found
        if not any(
            m.matches(_root(attr), m.Name(var))
            for attr in self.findall(loop.body, m.Attribute(attr=m.Name("grad")))
        ):
            return None
        for call in self.findall(loop.body, m.Call(func=m.Attribute())):
            if call.func.attr.value in _UPDATES and m.matches(
                _root(call.func.value), m.Name(var)
            ):
                return module
        for aug in self.findall(loop.body, m.AugAssign()):
            if m.matches(_root(aug.target), m.Name(var)):
                return module
        return None

    def _find_manual_updates(self) -> list[tuple[cst.For, str]]:
        """(loop, model) for each by-hand update loop: model.fc.parameters() gives `model`
        where `model` is a variable of its own."""
        assigned: set[str] | None = None
        out: list[tuple[cst.For, str]] = []
        for loop in self.fors:
            module = self.updates_by_hand(loop)
            if not module:
                continue
            if assigned is None:
                assigned = self._assigned_names()
            parts = module.split(".")
            chosen = next(
                (
                    ".".join(parts[:k])
                    for k in range(1, len(parts))
                    if ".".join(parts[:k]) in assigned and parts[0] != "self"
                ),
                module,
            )
            if chosen != "self":
                out.append((loop, chosen))
        return out

    def manual_update_in(self, stmts: list[cst.BaseStatement]) -> cst.For | None:
        """The first by-hand update loop among stmts (at any depth)."""
        for s in stmts:
            for loop in self.findall(s, m.For()):
                if self.updates_by_hand(loop):
                    return loop
        return None
