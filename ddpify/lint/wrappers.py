"""Where the model is wrapped, and whether a name means the DDP wrapper or the plain module at a
given line (`model` before `model = DDP(model)`, `model.module`, a set-up method called before the
wrap); which module a wrap wraps, its class, whether it is trained and whether it has buffers."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import call_args, dotted

DDP_NAMES = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.nn.DistributedDataParallel",
    "apex.parallel.DistributedDataParallel",
)
# DDP applied in place: the module keeps its name (torch's composable replicate)
IN_PLACE_NAMES = ("torch.distributed._composable.replicate",)
FSDP_NAMES = (
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_shard",
    "torch.distributed._composable.fsdp.fully_shard",
    "torch.distributed.fsdp.FullyShardedDataParallel.FullyShardedDataParallel",
)
BUFFER_LAYERS = re.compile(
    r"^(BatchNorm[123]d|SyncBatchNorm|InstanceNorm[123]d|LazyBatchNorm[123]d)$"
)
# torchvision constructors of models that hold BatchNorm layers (buffers DDP broadcasts each forward)
BN_MODELS = re.compile(
    r"^(resnet|resnext|wide_resnet|densenet|efficientnet|mobilenet|mnasnet|shufflenet|regnet|inception|googlenet|vgg\d+_bn|convnext)",
    re.I,
)
# method names that are not a forward pass (on a model or its wrapper)
NOT_FORWARD = {
    "parameters",
    "named_parameters",
    "state_dict",
    "load_state_dict",
    "train",
    "eval",
    "zero_grad",
    "to",
    "cuda",
    "cpu",
    "modules",
    "named_modules",
    "children",
    "buffers",
    "named_buffers",
    "apply",
    "requires_grad_",
    "half",
    "float",
    "register_forward_hook",
    "register_buffer",
    "no_sync",
    "join",
}


@dataclass
class Wrap:
    call: cst.Call
    stmt: cst.CSTNode  # the statement that binds the wrapper
    inner: str | None  # the module wrapped (dotted), as written
    target: str | None  # the name the wrapper is bound to
    kind: str  # "ddp" | "fsdp"
    inner_node: cst.BaseExpression | None = None  # the module argument itself


class WrappersMixin:
    @cached_property
    def wraps(self) -> list[Wrap]:
        a = self.a
        out: list[Wrap] = []
        for call, qs in self.qualified_calls:
            kind = (
                "ddp"
                if qs & set(DDP_NAMES)
                else "fsdp"
                if qs & set(FSDP_NAMES)
                else None
            )
            if kind is None:
                continue
            pos, kw = call_args(call)
            inner_node = (
                pos[0].value if pos else kw["module"].value if "module" in kw else None
            )
            inner = dotted(inner_node) if inner_node is not None else None
            stmt = a.statement(call)
            target = a._assign_target(call)
            out.append(Wrap(call, stmt, inner, target, kind, inner_node))
            # `return DDP(model)` / `ddp = DDP(m); return ddp`: bound where the function is called
            fn = a.function_of(call)
            values = [call]
            if target and fn is not None and "." not in target:
                values += [
                    r.value
                    for r in a.findall(fn, m.Return())
                    if r.value is not None and dotted(r.value) == target
                ]
            for v in values:
                for name, caller_fn in a.returned_as(v):
                    for c in a.calls:
                        if (
                            a.function_of(c) is caller_fn
                            and a._assign_target(c) == name
                            and (dotted(c.func) or "").rsplit(".", 1)[-1]
                            == fn.name.value
                        ):
                            out.append(
                                Wrap(
                                    call, a.statement(c), inner, name, kind, inner_node
                                )
                            )
        return out

    @cached_property
    def in_place(self) -> list[cst.Call]:
        """DDP applied to a module in place (torch's composable replicate, or a function of the
        file that applies it to the module it is handed, as ddpify's ddp_in_place does): the
        module keeps its name and is no wrapper, so the wrapper's rules do not apply to it."""
        return [
            call
            for call, qs in self.qualified_calls
            if qs & set(IN_PLACE_NAMES) or self._applies_in_place(call)
        ]

    def _applies_in_place(self, call: cst.Call) -> bool:
        """A function of the file that applies torch's replicate to the module it is handed
        (ddpify's ddp_in_place)."""
        a = self.a
        name = (dotted(call.func) or "").rsplit(".", 1)[-1]
        return any(
            any(
                (dotted(c.func) or "").rsplit(".", 1)[-1] == "replicate"
                for c in a.findall(fn, m.Call())
            )
            for fn in a.functions.get(name, [])
        )

    @cached_property
    def ddp_wraps(self) -> list[Wrap]:
        return [w for w in self.wraps if w.kind == "ddp"]

    def trained(self, w: Wrap) -> bool:
        """The wrapped model is trained: an optimizer takes its parameters, or a training step
        runs its forward."""
        a = self.a
        if any(
            n and (n in a.models or n.split(".")[0] in a.models)
            for n in (w.inner, w.target)
        ):
            return True
        return any(
            self.wrapper(c.func) is w for s in a.steps for c in self.step_calls(s)
        )

    def wrapper(self, node: cst.CSTNode | None, depth: int = 0) -> Wrap | None:
        """The wrap whose wrapper `node` holds where it is (None: not a wrapper, or the plain
        module: `model` before `model = DDP(model)`, `model.module`, a function reached before
        the wrap)."""
        if node is None or depth > 4:
            return None
        key = (id(node), depth)
        if key in self._wrapper_memo:
            return self._wrapper_memo[key]
        self._wrapper_memo[key] = None
        got = self._wrapper(node, depth)
        self._wrapper_memo[key] = got
        return got

    def _wrapper(self, node: cst.CSTNode, depth: int) -> Wrap | None:
        a = self.a
        if isinstance(
            node, cst.IfExp
        ):  # `model.module if ddp else model`: the plain module
            w = self.wrapper(node.body, depth + 1)
            return (
                w
                if w is not None and self.wrapper(node.orelse, depth + 1) is not None
                else None
            )
        if isinstance(node, cst.Call) and any(w.call is node for w in self.wraps):
            return next(w for w in self.wraps if w.call is node)
        d = dotted(node)
        if d is None or d.endswith(".module"):
            return None
        fn = a.function_of(node)
        for w in self.wraps:
            if w.target != d:
                continue
            wfn = a.function_of(w.stmt)
            if fn is wfn:
                if self.after(node, w.stmt) and not self._rebound(d, fn, w.stmt, node):
                    return w
                continue
            if "." not in d and fn is not None and a._is_local(fn, d):
                continue  # a local of another function
            if "." not in d and wfn is not None:
                continue  # a local of the wrap's function
            if d.startswith("self.") and (
                fn is None or wfn is None or a.class_of(fn) is not a.class_of(wfn)
            ):
                continue
            if fn is not None and self._only_before(fn, w):
                continue
            return w
        if "." in d or fn is None:
            return None
        param = next((p for p in fn.params.params if p.name.value == d), None)
        if param is not None:
            for call in a.callers(fn)[:8]:
                try:
                    arg = a.argument_for(call, fn, d)
                except ValueError:
                    arg = None
                w = self.wrapper(arg, depth + 1) if arg is not None else None
                if w is not None:
                    return w
            return None
        if a._is_local(fn, d):
            for v in a._local_values(fn, d):
                if self.order(v) < self.order(node):
                    w = self.wrapper(v, depth + 1)
                    if w is not None:
                        return w
        return None

    def _rebound(self, name: str, fn, start: cst.CSTNode, node: cst.CSTNode) -> bool:
        """`name` is bound to something else than the wrapper between the wrap and node."""
        a = self.a
        lo, hi = a._subtree_end(start), self.order(node)
        for asg in a.assigns:
            if (
                isinstance(asg, cst.Assign)
                and a.function_of(asg) is fn
                and lo <= self.order(asg) < hi
            ):
                if any(dotted(t.target) == name for t in asg.targets) and not any(
                    w.call is asg.value for w in self.wraps
                ):
                    return True
        return False

    def _only_before(self, fn: cst.FunctionDef, w: Wrap, depth: int = 0) -> bool:
        """fn runs only before the wrap: every call of it is in the wrap's function, before it
        (a set-up method `__init__` calls before `self.model = DDP(self.model)`)."""
        a = self.a
        calls = [c for c in a.callers(fn) if a.function_of(c) is not fn]
        if not calls or depth > 3:
            return False
        wfn = a.function_of(w.stmt)
        for c in calls:
            cfn = a.function_of(c)
            if cfn is wfn:
                if self.after(c, w.stmt) or self.order(c) >= self.order(w.stmt):
                    return False
            elif cfn is None or not self._only_before(cfn, w, depth + 1):
                return False
        return True

    def plain_of(self, node: cst.CSTNode) -> Wrap | None:
        """The wrap whose plain module node names: `model` before (or without) `model = DDP(model)`,
        `ddp.module`, the module a differently named wrapper wraps."""
        d = dotted(node)
        if d is None:
            return None
        if d.endswith(".module"):
            return self.wrapper(node.value)  # type: ignore[attr-defined]
        if self.wrapper(node) is not None:
            return None
        for w in self.wraps:
            if w.inner == d and w.inner != w.target:
                return w
        return None

    def model_call(
        self, name: str | None, at: cst.CSTNode, depth: int = 0
    ) -> cst.Call | None:
        """The call that builds the module named `name` (`model = Net(...).to(device)` gives
        `Net(...)`), followed through plain renames."""
        if not name or depth > 3:
            return None
        a = self.a
        fn = a.function_of(at)
        for asg in a.assigns:
            if not (
                isinstance(asg, cst.Assign)
                and any(dotted(t.target) == name for t in asg.targets)
            ):
                continue
            if not (
                "." in name or a.function_of(asg) is fn or a.function_of(asg) is None
            ):
                continue
            base = asg.value
            while (
                isinstance(base, cst.Call)
                and isinstance(base.func, cst.Attribute)
                and base.func.attr.value
                in ("to", "cuda", "float", "half", "cpu", "bfloat16")
            ):
                base = base.func.value
            if (
                isinstance(base, cst.Call)
                and not any(w.call is base for w in self.wraps)
                and dotted(base.func)
            ):
                return base
            if dotted(base) and dotted(base) != name:
                got = self.model_call(dotted(base), at, depth + 1)
                if got is not None:
                    return got
        return None

    def wrapped_call(self, w: Wrap) -> cst.Call | None:
        """The call that builds the module a wrap wraps: `DDP(Net().cuda())` or `model = Net()`."""
        base = w.inner_node
        while (
            isinstance(base, cst.Call)
            and isinstance(base.func, cst.Attribute)
            and base.func.attr.value
            in ("to", "cuda", "float", "half", "cpu", "bfloat16")
        ):
            base = base.func.value
        if isinstance(base, cst.Call) and dotted(base.func):
            return base
        return self.model_call(dotted(base) if base is not None else w.inner, w.stmt)

    def model_class(
        self, name: str | None, at: cst.CSTNode, call: cst.Call | None = None
    ) -> cst.ClassDef | str | None:
        """The class of the script that builds the module named `name` (or, for a library
        model, the constructor's dotted name)."""
        call = call or self.model_call(name, at)
        if call is None:
            return None
        cname = (dotted(call.func) or "").rsplit(".", 1)[-1]
        return self.a.classes.get(cname) or dotted(call.func)

    def buffers(self, wrap: Wrap) -> str:
        """Whether the wrapped model has buffers DDP broadcasts at each forward: "yes", "maybe"
        (only under a condition, or the class is not in this program) or "no"."""
        _, kw = call_args(wrap.call)
        if "broadcast_buffers" in kw and m.matches(
            kw["broadcast_buffers"].value, m.Name("False")
        ):
            return "no"
        call = self.wrapped_call(wrap)
        return self._call_buffers(call, set()) if call is not None else "maybe"

    def _call_buffers(self, call: cst.Call, seen: set[int], depth: int = 0) -> str:
        """Buffers of the module a call builds: a class of the script, a torchvision model, a
        container given its layers (nn.Sequential(..., nn.BatchNorm1d(8))), a function of the
        script that returns one, SyncBatchNorm's conversion of one."""
        a = self.a
        name = (dotted(call.func) or "").rsplit(".", 1)[-1]
        if name in a.classes:
            return self._class_buffers(a.classes[name], seen)
        if BN_MODELS.match(name) or name == "convert_sync_batchnorm":
            return "yes"
        inner = [c for c in a.findall(call, m.Call()) if c is not call]
        if any(
            BUFFER_LAYERS.match((dotted(c.func) or "").rsplit(".", 1)[-1])
            and not _track_stats_off(c)
            for c in inner
        ):
            return "yes"
        if depth < 3 and name in a.functions and id(call) not in seen:
            seen.add(id(call))
            verdicts = [
                self._call_buffers(r.value, seen, depth + 1)
                for fn in a.functions[name][:2]
                for r in a.findall(fn, m.Return())
                if isinstance(r.value, cst.Call)
            ]
            if "yes" in verdicts:
                return "yes"
        return "maybe"

    def _class_buffers(self, cls: cst.ClassDef, seen: set[int]) -> str:
        a = self.a
        if id(cls) in seen:
            return "no"
        seen.add(id(cls))
        verdict = "no"
        for c in a.findall(cls, m.Call()):
            name = (dotted(c.func) or "").rsplit(".", 1)[-1]
            if (
                BUFFER_LAYERS.match(name)
                or BN_MODELS.match(name)
                and any(q.startswith("torchvision.") for q in a.qualified(c.func))
            ):
                if not _track_stats_off(c):
                    return "yes"
            elif name == "register_buffer":
                if a.ancestor(c, cst.If) is not None and _inside_class(
                    a, a.ancestor(c, cst.If), cls
                ):
                    verdict = "maybe"
                else:
                    return "yes"
            elif name in a.classes and a.classes[name] is not cls:
                inner = self._class_buffers(a.classes[name], seen)
                if inner == "yes":
                    return "yes"
                if inner == "maybe":
                    verdict = "maybe"
        return verdict


def _track_stats_off(call: cst.Call) -> bool:
    _, kw = call_args(call)
    return "track_running_stats" in kw and m.matches(
        kw["track_running_stats"].value, m.Name("False")
    )


def _inside_class(a, node: cst.CSTNode, cls: cst.ClassDef) -> bool:
    cur = node
    while cur is not None:
        if cur is cls:
            return True
        cur = a.parent.get(cur)
    return False
