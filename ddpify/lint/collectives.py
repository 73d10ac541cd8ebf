"""Collectives: which calls every rank must make together (torch.distributed's collectives, a
forward or backward of a DDP model, a sharded state-dict gather, Accelerate's gather/reduce,
DeepSpeed's save_checkpoint), which of the script's functions run one, and where gradients are off."""

from __future__ import annotations

from functools import cached_property

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import code, dotted

# torch.distributed calls every rank of the group must make (point-to-point send/recv are not)
COLLECTIVES = {
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "_all_gather_base",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "all_to_all",
    "all_to_all_single",
    "new_group",
    "new_subgroups",
    "init_process_group",
}
STATE_DICT_GATHERS = (
    "torch.distributed.checkpoint.state_dict.get_state_dict",
    "torch.distributed.checkpoint.state_dict.get_model_state_dict",
    "torch.distributed.checkpoint.state_dict.get_optimizer_state_dict",
    "torch.distributed.checkpoint.save",
    "torch.distributed.checkpoint.save_state_dict",
    "torch.distributed.checkpoint.load",
    "torch.distributed.fsdp.FullyShardedDataParallel.full_optim_state_dict",
    "torch.distributed.fsdp.FullyShardedDataParallel.optim_state_dict",
)
ACCELERATE_COLLECTIVES = {
    "gather",
    "gather_for_metrics",
    "reduce",
    "pad_across_processes",
    "wait_for_everyone",
    "get_state_dict",
}


class CollectivesMixin:
    @cached_property
    def accelerators(self) -> set[str]:
        out = {"accelerator"}
        for c, qs in self.qualified_calls:
            if "accelerate.Accelerator" in qs:
                t = self.a._assign_target(c)
                if t:
                    out.add(t)
        return out

    @cached_property
    def engines(self) -> set[str]:
        """DeepSpeed engines: `model_engine, optimizer, _, _ = deepspeed.initialize(...)`."""
        out: set[str] = set()
        for c, qs in self.qualified_calls:
            if "deepspeed.initialize" in qs:
                par = self.a.parent.get(c)
                if isinstance(par, cst.Assign):
                    t = par.targets[0].target
                    first = (
                        t.elements[0].value
                        if isinstance(t, (cst.Tuple, cst.List)) and t.elements
                        else t
                    )
                    if dotted(first):
                        out.add(dotted(first))
        return out

    def step_calls(self, step) -> list[cst.Call]:
        """Calls from the start of a training step (after the previous backward in its block)
        to its backward, and one level into the script's functions they call."""
        a = self.a
        body = list(step.block.body)
        idx = body.index(step.stmt)
        start = 0
        for k in range(idx - 1, -1, -1):
            if a.findall(body[k], m.Call(func=m.Attribute(attr=m.Name("backward")))):
                start = k + 1
                break
        calls: list[cst.Call] = []
        for s in body[start : idx + 1]:
            calls += a.findall(s, m.Call())
        for c in list(calls):
            callee = self.own_call(c) or ""
            for fn in a.functions.get(callee, [])[:2]:
                if a.class_of(fn) is None or (dotted(c.func) or "").startswith("self."):
                    calls += a.findall(fn, m.Call())
        return calls

    @cached_property
    def ddp_backwards(self) -> set[int]:
        """backward() calls of a loss computed by a DDP model's forward: DDP all-reduces there."""
        if not self.ddp_wraps:
            return set()
        return {
            id(s.backward)
            for s in self.a.steps
            if any(self.wrapper(c.func) is not None for c in self.step_calls(s))
        }

    def collective(self, call: cst.Call) -> str | None:
        """What the call does that every rank must do too (None: nothing)."""
        a = self.a
        if id(call) in self.ddp_backwards:
            return f"{code(call.func)}() (DDP all-reduces the gradients there)"
        qs = a.qualified(call.func)
        for q in qs:
            if (
                q.startswith("torch.distributed.")
                and q.rsplit(".", 1)[-1] in COLLECTIVES
                and ".rpc." not in q
            ):
                return f"{dotted(call.func) or q}()"
            if q in STATE_DICT_GATHERS:
                return f"{dotted(call.func) or q}() (it gathers the sharded state on every rank)"
        func = call.func
        if isinstance(func, cst.Attribute):
            base = dotted(func.value)
            meth = func.attr.value
            if base in self.accelerators and meth in ACCELERATE_COLLECTIVES:
                return f"{base}.{meth}()"
            if base in self.engines and meth == "save_checkpoint":
                return f"{base}.save_checkpoint() (DeepSpeed saves from every rank)"
            if (
                meth == "state_dict"
                and (w := self.wrapper(func.value)) is not None
                and w.kind == "fsdp"
            ):
                return f"{base}.state_dict() of the FSDP model (it gathers the shards from every rank)"
        w = self.wrapper(func)
        if w is not None and w.kind == "ddp":
            return f"the forward of the DDP model {dotted(func)}"
        return None

    @cached_property
    def sync_functions(self) -> dict[str, tuple[cst.CSTNode, str]]:
        """The script's functions that run a collective every rank must join (directly, or
        through another such function), with the first one they run."""
        a = self.a
        found: dict[str, tuple[cst.CSTNode, str]] = {}
        direct: dict[int, tuple[cst.CSTNode, str]] = {}
        for c in a.calls:
            fn = a.function_of(c)
            if fn is None or id(fn) in direct:
                continue
            what = self.collective(c)
            if what is not None and not self.reach.rank_conditions(c):
                direct[id(fn)] = (c, what)
        for defs in a.functions.values():
            for fn in defs:
                if id(fn) in direct:
                    found[fn.name.value] = direct[id(fn)]
        changed = True
        while changed:
            changed = False
            for name, defs in a.functions.items():
                if name in found:
                    continue
                for fn in defs:
                    for c in a.findall(fn, m.Call()):
                        callee = self.own_call(c)
                        if (
                            callee in found
                            and callee != name
                            and not self.reach.rank_conditions(c)
                        ):
                            found[name] = (c, found[callee][1])
                            changed = True
                            break
                    if name in found:
                        break
        return found

    def sync_point(self, call: cst.Call) -> str | None:
        """A collective, or a call of one of the script's functions that runs one."""
        what = self.collective(call)
        if what is not None:
            return what
        callee = self.own_call(call)
        if callee in self.sync_functions:
            inner = self.sync_functions[callee][1]
            return f"{dotted(call.func)}(), which runs {inner}"
        return None

    def reduced_in_functions(self) -> set[str]:
        """Functions of the script that run a torch.distributed/accelerate collective (not only a
        DDP forward): a value they return is the same on every rank."""
        return self._reducing

    @cached_property
    def _reducing(self) -> set[str]:
        a = self.a
        names: set[str] = set()
        for c in a.calls:
            fn = a.function_of(c)
            what = self.collective(c)
            if (
                fn is not None
                and what is not None
                and not what.startswith("the forward")
            ):
                names.add(fn.name.value)
        changed = True
        while changed:  # through the functions that call them
            changed = False
            for c in a.calls:
                fn = a.function_of(c)
                callee = self.own_call(c)
                if fn is not None and fn.name.value not in names and callee in names:
                    names.add(fn.name.value)
                    changed = True
        return names

    def no_grad(self, node: cst.CSTNode, depth: int = 0) -> bool:
        """node runs with gradients off: in `with torch.no_grad():`, a function decorated so, or
        a function every caller calls so."""
        a = self.a
        cur = a.parent.get(node)
        while cur is not None:
            if isinstance(cur, cst.With) and any(
                self._no_grad_item(i.item) for i in cur.items
            ):
                return True
            if isinstance(cur, cst.FunctionDef):
                decorators = [
                    d.decorator.func
                    if isinstance(d.decorator, cst.Call)
                    else d.decorator
                    for d in cur.decorators
                ]
                if any(
                    a.qualified(d) & {"torch.no_grad", "torch.inference_mode"}
                    for d in decorators
                ):
                    return True
                calls = [c for c in a.callers(cur) if a.function_of(c) is not cur]
                return (
                    bool(calls)
                    and depth < 3
                    and all(self.no_grad(c, depth + 1) for c in calls)
                )
            cur = a.parent.get(cur)
        return False

    def _no_grad_item(self, item: cst.BaseExpression) -> bool:
        if not isinstance(item, cst.Call):
            return False
        qs = self.a.qualified(item.func)
        if qs & {"torch.no_grad", "torch.inference_mode"}:
            return True
        if (
            qs & {"torch.set_grad_enabled", "torch.autograd.set_grad_enabled"}
            and item.args
        ):
            return m.matches(item.args[0].value, m.Name("False"))
        return False
