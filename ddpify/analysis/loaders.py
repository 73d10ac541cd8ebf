"""Data loaders: every DataLoader, the name it is bound to (also through `return` into the
callers), its role (train or eval), and where a loader is iterated (for loops, iter()).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst
import ddpify.match as m
from ddpify.analysis.tree import _inside, call_args, dotted, reads_name

LOADER_NAMES = ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")
EVAL_RE = re.compile(r"(val|valid|test|eval|dev|holdout)", re.I)
TRAIN_RE = re.compile(r"train", re.I)


@dataclass
class Loader:
    call: cst.Call
    stmt: cst.BaseStatement
    target: str | None  # dotted name it is bound to, if any
    role: str  # "train" | "eval"
    dataset: cst.BaseExpression | None
    problem: str | None = None  # why it cannot be sharded automatically



class LoadersMixin:
    def _find_loaders(self) -> list[Loader]:
        loaders: list[Loader] = []
        for call in self.calls:
            if not self.is_call(call, *LOADER_NAMES):
                continue
            stmt = self.statement(call)
            target = self._loader_target(call)
            pos, kw = call_args(call)
            dataset = pos[0].value if pos else (kw["dataset"].value if "dataset" in kw else None)
            loaders.append(Loader(call=call, stmt=stmt, target=target, role="eval", dataset=dataset))
        for ld in loaders:
            ld.role = self._loader_role(ld, loaders)
        return loaders

    def _loader_target(self, call: cst.Call) -> str | None:
        t = self._assign_target(call)
        if t:
            return t
        par = self.parent.get(call)
        # `return DataLoader(...)` or `train, val = DataLoader(...), DataLoader(...)`
        if isinstance(par, cst.Element):
            tup = self.parent.get(par)
            asg = self.parent.get(tup)
            if isinstance(asg, cst.Assign) and isinstance(asg.targets[0].target, (cst.Tuple, cst.List)):
                idx = [e.value for e in tup.elements].index(call)
                els = asg.targets[0].target.elements
                if idx < len(els):
                    return dotted(els[idx].value)
        names = self.returned_as(call)
        return names[0][0] if names else None

    def returned_as(self, value: cst.CSTNode) -> list[tuple[str, cst.FunctionDef | None]]:
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
            items = [e.value for e in rv.elements] if isinstance(rv, cst.Tuple) else [rv]
            for i, item in enumerate(items):
                if item is value or (name is not None and dotted(item) == name):
                    idx = i if isinstance(rv, cst.Tuple) else None
                    found = True
        if not found:
            return []
        out: list[tuple[str, cst.FunctionDef | None]] = []
        for call in self.callers(fn):
            asg = self.parent.get(call)
            if not isinstance(asg, cst.Assign) or len(asg.targets) != 1:
                continue
            target = asg.targets[0].target
            if idx is None:
                t = dotted(target)
            elif isinstance(target, (cst.Tuple, cst.List)) and idx < len(target.elements):
                t = dotted(target.elements[idx].value)
            else:
                t = None
            if t:
                out.append((t, self.function_of(call)))
        return out

    def _loader_role(self, ld: Loader, all_loaders: list[Loader]) -> str:
        names = [ld.target or "", dotted(ld.dataset) or "" if ld.dataset is not None else ""]
        if isinstance(ld.dataset, cst.Call):
            names.append(dotted(ld.dataset.func) or "")
            _, dkw = call_args(ld.dataset)
            if "train" in dkw and m.matches(dkw["train"].value, m.Name("False")):
                return "eval"
            if "train" in dkw and m.matches(dkw["train"].value, m.Name("True")):
                return "train"
            for a in ld.dataset.args:
                if isinstance(a.value, cst.SimpleString) and EVAL_RE.search(a.value.value):
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
            if fn is not None and TRAIN_RE.search(fn.name.value) and not EVAL_RE.search(fn.name.value):
                return "train"
        if self._iterated_in_training(ld):
            return "train"
        # built inside evaluate()/test(): an evaluation loader, even when it shuffles
        fn = self.function_of(ld.call)
        if fn is not None and EVAL_RE.search(fn.name.value) and not TRAIN_RE.search(fn.name.value):
            return "eval"
        if len(all_loaders) == 1:
            return "train"
        if self._in_eval_function(ld):
            return "eval"  # makemore's evaluate(): shuffled to sample a few batches, not trained on
        _, kw = call_args(ld.call)
        if "shuffle" in kw and m.matches(kw["shuffle"].value, m.Name("True")):
            return "train"
        return "eval"

    def _in_eval_function(self, ld: Loader) -> bool:
        """The loader is built in a function that evaluates (named so, or run under
        torch.no_grad()/inference_mode()) and holds no training step."""
        fn = self.function_of(ld.call)
        if fn is None or any(_inside(self, s.stmt, fn) for s in self.steps):
            return False
        decorators = [d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator for d in fn.decorators]
        if any(self.qualified(d) & {"torch.no_grad", "torch.inference_mode"} for d in decorators):
            return True
        return bool(EVAL_RE.search(fn.name.value)) and not TRAIN_RE.search(fn.name.value)

    def _iterated_in_training(self, ld: Loader) -> bool:
        if not ld.target:
            return False
        for loop in self.fors:
            if self.loop_iterates(loop, ld.target) and any(
                self.ancestor(s.stmt, cst.For, cst.While) is loop or _inside(self, s.stmt, loop) for s in self.steps
            ):
                return True
        return False

    def loop_iterates(self, loop: cst.For, name: str) -> bool:
        return reads_name(loop.iter, name)

    def loader_iteration_sites(self, name: str, origin: cst.CSTNode | None = None) -> list[tuple[cst.CSTNode, str]]:
        """(for-loop, comprehension or iter() call, name used there) for every place `name` (or a
        parameter bound to it) is iterated."""
        bound = self._propagate([name])
        # pbar = tqdm(loader): iterating the wrapper iterates the loader, whose
        # name (not the wrapper's) is what the sampler hangs off
        wrapped: dict[str, str] = {}
        for asg in self.assigns:
            if isinstance(asg, cst.Assign) and isinstance(asg.value, cst.Call) and len(asg.targets) == 1:
                alias = dotted(asg.targets[0].target)
                fn = self.function_of(asg)
                names = bound.get(fn, set()) | bound.get(None, set())
                inner = next((dotted(x.value) for x in asg.value.args if dotted(x.value) in names), None)
                if alias and inner:
                    bound.setdefault(fn, set()).add(alias)
                    wrapped[alias] = inner
        # Trainer(model, loader): the class's __init__ receives it
        for call in self.calls:
            cls = self.classes.get((dotted(call.func) or "").rsplit(".", 1)[-1])
            init = next((s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None) if cls else None
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
        # self.loader = loader in a method: the class's methods reach it as self.loader
        for asg in self.assigns:
            if isinstance(asg, cst.Assign) and len(asg.targets) == 1 and isinstance(asg.value, cst.Name):
                fn = self.function_of(asg)
                attr = dotted(asg.targets[0].target)
                if fn is not None and attr and attr.startswith("self.") and asg.value.value in bound.get(fn, set()):
                    bound.setdefault(None, set()).add(attr)  # type: ignore[arg-type]
        sites: list[tuple[cst.CSTNode, str]] = []
        for loop in self.fors:
            fn = self.function_of(loop)
            visible = fn is None or fn is origin or "." in name or not self._is_local(fn, name)
            names = bound.get(fn, set()) | {n for n in bound.get(None, set()) if visible and (fn is origin or self.global_visible(n, loop, origin))}  # type: ignore[arg-type]
            for n in sorted(names, key=lambda n: ("." in n, n)):
                if self.loop_iterates(loop, n):
                    sites.append((loop, wrapped.get(n, n)))
                    break
        # [step(x, y) for x, y in loader]: a comprehension is a pass over the loader too
        for comp in self._bytype.get(cst.CompFor, []):
            fn = self.function_of(comp)
            names = bound.get(fn, set()) | {n for n in bound.get(None, set()) if fn is origin or self.global_visible(n, comp, origin)}  # type: ignore[arg-type]
            used = next((n for n in sorted(names, key=lambda n: ("." in n, n)) if reads_name(comp.iter, n)), None)
            if used is not None:
                sites.append((comp, wrapped.get(used, used)))
        for call in self.calls:
            if m.matches(call.func, m.Name("iter")) and call.args and dotted(call.args[0].value) is not None:
                fn = self.function_of(call)
                names = bound.get(fn, set()) | bound.get(None, set())  # type: ignore[arg-type]
                if dotted(call.args[0].value) in names:
                    sites.append((call, dotted(call.args[0].value)))  # type: ignore[arg-type]
        return sites
