"""What lint's rules ask about a distributed script, on top of the shared analysis: which
framework distributes it, where the model is wrapped (and whether a name means the wrapper or
the plain module at a given line), which calls are collectives (directly or through the script's
functions), and where gradients are off. Computed on demand, once per file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import call_args, code, dotted
from ddpify.lint.ranks import Ranks
from ddpify.lint.reach import Reach

DDP_NAMES = ("torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel",
             "torch.nn.DistributedDataParallel", "apex.parallel.DistributedDataParallel")
FSDP_NAMES = ("torch.distributed.fsdp.FullyShardedDataParallel", "torch.distributed.fsdp.fully_shard",
              "torch.distributed._composable.fsdp.fully_shard", "torch.distributed.fsdp.FullyShardedDataParallel.FullyShardedDataParallel")
SAMPLER_NAMES = ("torch.utils.data.distributed.DistributedSampler", "torch.utils.data.DistributedSampler")
FRAMEWORKS = {
    "accelerate": ("accelerate.",),
    "lightning": ("lightning.", "pytorch_lightning.", "lightning_fabric."),
    "deepspeed": ("deepspeed.",),
    "horovod": ("horovod.",),
    "xla": ("torch_xla.",),
    "colossalai": ("colossalai.",),
    "rpc": ("torch.distributed.rpc.",),  # parameter servers and pipelines over RPC: not DDP's rules
}
# torch.distributed calls every rank of the group must make (point-to-point send/recv are not)
COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "_all_gather_base", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast", "broadcast_object_list",
    "barrier", "monitored_barrier", "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all",
    "all_to_all_single", "new_group", "new_subgroups", "init_process_group",
}
STATE_DICT_GATHERS = ("torch.distributed.checkpoint.state_dict.get_state_dict", "torch.distributed.checkpoint.state_dict.get_model_state_dict",
                      "torch.distributed.checkpoint.state_dict.get_optimizer_state_dict", "torch.distributed.checkpoint.save",
                      "torch.distributed.checkpoint.save_state_dict", "torch.distributed.checkpoint.load",
                      "torch.distributed.fsdp.FullyShardedDataParallel.full_optim_state_dict",
                      "torch.distributed.fsdp.FullyShardedDataParallel.optim_state_dict")
ACCELERATE_COLLECTIVES = {"gather", "gather_for_metrics", "reduce", "pad_across_processes", "wait_for_everyone", "get_state_dict"}
NO_GRAD = ("torch.no_grad", "torch.inference_mode", "torch.enable_grad")
BUFFER_LAYERS = re.compile(r"^(BatchNorm[123]d|SyncBatchNorm|InstanceNorm[123]d|LazyBatchNorm[123]d)$")
# torchvision constructors of models that hold BatchNorm layers (buffers DDP broadcasts each forward)
BN_MODELS = re.compile(r"^(resnet|resnext|wide_resnet|densenet|efficientnet|mobilenet|mnasnet|shufflenet|regnet|inception|googlenet|vgg\d+_bn|convnext)", re.I)
# method names that are not a forward pass (on a model or its wrapper)
NOT_FORWARD = {"parameters", "named_parameters", "state_dict", "load_state_dict", "train", "eval", "zero_grad", "to", "cuda", "cpu",
               "modules", "named_modules", "children", "buffers", "named_buffers", "apply", "requires_grad_", "half", "float",
               "register_forward_hook", "register_buffer", "no_sync", "join"}


@dataclass
class Wrap:
    call: cst.Call
    stmt: cst.CSTNode  # the statement that binds the wrapper
    inner: str | None  # the module wrapped (dotted), as written
    target: str | None  # the name the wrapper is bound to
    kind: str  # "ddp" | "fsdp"
    inner_node: cst.BaseExpression | None = None  # the module argument itself


class Facts:
    def __init__(self, a, text: str, effects) -> None:
        self.a = a
        self.text = text
        self.effects = effects
        self.ranks = Ranks(a, self)
        self.reach = Reach(a, self.ranks, self)
        self._wrapper_memo: dict[tuple[int, int], Wrap | None] = {}

    # -- the script as a whole ----------------------------------------------------------------
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
        return any(any(q.startswith("torch.distributed.") for q in qs) for _, qs in self.qualified_calls) or bool(self.samplers)

    @cached_property
    def samplers(self) -> list[cst.Call]:
        return [c for c, qs in self.qualified_calls if qs & set(SAMPLER_NAMES) or (dotted(c.func) or "").endswith("DistributedSampler")]

    @cached_property
    def wraps(self) -> list[Wrap]:
        a = self.a
        out: list[Wrap] = []
        for call, qs in self.qualified_calls:
            kind = "ddp" if qs & set(DDP_NAMES) else "fsdp" if qs & set(FSDP_NAMES) else None
            if kind is None:
                continue
            pos, kw = call_args(call)
            inner_node = pos[0].value if pos else kw["module"].value if "module" in kw else None
            inner = dotted(inner_node) if inner_node is not None else None
            stmt = a.statement(call)
            target = a._assign_target(call)
            out.append(Wrap(call, stmt, inner, target, kind, inner_node))
            # `return DDP(model)` / `ddp = DDP(m); return ddp`: bound where the function is called
            fn = a.function_of(call)
            values = [call]
            if target and fn is not None and "." not in target:
                values += [r.value for r in a.findall(fn, m.Return()) if r.value is not None and dotted(r.value) == target]
            for v in values:
                for name, caller_fn in a.returned_as(v):
                    for c in a.calls:
                        if a.function_of(c) is caller_fn and a._assign_target(c) == name and (dotted(c.func) or "").rsplit(".", 1)[-1] == fn.name.value:
                            out.append(Wrap(call, a.statement(c), inner, name, kind, inner_node))
        return out

    @cached_property
    def ddp_wraps(self) -> list[Wrap]:
        return [w for w in self.wraps if w.kind == "ddp"]

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
            if any(b != "<value>" and not b.startswith("__ddpify_import_") for names in a.bindings.values() for b in names.get(head, ())):
                return None  # through an imported module: not the script's function
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
                sides[id(cur)] = 1 if child is cur.body else 2 if child is cur.orelse else 0
            child, cur = cur, self.a.parent.get(cur)
        child, cur = y, self.a.parent.get(y)
        while cur is not None:
            if isinstance(cur, (cst.If, cst.IfExp)) and id(cur) in sides:
                side = 1 if child is cur.body else 2 if child is cur.orelse else 0
                if side and sides[id(cur)] and side != sides[id(cur)]:
                    return True
            child, cur = cur, self.a.parent.get(cur)
        return False

    def trained(self, w: Wrap) -> bool:
        """The wrapped model is trained: an optimizer takes its parameters, or a training step
        runs its forward."""
        a = self.a
        if any(n and (n in a.models or n.split(".")[0] in a.models) for n in (w.inner, w.target)):
            return True
        return any(self.wrapper(c.func) is w for s in a.steps for c in self.step_calls(s))

    # -- wrapper or plain module --------------------------------------------------------------
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
        if isinstance(node, cst.IfExp):  # `model.module if ddp else model`: the plain module
            w = self.wrapper(node.body, depth + 1)
            return w if w is not None and self.wrapper(node.orelse, depth + 1) is not None else None
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
            if d.startswith("self.") and (fn is None or wfn is None or a.class_of(fn) is not a.class_of(wfn)):
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
            if isinstance(asg, cst.Assign) and a.function_of(asg) is fn and lo <= self.order(asg) < hi:
                if any(dotted(t.target) == name for t in asg.targets) and not any(w.call is asg.value for w in self.wraps):
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

    def sources(self, expr: cst.BaseExpression | None, depth: int = 0) -> list[cst.BaseExpression]:
        """The expressions a value may come from: itself, or through the names it is assigned
        to in scope, a function's parameters (the callers' arguments), `self` attributes of the
        class and both arms of `x if c else y`."""
        a = self.a
        if expr is None or depth > 4:
            return []
        if isinstance(expr, cst.IfExp):
            return self.sources(expr.body, depth + 1) + self.sources(expr.orelse, depth + 1)
        d = dotted(expr)
        if d is None or d in ("None", "True", "False"):
            return [expr]
        fn = a.function_of(expr)
        values: list[cst.BaseExpression] = []
        if d.startswith("self.") and d.count(".") == 1:
            cls = a.class_of(expr)
            values = [asg.value for asg in a.assigns if isinstance(asg, cst.Assign) and a.class_of(asg) is cls
                      and any(dotted(t.target) == d for t in asg.targets)]
        elif "." not in d:
            param = next((p for p in fn.params.params if p.name.value == d), None) if fn is not None else None
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
                values = a._local_values(fn, d) if fn is not None and a._is_local(fn, d) else a._local_values(None, d)
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
                        if isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString):
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
                kws = [cst.DictElement(cst.SimpleString(repr(x.keyword.value)), x.value) for x in v.args if x.keyword is not None]
                found.append(cst.Dict(kws))
        # train_kwargs.update({...}) in scope
        if isinstance(expr, cst.Name):
            fn = self.a.function_of(expr)
            for c in self.a.calls:
                if dotted(c.func) == f"{expr.value}.update" and self.a.function_of(c) is fn and c.args and depth < 3:
                    found += self._dicts(c.args[0].value, depth + 1)
        return found

    # -- collectives ----------------------------------------------------------------------------
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
                    first = t.elements[0].value if isinstance(t, (cst.Tuple, cst.List)) and t.elements else t
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
        for s in body[start: idx + 1]:
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
        return {id(s.backward) for s in self.a.steps if any(self.wrapper(c.func) is not None for c in self.step_calls(s))}

    def collective(self, call: cst.Call) -> str | None:
        """What the call does that every rank must do too (None: nothing)."""
        a = self.a
        if id(call) in self.ddp_backwards:
            return f"{code(call.func)}() (DDP all-reduces the gradients there)"
        qs = a.qualified(call.func)
        for q in qs:
            if q.startswith("torch.distributed.") and q.rsplit(".", 1)[-1] in COLLECTIVES and ".rpc." not in q:
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
            if meth == "state_dict" and (w := self.wrapper(func.value)) is not None and w.kind == "fsdp":
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
                        if callee in found and callee != name and not self.reach.rank_conditions(c):
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
            if fn is not None and what is not None and not what.startswith("the forward"):
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

    @cached_property
    def spawned(self) -> set[int]:
        """Functions mp.spawn starts (one process a rank); empty where it is not used."""
        out: set[int] = set()
        for c in self.a.calls:
            if self.a.is_call(c, "torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"):
                pos, kw = call_args(c)
                target = pos[0].value if pos else kw["fn"].value if "fn" in kw else None
                for f in self.a.functions.get(((dotted(target) if target is not None else None) or "").rsplit(".", 1)[-1], []):
                    out.add(id(f))
        return out

    # -- gradients off ------------------------------------------------------------------------
    def no_grad(self, node: cst.CSTNode, depth: int = 0) -> bool:
        """node runs with gradients off: in `with torch.no_grad():`, a function decorated so, or
        a function every caller calls so."""
        a = self.a
        cur = a.parent.get(node)
        while cur is not None:
            if isinstance(cur, cst.With) and any(self._no_grad_item(i.item) for i in cur.items):
                return True
            if isinstance(cur, cst.FunctionDef):
                decorators = [d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator for d in cur.decorators]
                if any(a.qualified(d) & {"torch.no_grad", "torch.inference_mode"} for d in decorators):
                    return True
                calls = [c for c in a.callers(cur) if a.function_of(c) is not cur]
                return bool(calls) and depth < 3 and all(self.no_grad(c, depth + 1) for c in calls)
            cur = a.parent.get(cur)
        return False

    def _no_grad_item(self, item: cst.BaseExpression) -> bool:
        if not isinstance(item, cst.Call):
            return False
        qs = self.a.qualified(item.func)
        if qs & {"torch.no_grad", "torch.inference_mode"}:
            return True
        if qs & {"torch.set_grad_enabled", "torch.autograd.set_grad_enabled"} and item.args:
            return m.matches(item.args[0].value, m.Name("False"))
        return False

    # -- the model's class ----------------------------------------------------------------------
    def model_call(self, name: str | None, at: cst.CSTNode, depth: int = 0) -> cst.Call | None:
        """The call that builds the module named `name` (`model = Net(...).to(device)` gives
        `Net(...)`), followed through plain renames."""
        if not name or depth > 3:
            return None
        a = self.a
        fn = a.function_of(at)
        for asg in a.assigns:
            if not (isinstance(asg, cst.Assign) and any(dotted(t.target) == name for t in asg.targets)):
                continue
            if not ("." in name or a.function_of(asg) is fn or a.function_of(asg) is None):
                continue
            base = asg.value
            while isinstance(base, cst.Call) and isinstance(base.func, cst.Attribute) and base.func.attr.value in ("to", "cuda", "float", "half", "cpu", "bfloat16"):
                base = base.func.value
            if isinstance(base, cst.Call) and not any(w.call is base for w in self.wraps) and dotted(base.func):
                return base
            if dotted(base) and dotted(base) != name:
                got = self.model_call(dotted(base), at, depth + 1)
                if got is not None:
                    return got
        return None

    def wrapped_call(self, w: Wrap) -> cst.Call | None:
        """The call that builds the module a wrap wraps: `DDP(Net().cuda())` or `model = Net()`."""
        base = w.inner_node
        while isinstance(base, cst.Call) and isinstance(base.func, cst.Attribute) and base.func.attr.value in ("to", "cuda", "float", "half", "cpu", "bfloat16"):
            base = base.func.value
        if isinstance(base, cst.Call) and dotted(base.func):
            return base
        return self.model_call(dotted(base) if base is not None else w.inner, w.stmt)

    def model_class(self, name: str | None, at: cst.CSTNode, call: cst.Call | None = None) -> cst.ClassDef | str | None:
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
        if "broadcast_buffers" in kw and m.matches(kw["broadcast_buffers"].value, m.Name("False")):
            return "no"
        cls = self.model_class(wrap.inner, wrap.stmt, self.wrapped_call(wrap))
        if isinstance(cls, str):
            return "yes" if BN_MODELS.match(cls.rsplit(".", 1)[-1]) else "maybe"
        if cls is None:
            return "maybe"
        return self._class_buffers(cls, set())

    def _class_buffers(self, cls: cst.ClassDef, seen: set[int]) -> str:
        a = self.a
        if id(cls) in seen:
            return "no"
        seen.add(id(cls))
        verdict = "no"
        for c in a.findall(cls, m.Call()):
            name = (dotted(c.func) or "").rsplit(".", 1)[-1]
            if BUFFER_LAYERS.match(name) or BN_MODELS.match(name) and any(q.startswith("torchvision.") for q in a.qualified(c.func)):
                if not _track_stats_off(c):
                    return "yes"
            elif name == "register_buffer":
                if a.ancestor(c, cst.If) is not None and _inside_class(a, a.ancestor(c, cst.If), cls):
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
    return "track_running_stats" in kw and m.matches(kw["track_running_stats"].value, m.Name("False"))


def _inside_class(a, node: cst.CSTNode, cls: cst.ClassDef) -> bool:
    cur = node
    while cur is not None:
        if cur is cls:
            return True
        cur = a.parent.get(cur)
    return False
