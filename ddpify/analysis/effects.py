"""What a piece of code does that matters across ranks: runs the model (a forward pass, directly
or through a function that does), or runs a collective (torch.distributed, a forward pass of a
DDP model, torch.load that gets a barrier), transitively through the script's functions.
"""

from __future__ import annotations

import libcst as cst
import ddpify.match as m
from ddpify.analysis.tree import dotted


# methods of a module that run no forward
NOT_FORWARD = frozenset(
    {
        "parameters",
        "named_parameters",
        "buffers",
        "named_buffers",
        "modules",
        "named_modules",
        "children",
        "named_children",
        "state_dict",
        "load_state_dict",
        "train",
        "eval",
        "to",
        "cuda",
        "cpu",
        "float",
        "half",
        "double",
        "bfloat16",
        "zero_grad",
        "apply",
        "requires_grad_",
        "register_buffer",
        "register_forward_hook",
        "register_forward_pre_hook",
        "add_module",
        "get_submodule",
        "extra_repr",
        "type",
        "share_memory",
        "to_empty",
    }
)


class EffectsMixin:
    def _is_forward_call(self, call: cst.Call) -> bool:
        if self.is_model_ref(call.func):
            return True
        # model.compute_loss(x): a method of the model may run its forward (DDP's, once routed)
        f = call.func
        return (
            isinstance(f, cst.Attribute)
            and f.attr.value not in NOT_FORWARD
            and not f.attr.value.startswith("_")
            and self.is_model_ref(f.value)
        )

    def _is_collective_call(self, call: cst.Call) -> bool:
        if self._is_forward_call(call):
            return True
        f = call.func
        if isinstance(f, cst.Attribute) and f.attr.value == "backward":
            return True  # under DDP, backward all-reduces the gradients
        if (
            isinstance(f, cst.Attribute)
            and f.attr.value == "step"
            and self.is_optimizer_ref(f.value)
        ):
            return (
                True  # the first step of each optimizer compares gradients across ranks
            )
        if any(q.startswith("torch.distributed.") for q in self.qualified(call.func)):
            return True
        # torch.load gets a barrier; model passed to a function may be run there
        if self.is_call(call, "torch.load"):
            return True
        return False

    def _functions_matching(self, pred) -> set[str]:
        names: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, defs in self.functions.items():
                if name in names:
                    continue
                for fn in defs:
                    for c in self.findall(fn, m.Call()):
                        if pred(c) or self._calls_function_in(c, names):
                            names.add(name)
                            changed = True
                            break
                    if name in names:
                        break
        return names

    def _calls_function_in(self, call: cst.Call, names: set[str]) -> bool:
        fname = dotted(call.func)
        return (
            bool(fname)
            and fname.rsplit(".", 1)[-1] in names
            and fname.rsplit(".", 1)[-1] in self.functions
        )

    def runs_model(self, node: cst.CSTNode) -> bool:
        return any(
            self._is_forward_call(c)
            or self._calls_function_in(c, self.forward_functions)
            or any(
                self.is_model_ref(a.value)
                for a in c.args
                if self._calls_function_in(c, set(self.functions))
            )
            for c in self.findall(node, m.Call())
        )

    def runs_collective(self, node: cst.CSTNode) -> bool:
        return any(
            self._is_collective_call(c)
            or self._calls_function_in(c, self.collective_functions)
            for c in self.findall(node, m.Call())
        )
