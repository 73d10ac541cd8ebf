"""Models, optimizers and schedulers: which calls build an optimizer and whose parameters it
takes (so which names are models), models wrapped in DataParallel, the names a model is bound
to as it is passed into functions (is_model_ref), and which names are optimizers.
"""

from __future__ import annotations

import re

import libcst as cst
import ddpify.match as m
from ddpify.analysis.tree import _flatten_targets, call_args, dotted

OPTIM_PREFIXES = (
    "torch.optim.",
    "apex.optimizers.",
    "bitsandbytes.optim.",
    "timm.optim.",
    "transformers.",
)
SCHED_RE = re.compile(
    r"(lr_scheduler|Scheduler|_schedule_with_warmup|LR$|Annealing|OneCycle|StepLR)"
)
OPTIM_RE = re.compile(
    r"(Adam|SGD|RMSprop|Adagrad|Adadelta|Adamax|LBFGS|Lion|Lamb|LAMB|Adafactor|NAdam|RAdam|Optimizer|Muon)"
)


class ModelsMixin:
    def _is_optimizer_call(self, call: cst.Call) -> bool:
        qn = self.call_qualname(call)
        last = qn.rsplit(".", 1)[-1]
        if SCHED_RE.search(qn) or "lr_scheduler" in qn:
            return False
        if any(qn.startswith(p) for p in OPTIM_PREFIXES) and OPTIM_RE.search(last):
            return True
        if OPTIM_RE.search(last) and self._param_sources(call):
            return True
        # chosen by name and given the parameters: getattr(torch.optim, name)(...), a table
        # OPTIMIZERS[name](...), a helper returning an optimizer, a factory handed torch.optim
        # (what the call is named first: following its arguments' names costs more)
        if (
            self._makes_optimizer(call.func)
            or any(self._optim_module(x.value) for x in call.args)
        ) and self._param_sources(call):
            return True
        return False

    def _optim_module(self, node: cst.CSTNode) -> bool:
        """node names a module of optimizers (torch.optim, apex.optimizers, ...)."""
        return isinstance(node, (cst.Name, cst.Attribute)) and any(
            (q + ".").startswith(OPTIM_PREFIXES)
            and q.rstrip(".") in {p.rstrip(".") for p in OPTIM_PREFIXES}
            for q in self.qualified(node)
        )

    def _makes_optimizer(self, func: cst.BaseExpression, depth: int = 0) -> bool:
        """Calling func builds an optimizer: an optimizer class, getattr(<optimizer module>, name),
        an entry of a table of them (a dict or list of classes, lambdas or partials), a lambda or
        a function of the script that returns one, or a name bound to any of these."""
        if depth > 4:
            return False
        if isinstance(func, (cst.Name, cst.Attribute)):
            for q in self.qualified(func):
                if (
                    any(q.startswith(p) for p in OPTIM_PREFIXES)
                    and OPTIM_RE.search(q.rsplit(".", 1)[-1])
                    and not SCHED_RE.search(q)
                ):
                    return True
        if isinstance(func, cst.Call):
            pos, kw = call_args(func)
            if m.matches(func.func, m.Name("getattr")) and pos:
                return self._optim_module(pos[0].value)
            if (
                self.is_call(func, "functools.partial") and pos
            ):  # partial(torch.optim.SGD, lr=0.1)
                return self._makes_optimizer(pos[0].value, depth + 1)
            return False
        if isinstance(func, cst.Lambda):
            return isinstance(func.body, cst.Call) and self._is_optimizer_call_shape(
                func.body, depth
            )
        if isinstance(func, cst.Subscript):  # OPTIMIZERS[name]
            return any(
                self._makes_optimizer(v, depth + 1)
                for v in self._table_values(func.value)
            )
        if isinstance(func, (cst.Name, cst.Attribute)):
            name = dotted(func)
            fn = self.function_of(func)
            values = self._local_values(fn, name) if isinstance(func, cst.Name) else []
            if isinstance(func, cst.Name) and not values and fn is not None:
                values = self._local_values(None, name)
            if any(self._makes_optimizer(v, depth + 1) for v in values):
                return True
            for f in self.functions.get(
                (name or "").rsplit(".", 1)[-1], []
            ):  # def make_optimizer(params): return Adam(params)
                for ret in self.findall(f, m.Return()):
                    if self.function_of(ret) is not f or ret.value is None:
                        continue
                    rets = (
                        self._local_values(f, ret.value.value)
                        if isinstance(ret.value, cst.Name)
                        else [ret.value]
                    )
                    if any(
                        isinstance(r, cst.Call)
                        and self._is_optimizer_call_shape(r, depth)
                        for r in rets
                    ):
                        return True
        return False

    def _is_optimizer_call_shape(self, call: cst.Call, depth: int) -> bool:
        """call builds an optimizer, whatever parameters it is given (a lambda's or helper's own)."""
        qn = self.call_qualname(call)
        if SCHED_RE.search(qn) or "lr_scheduler" in qn:
            return False
        return self._makes_optimizer(call.func, depth + 1)

    def _table_values(self, table: cst.BaseExpression) -> list[cst.BaseExpression]:
        """The entries of a dict or list literal bound to `table` (in its scope or the module)."""
        if isinstance(table, (cst.Dict, cst.List, cst.Tuple)):
            values = [table]
        elif isinstance(table, cst.Name):
            values = self._local_values(
                self.function_of(table), table.value
            ) or self._local_values(None, table.value)
        elif (
            isinstance(table, cst.Attribute)
            and dotted(table)
            and dotted(table).startswith("self.")
        ):
            values = [
                v
                for a in self.assigns
                if isinstance(a, cst.Assign)
                and len(a.targets) == 1
                and dotted(a.targets[0].target) == dotted(table)
                for v in [a.value]
            ]
        else:
            values = []
        out: list[cst.BaseExpression] = []
        for v in values:
            if isinstance(v, cst.Dict):
                out += [e.value for e in v.elements if isinstance(e, cst.DictElement)]
            elif isinstance(v, (cst.List, cst.Tuple)):
                out += [e.value for e in v.elements]
        return out

    def _param_sources(self, call: cst.Call) -> list[str]:
        """Modules whose parameters reach this optimizer call, following names bound in
        the same scope: decay = [p for n, p in model.named_parameters() if ...];
        groups = [{"params": decay}, ...]; AdamW(groups)."""
        cached = self._param_cache.get(id(call))
        if cached is not None:
            return cached
        found: list[str] = []
        fn = self.function_of(call)
        work: list[cst.CSTNode] = [call]
        seen_names: set[str] = set()
        while work and len(seen_names) < 32:
            node = work.pop()
            for c in self.findall(
                node,
                m.Call(
                    func=m.Attribute(
                        attr=m.Name("parameters") | m.Name("named_parameters")
                    )
                ),
            ):
                base = dotted(c.func.value)  # type: ignore[attr-defined]
                if base and base not in found:
                    found.append(base)
                    if (
                        self.function_of(c) is not fn
                    ):  # handed in by a caller: the model lives there
                        self.__dict__.setdefault("_model_sites", []).append(
                            (self.function_of(c), base.split(".")[0])
                        )
            # learner.params(): a method of the program that returns self.net.parameters()
            for c in self.findall(node, m.Call()):
                for base in self._returned_param_sources(c):
                    if base not in found:
                        found.append(base)
            for ref in self.findall(node, m.Name()):
                name = ref.value
                if name in seen_names:
                    continue
                seen_names.add(name)
                values = self._local_values(fn, name)
                for value in values:
                    work.append(value)
                if (
                    not values
                    and fn is not None
                    and name
                    in {p.name.value for p in fn.params.params} - {"self", "cls"}
                ):
                    # Holder(model.parameters()) built into an optimizer in __init__: the callers' arguments
                    for c in self._plain_callers(fn)[:4]:
                        arg = self.argument_for(c, fn, name)
                        if arg is not None:
                            work.append(arg)
        found = self._through_parameters(call, fn, found)
        self._param_cache[id(call)] = found
        return found

    def _plain_callers(self, fn: cst.FunctionDef) -> list[cst.Call]:
        """Calls of fn by its name (its class's for __init__), before the models are known."""
        cls = self.class_of(fn)
        want = (
            cls.name.value
            if fn.name.value == "__init__" and cls is not None
            else fn.name.value
        )
        out = [
            c for c in self.calls if (dotted(c.func) or "").rsplit(".", 1)[-1] == want
        ]
        return out + [
            c for c in self.partial_calls() if dotted(c.args[0].value) == fn.name.value
        ]

    def _through_parameters(self, call: cst.Call, fn, found: list[str]) -> list[str]:
        """`def make_optimizer(net): return SGD(net.parameters())`: the model is what each caller
        hands to `net` (its own name there), not the parameter."""
        if fn is None or self.class_of(fn) is not None and fn.name.value != "__init__":
            return found
        params = {p.name.value for p in fn.params.params} - {"self", "cls"}
        out: list[str] = []
        for base in found:
            head, _, rest = base.partition(".")
            if head not in params or self._local_values(fn, head):
                out.append(base)
                continue
            mapped = []
            for c in self._plain_callers(fn)[:4]:
                arg = self.argument_for(c, fn, head)
                d = dotted(arg) if arg is not None else None
                if d is not None and d != "self":
                    mapped.append(d + (f".{rest}" if rest else ""))
                    self.__dict__.setdefault("_model_sites", []).append(
                        (self.function_of(c), d.split(".")[0])
                    )
            out += [m_ for m_ in mapped if m_ not in out] or [base]
        return out

    def _holder_object(self, name: str, near: cst.CSTNode) -> bool:
        """name is bound to an instance of a class of the program that is no nn.Module (a
        Learner holding self.net): its attribute is the model, not the holder."""
        values = self._local_values(self.function_of(near), name) or self._local_values(
            None, name
        )
        if not values:
            return False
        for v in values:
            if not isinstance(v, cst.Call):
                return False
            cls = self.classes.get((dotted(v.func) or "").rsplit(".", 1)[-1])
            if cls is None or any(self._module_base(b.value) for b in cls.bases):
                return False
        return True

    def _module_base(self, base: cst.BaseExpression, depth: int = 0) -> bool:
        """base is nn.Module, a torch module class, or a class of the program that derives from one
        (or one ddpify cannot read: counted as a module)."""
        q = self.qualified(base)
        if any(
            x.startswith("torch.nn")
            or x.startswith(("pytorch_lightning", "lightning", "timm", "transformers"))
            for x in q
        ):
            return True
        cls = self.classes.get((dotted(base) or "").rsplit(".", 1)[-1])
        if cls is None:
            return (dotted(base) or "") not in ("object", "")
        return depth < 6 and any(
            self._module_base(b.value, depth + 1) for b in cls.bases
        )

    def _returned_param_sources(self, call: cst.Call) -> list[str]:
        """Modules whose parameters a call of one of the program's functions or methods returns,
        as the caller names them: `learner.params()` returning `self.net.parameters()` gives
        learner.net; `trainable(model)` returning `model.parameters()` filtered gives model."""
        name = dotted(call.func)
        if not name or name.rsplit(".", 1)[-1] in ("parameters", "named_parameters"):
            return []
        out: list[str] = []
        receiver = name.rsplit(".", 1)[0] if "." in name else None
        for fn in self.functions.get(name.rsplit(".", 1)[-1], []):
            if self.class_of(fn) is None and receiver and not self._local_module(name):
                continue
            params = [p.name.value for p in fn.params.params]
            for ret in self.findall(fn, m.Return()):
                if self.function_of(ret) is not fn or ret.value is None:
                    continue
                for c in self.findall(
                    ret.value,
                    m.Call(
                        func=m.Attribute(
                            attr=m.Name("parameters") | m.Name("named_parameters")
                        )
                    ),
                ):
                    base = dotted(c.func.value)  # type: ignore[attr-defined]
                    if not base:
                        continue
                    head, _, rest = base.partition(".")
                    if (
                        head == "self"
                        and receiver
                        and self.class_of(fn) is not None
                        and rest
                    ):
                        out.append(f"{receiver}.{rest}")
                    elif head in params and head != "self":
                        arg = self.argument_for(call, fn, head)
                        if arg is not None and dotted(arg):
                            out.append(dotted(arg) + (f".{rest}" if rest else ""))
        return out

    def _local_values(
        self, fn: cst.FunctionDef | None, name: str
    ) -> list[cst.BaseExpression]:
        """Values assigned to a plain name in scope fn (module level when None)."""
        if self._values_by_scope is None:
            index: dict[tuple[int, str], list[cst.BaseExpression]] = {}
            for a in self.assigns:
                if isinstance(a, cst.Assign):
                    targets = [t.target for t in a.targets]
                elif isinstance(a, cst.AnnAssign) and a.value is not None:
                    targets = [a.target]
                else:
                    continue
                for t in targets:
                    if isinstance(t, cst.Name):
                        index.setdefault((id(self.function_of(a)), t.value), []).append(
                            a.value
                        )
            self._values_by_scope = index
        return self._values_by_scope.get((id(fn), name), [])

    def _assigned_names(self) -> set[str]:
        names: set[str] = set()
        for a in self.assigns:
            targets = (
                [t.target for t in a.targets]
                if isinstance(a, cst.Assign)
                else [a.target]
            )
            for t in targets:
                for el in _flatten_targets(t):
                    d = dotted(el)
                    if d:
                        names.add(d)
        for fns in self.functions.values():
            for fn in fns:
                for p in fn.params.params:
                    names.add(p.name.value)
        return names

    def _find_optimizers_and_models(self) -> None:
        # model.configure_optimizers() here; a model handed to a helper that builds its optimizer
        self._model_sites: list[tuple[cst.FunctionDef | None, str]] = self.__dict__.get(
            "_model_sites", []
        )
        assigned = self._assigned_names()
        for call in self.calls:
            qn = self.call_qualname(call)
            target = self._assign_target(call)
            if SCHED_RE.search(qn) or "lr_scheduler" in qn:
                if target:
                    self.schedulers.add(target)
                continue
            if not self._is_optimizer_call(call):
                continue
            self.optimizer_calls.append(call)
            if target:
                self.optimizers[target] = call
            for src in self._param_sources(call):
                parts = src.split(".")
                # model.fc.parameters() -> "model" when "model" is a variable of its own
                chosen = src
                for k in range(1, len(parts)):
                    prefix = ".".join(parts[:k])
                    if (
                        prefix in assigned
                        and prefix != "self"
                        and not self._holder_object(prefix, call)
                    ):
                        chosen = prefix
                        break
                # `self.parameters()` inside the model's own method: the caller's receiver is the model
                if chosen == "self":
                    continue
                if chosen not in self.models and not chosen.endswith(
                    ("_params", "params")
                ):
                    self.models.append(chosen)
        # optimizers built in helper functions: opt = make_optimizer(model)
        for call in self.calls:
            target = self._assign_target(call)
            if not target or self._is_optimizer_call(call):
                continue
            name = dotted(call.func)
            for fn in self.functions.get(name.rsplit(".", 1)[-1] if name else "", []):
                for ret in self.findall(fn, m.Return()):
                    values = [ret.value] if ret.value is not None else []
                    if isinstance(ret.value, cst.Name):  # opt = AdamW(...); return opt
                        values = self._local_values(fn, ret.value.value)
                    for value in values:
                        if isinstance(value, cst.Call) and self._is_optimizer_call(
                            value
                        ):
                            self.optimizers.setdefault(target, value)
                            if not any(value is c for c in self.optimizer_calls):
                                self.optimizer_calls.append(value)
                            # model.configure_optimizers(): `self` there is `model` here
                            receiver = (
                                dotted(call.func.value)
                                if isinstance(call.func, cst.Attribute)
                                else None
                            )
                            if (
                                receiver
                                and "self" in self._param_sources(value)
                                and self.class_of(fn) is not None
                                and receiver != "self"
                            ):
                                if receiver not in self.models:
                                    self.models.append(receiver)
                                self._model_sites.append(
                                    (self.function_of(call), receiver)
                                )

    def _propagate(
        self, names: list[str], start: cst.CSTNode | None = None
    ) -> dict[cst.CSTNode, set[str]]:
        """Scope -> names bound to one of `names` (in the function `start`, the module by
        default), following arguments into functions."""
        bound: dict[cst.CSTNode, set[str]] = {}
        work = [(start, n) for n in names]
        seen: set[tuple[int, str]] = set()
        while work:
            scope, name = work.pop()
            key = (id(scope), name)
            if key in seen:
                continue
            seen.add(key)
            if scope is not None:
                bound.setdefault(scope, set()).add(name)
            for call in self.calls:
                fname = dotted(call.func)
                if not fname and isinstance(call.func, cst.Attribute):
                    fname = (
                        "." + call.func.attr.value
                    )  # Trainer(net).fit(loader): a method of a built object
                pos, kw = call_args(call)
                if (
                    pos
                    and fname in ("functools.partial", "partial")
                    and dotted(pos[0].value) in self.functions
                ):
                    fname, pos = (
                        dotted(pos[0].value),
                        pos[1:],
                    )  # partial(step, model, loss): step(model, loss, ...)
                if not fname:
                    continue
                defs = self.functions.get(fname.rsplit(".", 1)[-1], [])
                if not defs:
                    continue
                for fn in defs:
                    params = [p.name.value for p in fn.params.params]
                    offset = (
                        1
                        if params and params[0] in ("self", "cls") and "." in fname
                        else 0
                    )
                    for i, arg in enumerate(pos):
                        if dotted(arg.value) == name and i + offset < len(params):
                            work.append((fn, params[i + offset]))
                    for k, arg in kw.items():
                        if dotted(arg.value) == name and k in params:
                            work.append((fn, k))
        if start is None:
            bound.setdefault(None, set()).update(names)  # type: ignore[arg-type]
        return bound

    def is_model_ref(self, node: cst.CSTNode) -> bool:
        name = dotted(node)
        if name is None:
            return False
        fn = self.function_of(node)
        if fn is not None and name in self.model_bindings.get(fn, set()):
            return True
        if name in self.model_bindings.get(None, set()):  # type: ignore[arg-type]
            # a local of the same name in another function is not the model
            if (
                fn is not None
                and "." not in name
                and self._is_local(fn, name)
                and not self._binds_model_here(fn, name)
            ):
                return False
            return True
        return False

    def _binds_model_here(self, fn: cst.FunctionDef, name: str, depth: int = 0) -> bool:
        # the function itself creates the model (model = Net(); opt = Adam(model.parameters()),
        # or param groups over its parts: model.backbone.parameters()), or gets it back from a
        # factory of the program that does (model, opt, sched = build(cfg))
        return (
            any(
                self.function_of(c) is fn and _covers(name, self._param_sources(c))
                for c in self.optimizers.values()
            )
            or any(
                self.function_of(c) is fn and dotted(call_args(c)[0][0].value) == name
                for c in self.dataparallel_calls
                if call_args(c)[0]
            )
            or any(
                self.function_of(loop) is fn and n == name
                for loop, n in self.manual_updates
            )
            or (fn, name) in self._model_sites
            or (depth < 3 and self._returned_model(fn, name, depth))
        )

    def _returned_model(self, fn: cst.FunctionDef, name: str, depth: int) -> bool:
        """fn binds name from a call of a function of the program whose return value there (the
        whole value, or the element at the same place of a returned tuple) is a model it built."""
        for asg in self.findall(fn, m.Assign()):
            if (
                self.function_of(asg) is not fn
                or len(asg.targets) != 1
                or not isinstance(asg.value, cst.Call)
            ):
                continue
            target = asg.targets[0].target
            if isinstance(target, (cst.Tuple, cst.List)):
                names = [dotted(el.value) for el in target.elements]
                if name not in names:
                    continue
                index = names.index(name)
            elif dotted(target) == name:
                index = None
            else:
                continue
            for g in self.functions.get(
                (dotted(asg.value.func) or "").rsplit(".", 1)[-1], []
            ):
                if any(
                    self.function_of(st.stmt) is g for st in getattr(self, "steps", ())
                ):
                    continue  # a function that trains the model and hands it back: no factory
                for ret in self.findall(g, m.Return()):
                    if self.function_of(ret) is not g or ret.value is None:
                        continue
                    value = ret.value
                    if index is not None:
                        if not isinstance(value, cst.Tuple) or len(
                            value.elements
                        ) != len(names):
                            continue
                        value = value.elements[index].value
                    if isinstance(value, cst.Name) and self._binds_model_here(
                        g, value.value, depth + 1
                    ):
                        return True
        return False

    def optimizer_calls_of(self, name: str) -> list[cst.Call]:
        """Every call that builds an optimizer over the model's parameters (or parts of them),
        under any name the model had where it was built; two classes may both keep theirs as
        `self.opt`."""
        names = {name} | self.__dict__.get("model_aliases", {}).get(name, set())
        return [
            c
            for c in self.optimizer_calls
            if any(_covers(n, self._param_sources(c)) for n in names)
        ]

    def optimizers_of(self, name: str) -> dict[str, cst.Call]:
        """The optimizers over the model's parameters, or over parts of it (param groups), under
        any name the model had where they were built (a factory's local)."""
        names = {name} | self.__dict__.get("model_aliases", {}).get(
            name, set()
        )  # set before steps are found
        return {
            o: c
            for o, c in self.optimizers.items()
            if any(_covers(n, self._param_sources(c)) for n in names)
        }

    def _picked(
        self, holder: cst.BaseExpression, key: str, near: cst.CSTNode
    ) -> cst.BaseExpression | None:
        """The name bound to holder["key"] in the same function (`model = parts["model"]`)."""
        name = dotted(holder)
        fn = self.function_of(near)
        for asg in self.assigns:
            if (
                not isinstance(asg, cst.Assign)
                or len(asg.targets) != 1
                or self.function_of(asg) is not fn
            ):
                continue
            v = asg.value
            if (
                isinstance(v, cst.Subscript)
                and dotted(v.value) == name
                and len(v.slice) == 1
                and isinstance(v.slice[0].slice, cst.Index)
            ):
                k = v.slice[0].slice.value
                if isinstance(k, cst.SimpleString) and k.evaluated_value == key:
                    return asg.targets[0].target
        return None

    def _follow_factories(self) -> bool:
        """A model built with its optimizer in a factory of the program that does not train it
        and hands it back (`self.net, self.opt, self.sched = build(cfg)`): the model is what the
        one caller binds it to; the factory's name for it stays an alias (model_aliases)."""
        aliases = self.model_aliases
        changed = False
        for i, name in enumerate(list(self.models)):
            if "." in name:
                continue
            fns = {
                id(f): f
                for f in (
                    self.function_of(c) for c in self.optimizers_of(name).values()
                )
                if f is not None
            }
            for fn in fns.values():
                if self.findall(fn, m.Call(func=m.Attribute(attr=m.Name("backward")))):
                    continue  # it trains the model: no factory
                rets = [
                    r.value
                    for r in self.findall(fn, m.Return())
                    if self.function_of(r) is fn and r.value is not None
                ]
                places = {_place(r, name) for r in rets} - {None}
                calls = self.callers(fn)
                if len(places) != 1 or len(calls) != 1:
                    continue
                place = places.pop()
                par = self.parent.get(calls[0])
                if not isinstance(par, cst.Assign) or len(par.targets) != 1:
                    continue
                target = par.targets[0].target
                if isinstance(place, str):  # parts = build(); model = parts["model"]
                    target = self._picked(target, place, calls[0])
                    if target is None:
                        continue
                elif place >= 0:
                    if not isinstance(target, (cst.Tuple, cst.List)) or place >= len(
                        target.elements
                    ):
                        continue
                    target = target.elements[place].value
                new = dotted(target)
                if new and new != name and new not in self.models:
                    self.models[i] = new
                    aliases.setdefault(new, set()).add(name)
                    changed = True
        return changed

    def is_optimizer_ref(self, node: cst.CSTNode) -> bool:
        name = dotted(node)
        if not name:
            return False
        if name in self.optimizers:
            return True
        last = name.rsplit(".", 1)[-1]
        if last in {o.rsplit(".", 1)[-1] for o in self.optimizers}:
            return True
        return (
            bool(re.search(r"(^|_)(opt|optim|optimizer)(_|$)|optimizer", last, re.I))
            and name not in self.schedulers
        )

    def _hand_to_classes(self) -> bool:
        """`Trainer(model, ...)` where Trainer (in this file or another) keeps the model as
        self.model in __init__ and trains it: the model is self.model from there on, wrapped
        where the class last changes it (`self.model = model.to(device)`), not before the call,
        which would wrap it before that move."""
        before = list(self.models)
        if any(self.class_of(s.stmt) is None for s in self.steps):
            return False  # the script trains outside a class too: the model stays where it is
        trainers = {id(self.class_of(s.stmt)) for s in self.steps}
        for name in list(self.models):
            if "." in name:
                continue
            for call in self.calls:
                cls = self.classes.get((dotted(call.func) or "").rsplit(".", 1)[-1])
                if cls is None or id(cls) not in trainers:
                    continue
                init = next(
                    (
                        s
                        for s in cls.body.body
                        if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"
                    ),
                    None,
                )
                if init is None:
                    continue
                params = [p.name.value for p in init.params.params][1:]
                pos, kw = call_args(call)
                param = next(
                    (
                        params[i]
                        for i, a in enumerate(pos)
                        if _unplaced(a.value) == name and i < len(params)
                    ),
                    None,
                )
                param = param or next(
                    (
                        k
                        for k, a in kw.items()
                        if _unplaced(a.value) == name and k in params
                    ),
                    None,
                )
                star = init.params.star_kwarg
                key = (
                    next((k for k, a in kw.items() if _unplaced(a.value) == name), None)
                    if isinstance(star, cst.Param)
                    else None
                )
                if param is None and key is None:
                    continue
                for asg in self.findall(init, m.Assign()):
                    target = (
                        dotted(asg.targets[0].target) if len(asg.targets) == 1 else None
                    )
                    base = asg.value
                    while isinstance(base, cst.Call) and isinstance(
                        base.func, cst.Attribute
                    ):
                        base = base.func.value  # model.to(device).float()
                    by_key = (  # self.model = kwargs["model"].to(device)
                        key is not None
                        and isinstance(base, cst.Subscript)
                        and dotted(base.value) == star.name.value
                        and len(base.slice) == 1
                        and isinstance(base.slice[0].slice, cst.Index)
                        and isinstance(base.slice[0].slice.value, cst.SimpleString)
                        and base.slice[0].slice.value.value[1:-1] == key
                    )
                    if (
                        target
                        and target.startswith("self.")
                        and (by_key or (param is not None and dotted(base) == param))
                    ):
                        self.models[self.models.index(name)] = target
                        break
                else:
                    continue
                break
        return self.models != before


def _place(value: cst.BaseExpression, name: str) -> int | str | None:
    """-1: `return name`; k: `return a, name, ...` with name at k; "key": `return {"key": name}`;
    None: name is not returned."""
    if dotted(value) == name:
        return -1
    if isinstance(value, (cst.Tuple, cst.List)):
        for k, el in enumerate(value.elements):
            if dotted(el.value) == name:
                return k
    if isinstance(value, cst.Dict):
        for el in value.elements:
            if (
                isinstance(el, cst.DictElement)
                and dotted(el.value) == name
                and isinstance(el.key, cst.SimpleString)
            ):
                return el.key.evaluated_value
    return None


def _covers(name: str, sources: list[str]) -> bool:
    """name is one of the modules whose parameters reach an optimizer, or holds one of them."""
    return any(s == name or s.startswith(name + ".") for s in sources)


def _unplaced(node: cst.CSTNode) -> str | None:
    """The name handed on, through placement calls: `base.to(device)` -> "base"."""
    while (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value
        in ("to", "cuda", "float", "half", "double", "bfloat16", "cpu")
    ):
        node = node.func.value
    return dotted(node)
