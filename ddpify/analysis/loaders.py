"""Data loaders: every DataLoader, the name it is bound to (also through `return` into the
callers), its role (train or eval), and where a loader is iterated (for loops, comprehensions,
iter()). A DataLoader is also built by a subclass of the program (its `super().__init__(...)`
is the construction), through a factory that builds a class by name (`getattr(module,
name)(...)`, `eval("module." + name)(...)`, a `config.init_obj("data_loader", module)` that does
so) or a function that returns one; `values_of` follows an expression to what it may be.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst
import ddpify.match as m
from ddpify.analysis.tree import _inside, call_args, dotted, reads_name, text_of

LOADER_NAMES = ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")
# a word of the name (snake_case, camelCase, "valloader"), not any substring: "zoustesteam" is no test set
_WORD = r"(?:^|(?<=[_\W\d])|(?<=[a-z])(?=[A-Z]))"
EVAL_RE = re.compile(_WORD + r"(?i:val(?!ue)|test|eval|dev(?!ice)|holdout)")
TRAIN_RE = re.compile(_WORD + r"(?i:train)")


@dataclass
class Loader:
    call: cst.Call
    stmt: cst.BaseStatement
    target: str | None  # dotted name it is bound to, if any
    role: str  # "train" | "eval"
    dataset: cst.BaseExpression | None
    problem: str | None = None  # why it cannot be sharded automatically
    # a DataLoader subclass: `call` is its super().__init__(...); `site` the call that builds the
    # instance bound to `target` (the class, or a factory); `others` the targets of its other instances
    site: cst.Call | None = None
    cls: str | None = None
    others: list[str] = field(default_factory=list)
    # the function whose parameter `target` is, for a loader built as an argument
    # (fit(model, DataLoader(...)), Trainer(DataLoader(...)))
    scope: cst.FunctionDef | None = None

    @property
    def home(self) -> cst.Call:
        """The call whose value is the loader where the program holds it."""
        return self.site or self.call


class LoadersMixin:
    def _find_loaders(self) -> list[Loader]:
        loaders: list[Loader] = []
        for call in self.calls:
            if not self.is_call(call, *LOADER_NAMES):
                continue
            stmt = self.statement(call)
            target = self._loader_target(call)
            pos, kw = call_args(call)
            dataset = (
                pos[0].value
                if pos
                else (kw["dataset"].value if "dataset" in kw else None)
            )
            scope = None
            if target is None:
                target, scope = self._argument_target(call) or (None, None)
            loaders.append(
                Loader(
                    call=call,
                    stmt=stmt,
                    target=target,
                    role="eval",
                    dataset=dataset,
                    scope=scope,
                )
            )
        loaders += self._subclass_loaders()
        for ld in loaders:
            ld.role = self._loader_role(ld, loaders)
        return loaders

    # -- DataLoader subclasses and factories ----------------------------------------------
    def loader_classes(self) -> dict[str, cst.ClassDef]:
        """The program's classes that are DataLoaders: a base that is DataLoader, or such a class."""
        found = self.__dict__.get("_loader_classes")
        if found is not None:
            return found
        found = {}
        changed = True
        while changed:
            changed = False
            for name, cls in self.classes.items():
                if name not in found and any(
                    self.qualified(b.value) & set(LOADER_NAMES)
                    or (dotted(b.value) or "").rsplit(".", 1)[-1] in found
                    for b in cls.bases
                ):
                    found[name] = cls
                    changed = True
        self._loader_classes = found
        return found

    def _subclass_loaders(self) -> list[Loader]:
        """One Loader per class that subclasses DataLoader directly: its `super().__init__(...)`
        builds every instance of it and of its subclasses."""
        classes = self.loader_classes()
        out: list[Loader] = []
        for name, cls in classes.items():
            if not any(self.qualified(b.value) & set(LOADER_NAMES) for b in cls.bases):
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
            call = next(
                (
                    c
                    for c in self.findall(
                        init, m.Call(func=m.Attribute(attr=m.Name("__init__")))
                    )
                    if m.matches(c.func.value, m.Call(func=m.Name("super")))
                    and self.function_of(c) is init
                ),
                None,
            )
            if call is None:
                continue
            family = {
                n for n in classes if self._derives(classes[n], name, classes)
            } | {name}
            sites = [
                c
                for c in self.calls
                if c is not call and self.constructs(c, {n: classes[n] for n in family})
            ]
            targets = [
                (c, t)
                for c in sites
                for t in [self._assign_target(c) or self._loader_target_of(c)]
                if t
            ]
            pos, kw = call_args(call)
            dataset = (
                pos[0].value
                if pos
                else (kw["dataset"].value if "dataset" in kw else None)
            )
            ld = Loader(
                call=call,
                stmt=self.statement(call),
                target=None,
                role="eval",
                dataset=dataset,
                cls=name,
            )
            if targets:
                # the instance the program trains on, where one is; the others are listed
                trained = [
                    (c, t)
                    for c, t in targets
                    if TRAIN_RE.search(t)
                    or self._iterated_in_training(
                        Loader(c, self.statement(c), t, "eval", None)
                    )
                ]
                ld.site, ld.target = (trained or targets)[0]
                ld.others = [t for c, t in targets if c is not ld.site]
            out.append(ld)
        return out

    def _argument_target(
        self, value: cst.CSTNode
    ) -> tuple[str, cst.FunctionDef] | None:
        """(parameter, function) that `value`, an argument of a call of one of the program's
        functions or classes (its __init__), is bound to there."""
        arg = self.parent.get(value)
        call = self.parent.get(arg)
        if not isinstance(arg, cst.Arg) or not isinstance(call, cst.Call) or arg.star:
            return None
        name = dotted(call.func) or (
            call.func.attr.value if isinstance(call.func, cst.Attribute) else ""
        )
        last = name.rsplit(".", 1)[-1]
        cls = self.classes.get(last)
        defs = (
            [
                f
                for f in cls.body.body
                if isinstance(f, cst.FunctionDef) and f.name.value == "__init__"
            ]
            if cls is not None
            else self.functions.get(last, [])
        )
        if len(defs) != 1:
            return None
        fn = defs[0]
        params = [p.name.value for p in fn.params.params]
        if arg.keyword is not None:
            return (arg.keyword.value, fn) if arg.keyword.value in params else None
        i = [x for x in call.args if x.keyword is None].index(arg)
        i += (
            1
            if params
            and params[0] in ("self", "cls")
            and (cls is not None or "." in name)
            else 0
        )
        return (params[i], fn) if i < len(params) else None

    def _loader_target_of(self, call: cst.Call) -> str | None:
        names = self.returned_as(call)
        return names[0][0] if names else None

    def _derives(
        self,
        cls: cst.ClassDef,
        base: str,
        classes: dict[str, cst.ClassDef],
        depth: int = 0,
    ) -> bool:
        if depth > 8:
            return False
        for b in cls.bases:
            n = (dotted(b.value) or "").rsplit(".", 1)[-1]
            if n == base or (
                n in classes and self._derives(classes[n], base, classes, depth + 1)
            ):
                return True
        return False

    def constructs(
        self, call: cst.Call, classes: dict[str, cst.ClassDef], depth: int = 0
    ) -> bool:
        """call builds an instance of one of `classes`: the class itself, a factory that builds a
        class of the module that holds one by name (getattr(module, name)(...), eval("module." +
        name)(...)), or a function of the program that returns such a call (its parameters bound
        to call's arguments: `config.init_obj("data_loader", module_data)`)."""
        if depth > 4:
            return False
        name = dotted(call.func)
        if name and name.rsplit(".", 1)[-1] in classes:
            return True
        region = self._factory_region(call.func, None, None)
        if region is not None:
            return any(self.region_of(c) == region for c in classes.values())
        fname = (
            name.rsplit(".", 1)[-1]
            if name
            else (
                call.func.attr.value if isinstance(call.func, cst.Attribute) else None
            )
        )
        for fn in self.functions.get(fname or "", []):
            if (
                self.class_of(fn) is None
                and name
                and "." in name
                and not self._local_module(name)
            ):
                continue  # obj.method(...) is not a plain function of the program
            for ret in self.findall(fn, m.Return()):
                if self.function_of(ret) is not fn or ret.value is None:
                    continue
                values = (
                    self._local_values(fn, ret.value.value)
                    if isinstance(ret.value, cst.Name)
                    else [ret.value]
                )
                values = [
                    b
                    for v in values
                    for b in ([v.body, v.orelse] if isinstance(v, cst.IfExp) else [v])
                ]
                for v in values:
                    if not isinstance(v, cst.Call):
                        continue
                    region = self._factory_region(v.func, fn, call)
                    if region is not None and any(
                        self.region_of(c) == region for c in classes.values()
                    ):
                        return True
                    if region is None and self.constructs(v, classes, depth + 1):
                        return True
        return False

    def _factory_region(
        self,
        func: cst.BaseExpression,
        fn: cst.FunctionDef | None,
        site: cst.Call | None,
    ) -> int | None:
        """The file of the program whose class `func` picks by name: getattr(M, name) or
        eval("M." + name), M a local module (or a parameter of fn that `site` passes one to)."""
        if not isinstance(func, cst.Call) or not func.args:
            return None
        if m.matches(func.func, m.Name("getattr")) and len(func.args) > 1:
            mod = func.args[0].value
            if (
                isinstance(mod, cst.Name)
                and fn is not None
                and site is not None
                and mod.value in {p.name.value for p in fn.params.params}
            ):
                arg = self.argument_for(site, fn, mod.value)
                return self.module_region(arg) if arg is not None else None
            return self.module_region(mod)
        if m.matches(func.func, m.Name("eval")):
            head = func.args[0].value
            while isinstance(head, cst.BinaryOperation):
                head = head.left
            text = text_of(head)
            if (
                isinstance(head, cst.FormattedString)
                and head.parts
                and isinstance(head.parts[0], cst.FormattedStringText)
            ):
                text = head.parts[0].value
            if text and "." in text:
                for binder in self.bindings.get(None, {}).get(
                    text.split(".", 1)[0], []
                ):
                    mt = re.match(r"__ddpify_import_\d+_(\d+)__$", binder)
                    if mt:
                        return int(mt.group(1))
        return None

    def values_of(
        self, expr: cst.BaseExpression, depth: int = 0
    ) -> list[cst.BaseExpression]:
        """What expr may evaluate to: a name through its assignments in its scope, `self.x`
        through the assignments to it in its class's methods, tuple unpacking, and the return
        values of the program's functions; an expression that cannot be followed is its own value."""
        if depth > 6:
            return [expr]
        binds = self._assignments_of(expr)
        if not binds:
            return [expr]
        out: list[cst.BaseExpression] = []
        for value, idx, scope in binds:
            for v in self._element(value, idx, depth):
                for leaf in (
                    self._returns_of(v, depth) if isinstance(v, cst.Call) else [v]
                ):
                    out += (
                        self.values_of(leaf, depth + 1)
                        if isinstance(leaf, (cst.Name, cst.Attribute))
                        and not m.matches(leaf, m.Name("None"))
                        else [leaf]
                    )
        return out

    def _assignments_of(
        self, expr: cst.BaseExpression
    ) -> list[tuple[cst.BaseExpression, int | None, cst.CSTNode | None]]:
        name = dotted(expr)
        if (
            name is None
            or name == "None"
            or (isinstance(expr, cst.Attribute) and not name.startswith("self."))
        ):
            return []
        fn = self.function_of(expr)
        cls = self.class_of(expr) if name.startswith("self.") else None
        out = []
        for asg in self.assigns:
            if not isinstance(asg, cst.Assign):
                continue
            if name.startswith("self."):
                if cls is None or self.class_of(asg) is not cls:
                    continue
            elif self.function_of(asg) is not fn:
                continue
            for t in asg.targets:
                tgt = t.target
                if dotted(tgt) == name:
                    out.append((asg.value, None, self.function_of(asg)))
                elif isinstance(tgt, (cst.Tuple, cst.List)):
                    for i, el in enumerate(tgt.elements):
                        if dotted(el.value) == name:
                            out.append((asg.value, i, self.function_of(asg)))
        return out

    def _element(
        self, value: cst.BaseExpression, idx: int | None, depth: int
    ) -> list[cst.BaseExpression]:
        """value, or its element idx where a tuple is unpacked (through the returns of a call)."""
        if idx is None:
            return [value]
        if isinstance(value, (cst.Tuple, cst.List)):
            return [value.elements[idx].value] if idx < len(value.elements) else []
        if isinstance(value, cst.Call):
            out = []
            for r in self._returns_of(value, depth, keep_tuples=True):
                if isinstance(r, (cst.Tuple, cst.List)) and idx < len(r.elements):
                    out.append(r.elements[idx].value)
            return out
        return []

    def _returns_of(
        self, call: cst.Call, depth: int, keep_tuples: bool = False
    ) -> list[cst.BaseExpression]:
        """The values a call of one of the program's functions returns; the call itself otherwise."""
        name = dotted(call.func)
        fname = name.rsplit(".", 1)[-1] if name else None
        defs = [
            f
            for f in self.functions.get(fname or "", [])
            if not (
                self.class_of(f) is None
                and name
                and "." in name
                and not self._local_module(name)
            )
        ]
        if not defs or fname in self.classes:
            return [call]
        out: list[cst.BaseExpression] = []
        for fn in defs:
            for ret in self.findall(fn, m.Return()):
                if self.function_of(ret) is fn and ret.value is not None:
                    out.append(ret.value)
        return out or [call]

    def _loader_target(self, call: cst.Call) -> str | None:
        t = self._assign_target(call)
        if t:
            return t
        par = self.parent.get(call)
        # `return DataLoader(...)` or `train, val = DataLoader(...), DataLoader(...)`
        if isinstance(par, cst.Element):
            tup = self.parent.get(par)
            asg = self.parent.get(tup)
            if isinstance(asg, cst.Assign) and isinstance(
                asg.targets[0].target, (cst.Tuple, cst.List)
            ):
                idx = [e.value for e in tup.elements].index(call)
                els = asg.targets[0].target.elements
                if idx < len(els):
                    return dotted(els[idx].value)
        names = self.returned_as(call)
        return names[0][0] if names else None

    def returned_whole(
        self, value: cst.CSTNode
    ) -> list[tuple[str, cst.FunctionDef | None, int]]:
        """(name, caller, position) where `return a, b` lands whole in one name of the caller
        (`loaders = get_loaders()`): value is the position-th element there."""
        fn = self.function_of(value)
        if fn is None:
            return []
        name = dotted(value) if isinstance(value, cst.Name) else None
        idx = None
        for ret in self.findall(fn, m.Return()):
            if self.function_of(ret) is fn and isinstance(ret.value, cst.Tuple):
                for i, item in enumerate(e.value for e in ret.value.elements):
                    if item is value or (name is not None and dotted(item) == name):
                        idx = i
        if idx is None:
            return []
        out = []
        for call in self.callers(fn):
            asg = self.parent.get(call)
            if (
                isinstance(asg, cst.Assign)
                and len(asg.targets) == 1
                and dotted(asg.targets[0].target)
            ):
                out.append((dotted(asg.targets[0].target), self.function_of(call), idx))
        return out

    def returned_as(
        self, value: cst.CSTNode
    ) -> list[tuple[str, cst.FunctionDef | None]]:
        """Where a returned value lands in the callers: `return a, b` and `x, y = f()` give
        (y, caller) for b. `value` is the returned expression, or any occurrence of a plain name
        that its function returns."""
        fn = self.function_of(value)
        if fn is None:
            return []
        name = dotted(value) if isinstance(value, cst.Name) else None
        idx: int | None = None
        found = False
        for ret in self.findall(fn, m.Return()):
            if self.function_of(ret) is not fn or ret.value is None:
                continue
            rv = ret.value
            items = (
                [e.value for e in rv.elements] if isinstance(rv, cst.Tuple) else [rv]
            )
            for i, item in enumerate(items):
                if item is value or (name is not None and dotted(item) == name):
                    idx = i if isinstance(rv, cst.Tuple) else None
                    found = True
        if not found:
            return []
        out: list[tuple[str, cst.FunctionDef | None]] = []
        for call in self.callers(fn):
            asg = self.parent.get(call)
            if isinstance(asg, cst.Arg) and idx is None:
                # Solver(get_loader(...), ...): the parameter the returned value binds
                bound = self._parameter_bound(asg)
                if bound is not None:
                    out.append(bound)
                continue
            if not isinstance(asg, cst.Assign) or len(asg.targets) != 1:
                continue
            target = asg.targets[0].target
            if idx is None:
                t = dotted(target)
            elif isinstance(target, (cst.Tuple, cst.List)) and idx < len(
                target.elements
            ):
                t = dotted(target.elements[idx].value)
            else:
                t = None
            if t:
                out.append((t, self.function_of(call)))
        return out

    def _parameter_bound(self, arg: cst.Arg) -> tuple[str, cst.FunctionDef] | None:
        """(parameter, function) that an argument binds in a call of the program's own function
        or class (its __init__), or None."""
        call = self.parent.get(arg)
        if not isinstance(call, cst.Call) or arg.star:
            return None
        name = (dotted(call.func) or "").rsplit(".", 1)[-1]
        fn = None
        if name in self.classes:
            fn = next(
                (
                    f
                    for f in self.classes[name].body.body
                    if isinstance(f, cst.FunctionDef) and f.name.value == "__init__"
                ),
                None,
            )
        elif name in self.functions and len(self.functions[name]) == 1:
            fn = self.functions[name][0]
        if fn is None:
            return None
        params = [p.name.value for p in fn.params.params]
        if params and params[0] in ("self", "cls") and name in self.classes:
            params = params[1:]
        if arg.keyword is not None:
            return (arg.keyword.value, fn) if arg.keyword.value in params else None
        pos = [x for x in call.args if x.keyword is None and not x.star].index(arg)
        return (params[pos], fn) if pos < len(params) else None

    def _loader_role(self, ld: Loader, all_loaders: list[Loader]) -> str:
        names = [
            ld.target or "",
            dotted(ld.dataset) or "" if ld.dataset is not None else "",
        ]
        if isinstance(ld.dataset, cst.Call):
            names.append(dotted(ld.dataset.func) or "")
            _, dkw = call_args(ld.dataset)
            if "train" in dkw and m.matches(dkw["train"].value, m.Name("False")):
                return "eval"
            if "train" in dkw and m.matches(dkw["train"].value, m.Name("True")):
                return "train"
            for a in ld.dataset.args:
                if isinstance(a.value, cst.SimpleString) and EVAL_RE.search(
                    a.value.value
                ):
                    return "eval"
        if self._iterated_in_training(ld, for_loops_only=True):
            return "train"  # a training loop runs over it: what the code does before what names say
        keys = self.trained_keys(ld.call)
        if (
            keys
        ):  # a dict's value: the training reads its key (a comprehension: one of them)
            key = getattr(self.parent.get(ld.call), "key", None)
            if (
                not isinstance(key, cst.SimpleString)
                or "*" in keys
                or key.value in keys
            ):
                return "train"
            return "eval"
        for n in names:
            if TRAIN_RE.search(n):
                return "train"
        for n in names:
            if EVAL_RE.search(n):
                return "eval"
        # function returning loaders: position in `train, val = get_loaders()`
        if ld.target is None:
            fn = self.function_of(ld.call)
            if (
                fn is not None
                and TRAIN_RE.search(fn.name.value)
                and not EVAL_RE.search(fn.name.value)
            ):
                return "train"
        if self._iterated_in_training(ld):
            return "train"
        # built inside evaluate()/test(): an evaluation loader, even when it shuffles
        fn = self.function_of(ld.call)
        if (
            fn is not None
            and EVAL_RE.search(fn.name.value)
            and not TRAIN_RE.search(fn.name.value)
        ):
            return "eval"
        if len(all_loaders) == 1:
            return "train"
        if self._in_eval_function(ld):
            return "eval"  # makemore's evaluate(): shuffled to sample a few batches, not trained on
        _, kw = call_args(ld.call)
        if "shuffle" in kw and m.matches(kw["shuffle"].value, m.Name("True")):
            return "train"
        return "eval"

    # -- loaders kept in a dict ---------------------------------------------------------
    def training_loops(self) -> list[cst.For]:
        """The `for` loops that hold a training step, in their function or around a call that
        leads to it."""
        found = self.__dict__.get("_training_loops")
        if found is not None:
            return found
        out: list[cst.For] = []
        for step in self.steps:
            work, seen = [(step.stmt, 0)], set()
            while work:
                node, depth = work.pop()
                if id(node) in seen or depth > 3:
                    continue
                seen.add(id(node))
                loop = self.enclosing_loop(node)
                while loop is not None:
                    if isinstance(loop, cst.For) and all(loop is not x for x in out):
                        out.append(loop)
                    loop = self.enclosing_loop(loop)
                fn = self.function_of(node)
                if fn is not None:
                    work += [(c, depth + 1) for c in self.callers(fn)]
        self._training_loops = out
        return out

    def fed_by_next(self) -> set[str]:
        """The names a training loop draws its batches from with next(name)."""
        return {
            c.args[0].value.value
            for loop in self.training_loops()
            for c in self.findall(loop.body, m.Call(func=m.Name("next")))
            if c.args and isinstance(c.args[0].value, cst.Name)
        }

    def dict_holders(self, call: cst.CSTNode) -> set[str]:
        """The names of the dict whose value `call` is (`loaders = {"train": DataLoader(...)}`,
        a comprehension over phases, a dict a function returns into its callers); empty where
        it is no dict's value."""
        par = self.parent.get(call)
        if isinstance(par, cst.DictElement) and par.value is call:
            held = self.parent.get(par)
        elif isinstance(par, cst.DictComp) and par.value is call:
            held = par
        else:
            return set()
        names = {
            dotted(t.target) for t in getattr(self.parent.get(held), "targets", ())
        }
        names |= {name for name, _ in self.returned_as(held)}
        return {n for n in names if n}

    def trained_keys(self, call: cst.CSTNode) -> set[str]:
        """The keys (as written: `"train"`) of the dict holding `call` that the training reads:
        a training loop over `loaders["train"]` (also through cycle(), zip(), ...), a name it
        draws from with next() bound to such an expression, or `loaders[phase]` with the step
        under `if phase == "train":`. "*" where it reads a key it cannot tell; empty where the
        training does not read the dict."""
        holders = self.dict_holders(call)
        if not holders:
            return set()
        loops, fed = self.training_loops(), self.fed_by_next()
        keys: set[str] = set()
        for sub in self.findall(self.module, m.Subscript()):
            if dotted(sub.value) not in holders or len(sub.slice) != 1:
                continue
            stmt = self.statement(sub)
            read = any(
                sub is loop.iter or _inside(self, sub, loop.iter) for loop in loops
            ) or (
                isinstance(stmt, cst.SimpleStatementLine)
                and any(
                    isinstance(x, cst.Assign)
                    and any(dotted(t.target) in fed for t in x.targets)
                    for x in stmt.body
                )
            )
            if not read:
                continue
            index = sub.slice[0].slice
            key = index.value if isinstance(index, cst.Index) else None
            if isinstance(key, cst.SimpleString):
                keys.add(key.value)
            elif isinstance(key, cst.Name):
                keys |= self._tested_keys(key.value) or {"*"}
            else:
                keys.add("*")
        return keys

    def _tested_keys(self, name: str) -> set[str]:
        """The strings `name` is compared with by `==` in the `if` tests that hold a training
        step's backward (`if phase == "train":`)."""
        out: set[str] = set()
        for step in self.steps:
            cur = self.parent.get(step.backward)
            while cur is not None:
                t = cur.test if isinstance(cur, cst.If) else None
                if (
                    isinstance(t, cst.Comparison)
                    and len(t.comparisons) == 1
                    and isinstance(t.comparisons[0].operator, cst.Equal)
                ):
                    sides = [t.left, t.comparisons[0].comparator]
                    if any(m.matches(x, m.Name(name)) for x in sides):
                        out |= {
                            x.value for x in sides if isinstance(x, cst.SimpleString)
                        }
                cur = self.parent.get(cur)
        return out

    def _in_eval_function(self, ld: Loader) -> bool:
        """The loader is built in a function that evaluates (named so, or run under
        torch.no_grad()/inference_mode()) and holds no training step."""
        fn = self.function_of(ld.call)
        if fn is None or any(_inside(self, s.stmt, fn) for s in self.steps):
            return False
        decorators = [
            d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator
            for d in fn.decorators
        ]
        if any(
            self.qualified(d) & {"torch.no_grad", "torch.inference_mode"}
            for d in decorators
        ):
            return True
        return bool(EVAL_RE.search(fn.name.value)) and not TRAIN_RE.search(
            fn.name.value
        )

    def _iterated_in_training(self, ld: Loader, for_loops_only: bool = False) -> bool:
        if not ld.target:
            return False
        home = ld.scope or self.function_of(ld.call)
        for loop in self.fors:
            if for_loops_only and self.function_of(loop) is not home:
                continue  # the same name in another function is another loader
            if self.loop_iterates(loop, ld.target) and any(
                self.ancestor(s.stmt, cst.For, cst.While) is loop
                or _inside(self, s.stmt, loop)
                for s in self.steps
            ):
                return True
        if for_loops_only:
            return False
        # handed on: Trainer(model, loader) keeps it as self.loader, a method iterates that
        for site, _ in self.loader_iteration_sites(
            ld.target, ld.scope or self.function_of(ld.home)
        ):
            # a comprehension is its own loop: an evaluation sum(... for x in loader) inside the
            # epoch loop is not the training loop
            loop = (
                site
                if isinstance(site, cst.For)
                else None
                if isinstance(site, cst.CompFor)
                else self.enclosing_loop(self.statement(site))
            )
            if loop is not None and any(
                _inside(self, s.stmt, loop) for s in self.steps
            ):
                return True
            if isinstance(
                site, cst.CompFor
            ):  # [self.step(x, y) for x, y in self.loader]
                called = {
                    (dotted(c.func) or "").rsplit(".", 1)[-1]
                    for c in self.findall(self.parent.get(site), m.Call())
                }
                if any(
                    _inside(self, s.stmt, fn)
                    for name in called
                    for fn in self.functions.get(name, [])
                    for s in self.steps
                ):
                    return True
        return False

    def loop_iterates(self, loop: cst.For, name: str) -> bool:
        return reads_name(loop.iter, name)

    def loader_iteration_sites(
        self, name: str, origin: cst.CSTNode | None = None, element: int | None = None
    ) -> list[tuple[cst.CSTNode, str]]:
        """(for-loop, comprehension or iter() call, name used there) for every place `name` (or a
        parameter bound to it) is iterated. element: `name` holds a tuple of loaders and the loader
        is its element-th (`loaders = get_loaders()`, later `self.train_loader = loaders[0]`)."""
        if origin is not None and name in {p.name.value for p in origin.params.params}:
            bound = self._propagate(
                [name], origin
            )  # a parameter: fit(model, DataLoader(...))
            bound.setdefault(origin, set()).add(name)
        else:
            bound = self._propagate([name])
        # pbar = tqdm(loader): iterating the wrapper iterates the loader, whose
        # name (not the wrapper's) is what the sampler hangs off
        wrapped: dict[str, str] = {}
        for asg in self.assigns:
            if (
                isinstance(asg, cst.Assign)
                and isinstance(asg.value, cst.Call)
                and len(asg.targets) == 1
            ):
                alias = dotted(asg.targets[0].target)
                fn = self.function_of(asg)
                names = bound.get(fn, set()) | bound.get(None, set())
                inner = next(
                    (
                        dotted(x.value)
                        for x in asg.value.args
                        if dotted(x.value) in names
                    ),
                    None,
                )
                if alias and inner:
                    bound.setdefault(fn, set()).add(alias)
                    wrapped[alias] = inner
        # Trainer(model, loader): the class's __init__ receives it
        for call in self.calls:
            cls = self.classes.get((dotted(call.func) or "").rsplit(".", 1)[-1])
            init = (
                next(
                    (
                        s
                        for s in cls.body.body
                        if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"
                    ),
                    None,
                )
                if cls
                else None
            )
            if init is None:
                continue
            params = [p.name.value for p in init.params.params][1:]
            pos, kw = call_args(call)
            names = bound.get(self.function_of(call), set()) | bound.get(None, set())  # type: ignore[arg-type]
            for i, arg in enumerate(pos):
                if dotted(arg.value) in names and i < len(params):
                    bound.setdefault(init, set()).add(params[i])
            for k, arg in kw.items():
                if dotted(arg.value) in names and k in params:
                    bound.setdefault(init, set()).add(k)
        if element is not None:
            # the tuple's element: what is bound to name[element], wherever name reaches
            holders, bound = bound, {}
            for asg in self.assigns:
                if not (
                    isinstance(asg, cst.Assign)
                    and len(asg.targets) == 1
                    and isinstance(asg.value, cst.Subscript)
                ):
                    continue
                sub, fn = asg.value, self.function_of(asg)
                idx = sub.slice[0].slice if len(sub.slice) == 1 else None
                if not (
                    isinstance(idx, cst.Index)
                    and isinstance(idx.value, cst.Integer)
                    and int(idx.value.value) == element
                ):
                    continue
                target = dotted(asg.targets[0].target)
                if target and dotted(sub.value) in holders.get(fn, set()) | holders.get(
                    None, set()
                ):
                    bound.setdefault(
                        None if target.startswith("self.") else fn, set()
                    ).add(target)  # type: ignore[arg-type]
        # self.loader = loader in a method: the class's methods reach it as self.loader
        for asg in self.assigns:
            if not isinstance(asg, cst.Assign) or len(asg.targets) != 1:
                continue
            target, value = asg.targets[0].target, asg.value
            pairs = [(target, value)]
            if (
                isinstance(target, cst.Tuple)
                and isinstance(value, cst.Tuple)
                and len(target.elements) == len(value.elements)
            ):
                pairs = [
                    (t.value, v.value) for t, v in zip(target.elements, value.elements)
                ]  # self.a, self.b = a, b
            fn = self.function_of(asg)
            for t, v in pairs:
                attr = dotted(t)
                if (
                    isinstance(v, cst.Name)
                    and fn is not None
                    and attr
                    and attr.startswith("self.")
                    and v.value in bound.get(fn, set())
                ):
                    bound.setdefault(None, set()).add(attr)  # type: ignore[arg-type]
        sites: list[tuple[cst.CSTNode, str]] = []
        for loop in self.fors:
            fn = self.function_of(loop)
            visible = (
                fn is None
                or fn is origin
                or "." in name
                or not self._is_local(fn, name)
            )
            names = bound.get(fn, set()) | {
                n
                for n in bound.get(None, set())
                if visible and (fn is origin or self.global_visible(n, loop, origin))
            }  # type: ignore[arg-type]
            for n in sorted(names, key=lambda n: ("." in n, n)):
                if self.loop_iterates(loop, n):
                    sites.append((loop, wrapped.get(n, n)))
                    break
        # [step(x, y) for x, y in loader]: a comprehension is a pass over the loader too
        for comp in self._bytype.get(cst.CompFor, []):
            fn = self.function_of(comp)
            names = bound.get(fn, set()) | {
                n
                for n in bound.get(None, set())
                if fn is origin or self.global_visible(n, comp, origin)
            }  # type: ignore[arg-type]
            used = next(
                (
                    n
                    for n in sorted(names, key=lambda n: ("." in n, n))
                    if reads_name(comp.iter, n)
                ),
                None,
            )
            if used is not None:
                sites.append((comp, wrapped.get(used, used)))
        for call in self.calls:
            if (
                m.matches(call.func, m.Name("iter"))
                and call.args
                and dotted(call.args[0].value) is not None
            ):
                fn = self.function_of(call)
                names = bound.get(fn, set()) | bound.get(None, set())  # type: ignore[arg-type]
                if dotted(call.args[0].value) in names:
                    sites.append((call, dotted(call.args[0].value)))  # type: ignore[arg-type]
        return sites
