"""What lint's rules ask about a distributed script, on top of the shared analysis: which
framework distributes it, where the model is wrapped (and whether a name means the wrapper or
the plain module at a given line), which calls are collectives (directly or through the script's
functions), and where gradients are off. Computed on demand, once per file.
"""

from __future__ import annotations

from functools import cached_property

import libcst as cst

from ddpify.analysis.tree import call_args, dotted
from ddpify.lint.collectives import CollectivesMixin
from ddpify.lint.derived import DerivedMixin
from ddpify.lint.ranks import Ranks
from ddpify.lint.reach import Reach
from ddpify.lint.wrappers import Wrap, WrappersMixin

SAMPLER_NAMES = (
    "torch.utils.data.distributed.DistributedSampler",
    "torch.utils.data.DistributedSampler",
)
FRAMEWORKS = {
    "accelerate": ("accelerate.",),
    "lightning": ("lightning.", "pytorch_lightning.", "lightning_fabric."),
    "deepspeed": ("deepspeed.",),
    "horovod": ("horovod.",),
    "xla": ("torch_xla.",),
    "colossalai": ("colossalai.",),
    "rpc": (
        "torch.distributed.rpc.",
    ),  # parameter servers and pipelines over RPC: not DDP's rules
}


class Facts(WrappersMixin, CollectivesMixin, DerivedMixin):
    def __init__(self, a, text: str, effects) -> None:
        self.a = a
        self.text = text
        self.effects = effects
        self.ranks = Ranks(a, self)
        self.reach = Reach(a, self.ranks, self)
        self._wrapper_memo: dict[tuple[int, int], Wrap | None] = {}

    @cached_property
    def qualified_calls(self) -> list[tuple[cst.Call, set[str]]]:
        return [(c, self.a.qualified(c.func)) for c in self.a.calls]

    @cached_property
    def framework(self) -> str | None:
        """A framework that distributes the script itself (its wrap, sampler and launch)."""
        for _, qs in self.qualified_calls:
            for q in qs:
                for name, prefixes in FRAMEWORKS.items():
                    if q.startswith(prefixes):
                        return name
        return None

    @cached_property
    def distributed(self) -> bool:
        """The script is distributed: a process group, a DDP/FSDP wrap, a DistributedSampler,
        mp.spawn, a launcher's flag or a framework."""
        a = self.a
        if a.distributed_api is not None or a.legacy_api is not None or self.framework:
            return True
        return any(
            any(q.startswith("torch.distributed.") for q in qs)
            for _, qs in self.qualified_calls
        ) or bool(self.samplers)

    @cached_property
    def samplers(self) -> list[cst.Call]:
        return [
            c
            for c, qs in self.qualified_calls
            if qs & set(SAMPLER_NAMES)
            or (dotted(c.func) or "").endswith("DistributedSampler")
        ]

    @cached_property
    def spawned(self) -> set[int]:
        """Functions mp.spawn starts (one process a rank); empty where it is not used."""
        out: set[int] = set()
        for c in self.a.calls:
            if self.a.is_call(
                c,
                "torch.multiprocessing.spawn",
                "torch.multiprocessing.start_processes",
            ):
                pos, kw = call_args(c)
                target = pos[0].value if pos else kw["fn"].value if "fn" in kw else None
                for f in self.a.functions.get(
                    ((dotted(target) if target is not None else None) or "").rsplit(
                        ".", 1
                    )[-1],
                    [],
                ):
                    out.add(id(f))
        return out

    def own_call(self, call: cst.Call) -> str | None:
        """The name of the script's own function (or method) a call calls, None for anything
        else: `torch.save(...)` is torch's even where the script defines a `save` of its own."""
        a = self.a
        d = dotted(call.func)
        if not d:
            return None
        last = d.rsplit(".", 1)[-1]
        if last not in a.functions:
            return None
        if "." in d and not d.startswith(("self.", "cls.")) and not a._local_module(d):
            head = d.split(".", 1)[0]
            if any(
                b != "<value>" and not b.startswith("__ddpify_import_")
                for names in a.bindings.values()
                for b in names.get(head, ())
            ):
                return None  # through an imported module: not the script's function
            if all(a.class_of(fn) is None for fn in a.functions[last]):
                return None  # `model.train()` calls a method, never a module-level `train()`
        return last

    def order(self, node: cst.CSTNode) -> int:
        return self.a._order.get(id(node), -1)

    def after(self, node: cst.CSTNode, stmt: cst.CSTNode) -> bool:
        """node comes after the whole of stmt in the source."""
        return self.order(node) >= self.a._subtree_end(stmt)

    def exclusive(self, x: cst.CSTNode, y: cst.CSTNode) -> bool:
        """x and y sit in different branches of one if/elif/else: one run never runs both."""
        sides: dict[int, int] = {}
        child, cur = x, self.a.parent.get(x)
        while cur is not None:
            if isinstance(cur, (cst.If, cst.IfExp)):
                sides[id(cur)] = (
                    1 if child is cur.body else 2 if child is cur.orelse else 0
                )
            child, cur = cur, self.a.parent.get(cur)
        child, cur = y, self.a.parent.get(y)
        while cur is not None:
            if isinstance(cur, (cst.If, cst.IfExp)) and id(cur) in sides:
                side = 1 if child is cur.body else 2 if child is cur.orelse else 0
                if side and sides[id(cur)] and side != sides[id(cur)]:
                    return True
            child, cur = cur, self.a.parent.get(cur)
        return False

    def sources(
        self, expr: cst.BaseExpression | None, depth: int = 0
    ) -> list[cst.BaseExpression]:
        """The expressions a value may come from: itself, or through the names it is assigned
        to in scope, a function's parameters (the callers' arguments), `self` attributes of the
        class and both arms of `x if c else y`."""
        a = self.a
        if expr is None or depth > 4:
            return []
        if isinstance(expr, cst.IfExp):
            return self.sources(expr.body, depth + 1) + self.sources(
                expr.orelse, depth + 1
            )
        d = dotted(expr)
        if d is None or d in ("None", "True", "False"):
            return [expr]
        fn = a.function_of(expr)
        values: list[cst.BaseExpression] = []
        if d.startswith("self.") and d.count(".") == 1:
            cls = a.class_of(expr)
            values = [
                asg.value
                for asg in a.assigns
                if isinstance(asg, cst.Assign)
                and a.class_of(asg) is cls
                and any(dotted(t.target) == d for t in asg.targets)
            ]
        elif "." not in d:
            param = (
                next((p for p in fn.params.params if p.name.value == d), None)
                if fn is not None
                else None
            )
            if param is not None:
                for call in a.callers(fn)[:8]:
                    try:
                        arg = a.argument_for(call, fn, d)
                    except ValueError:
                        arg = None
                    if arg is not None:
                        values.append(arg)
                if not values and param.default is not None:
                    values.append(param.default)
            else:
                values = (
                    a._local_values(fn, d)
                    if fn is not None and a._is_local(fn, d)
                    else a._local_values(None, d)
                )
        if not values:
            return [expr]
        out: list[cst.BaseExpression] = []
        for v in values:
            out += self.sources(v, depth + 1)
        return out

    def loader_args(self, call: cst.Call) -> dict[str, cst.BaseExpression]:
        """DataLoader(...)'s dataset, shuffle, sampler and batch_sampler, also when passed by
        position or in a `**kwargs` dict built in scope (the last value given wins, as in Python)."""
        out: dict[str, cst.BaseExpression] = {}
        names = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler")
        positional = [x for x in call.args if x.keyword is None and not x.star]
        for i, x in enumerate(positional[: len(names)]):
            out[names[i]] = x.value
        for x in call.args:
            if x.keyword is not None:
                out[x.keyword.value] = x.value
            elif x.star == "**":
                for d in self._dicts(x.value):
                    for el in d.elements:
                        if isinstance(el, cst.DictElement) and isinstance(
                            el.key, cst.SimpleString
                        ):
                            out[el.key.evaluated_value] = el.value
        return out

    def _dicts(self, expr: cst.BaseExpression, depth: int = 0) -> list[cst.Dict]:
        found: list[cst.Dict] = []
        for v in self.sources(expr):
            if isinstance(v, cst.Dict):
                found.append(v)
                for el in v.elements:
                    if isinstance(el, cst.StarredDictElement) and depth < 3:
                        found[-1:-1] = self._dicts(el.value, depth + 1)
            elif isinstance(v, cst.Call) and dotted(v.func) == "dict":
                kws = [
                    cst.DictElement(cst.SimpleString(repr(x.keyword.value)), x.value)
                    for x in v.args
                    if x.keyword is not None
                ]
                found.append(cst.Dict(kws))
        # train_kwargs.update({...}) in scope
        if isinstance(expr, cst.Name):
            fn = self.a.function_of(expr)
            for c in self.a.calls:
                if (
                    dotted(c.func) == f"{expr.value}.update"
                    and self.a.function_of(c) is fn
                    and c.args
                    and depth < 3
                ):
                    found += self._dicts(c.args[0].value, depth + 1)
        return found
