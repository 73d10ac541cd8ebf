"""Control structure around a statement: the nearest loop within its function, the if/try/with
whose branch holds it, the calls of a function, code that runs per item (not once per rank in
the main process), and the `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import libcst as cst
import ddpify.match as m
from ddpify.analysis.tree import _in_orelse, call_args, dotted


# The methods a DataLoader calls per sample or per pass, maybe in a worker process.
PER_ITEM = ("__getitem__", "__iter__", "__next__", "__len__", "__getitems__")


class LoopsMixin:
    def enclosing_loop(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """Nearest loop around node within its own function."""
        cur = self.parent.get(node)
        while cur is not None and not isinstance(cur, (cst.FunctionDef, cst.ClassDef)):
            if isinstance(cur, (cst.For, cst.While)) and not _in_orelse(
                self, node, cur
            ):
                return cur
            cur = self.parent.get(cur)
        return None

    def branch_owner(self, stmt: cst.CSTNode) -> cst.CSTNode | None:
        """The if (whole elif chain), try or with whose branch holds stmt; None elsewhere,
        and for the `if __name__ == "__main__":` guard."""
        block = self.block(stmt)
        if not isinstance(block, cst.IndentedBlock):
            return None
        owner = self.parent.get(block)
        if isinstance(owner, (cst.Else, cst.Finally, cst.ExceptHandler)):
            owner = self.parent.get(owner)
        while isinstance(owner, cst.If) and isinstance(
            self.parent.get(owner), cst.If
        ):  # elif
            owner = self.parent.get(owner)
        if (
            not isinstance(owner, (cst.If, cst.Try, cst.With))
            or owner is self.main_guard
        ):
            return None
        return owner

    def callers(self, fn: cst.FunctionDef) -> list[cst.Call]:
        cls = self.class_of(fn)
        if (
            fn.name.value == "__init__" and cls is not None
        ):  # Trainer(...) runs Trainer.__init__
            return [
                c
                for c in self.calls
                if (dotted(c.func) or "").rsplit(".", 1)[-1] == cls.name.value
            ]
        out = []
        module_class = cls is not None and any(
            "Module" in (dotted(b.value) or "") for b in cls.bases
        )
        for call in self.calls:
            name = dotted(call.func)
            if name and name.rsplit(".", 1)[-1] == fn.name.value:
                if (
                    "." in name
                    and not name.startswith(("self.", "cls."))
                    and self.class_of(fn) is None
                    and not self._local_module(name)
                ):
                    continue
                if (
                    cls is not None
                    and not module_class
                    and isinstance(call.func, cst.Attribute)
                    and self.is_model_ref(call.func.value)
                ):
                    continue  # self.unet.train(True) is nn.Module.train, not a Solver's train()
                out.append(call)
        # functools.partial(fn, model, loss_fn): the call that binds fn's first arguments
        out += [
            c
            for c in self.partial_calls()
            if dotted(c.args[0].value) == fn.name.value and self.class_of(fn) is None
        ]
        if self.class_of(fn) is None and self.function_of(fn) is None:
            # getattr(datasets, args.dataset)(...) / eval("datasets." + name)(...) may call any
            # function of that module of the program
            out += self._factory_calls().get(self.region_of(fn), [])
        return out

    def _factory_calls(self) -> dict[int, list[cst.Call]]:
        """Calls that pick a function or class of a module of the program by a computed name, by file."""
        found = self.__dict__.get("_by_factory")
        if found is None:
            found = {}
            for call in self.calls:
                region = self._factory_region(call.func, None, None)
                if region is not None:
                    found.setdefault(region, []).append(call)
            self._by_factory = found
        return found

    def partial_calls(self) -> list[cst.Call]:
        """functools.partial(f, ...) calls whose function f is named (a function of the program)."""
        found = self.__dict__.get("_partials")
        if found is None:
            found = [
                c
                for c in self.calls
                if c.args
                and c.args[0].keyword is None
                and dotted(c.args[0].value) in self.functions
                and self.is_call(c, "functools.partial")
            ]
            self._partials = found
        return found

    def argument_for(
        self, call: cst.Call, fn: cst.FunctionDef, param: str
    ) -> cst.BaseExpression | None:
        """The expression `call` passes to fn's parameter `param` (None: the default is used);
        a method's self/cls is passed by the call's receiver or the constructor;
        functools.partial(fn, a, b) passes a and b to fn's first parameters."""
        params = [p.name.value for p in fn.params.params]
        pos, kw = call_args(call)
        if param in kw:
            return kw[param].value
        if (
            any(call is c for c in self.__dict__.get("_partials") or ())
            and pos
            and dotted(pos[0].value) == fn.name.value
        ):
            pos = pos[1:]
        i = params.index(param) - (1 if params and params[0] in ("self", "cls") else 0)
        return pos[i].value if 0 <= i < len(pos) else None

    def runs_per_item(self, node: cst.CSTNode, init_once: bool = False) -> bool:
        """node's function may run a different number of times on each rank, or in another
        process: a Dataset's method (per sample, maybe in a DataLoader worker), a function handed
        over as a value (Pool.map, functools.partial, a callback), or a function called from
        such code. A collective there would hang or fail (a forked worker has no usable group)."""
        seen: set[int] = set()
        work = [self.function_of(node)]
        while work:
            fn = work.pop()
            if fn is None or id(fn) in seen:
                continue
            seen.add(id(fn))
            cls = self.class_of(fn)
            if cls is not None and any(
                isinstance(s, cst.FunctionDef) and s.name.value in PER_ITEM
                for s in cls.body.body
            ):
                # a Dataset: its item methods run per sample (maybe in a worker); with init_once
                # its constructor (and what only it calls) runs where the data set is built
                if (
                    not init_once
                    or fn.name.value in PER_ITEM
                    or fn.name.value != "__init__"
                    and not self._only_from_init(fn, cls)
                ):
                    return True
            if self._passed_as_value(fn):
                return True
            work.extend(self.function_of(c) for c in self.callers(fn))
        return False

    def _only_from_init(self, fn: cst.FunctionDef, cls: cst.ClassDef) -> bool:
        """fn is called, through `self.`, only from its class's __init__ (a Dataset's download())."""
        calls = [
            c for c in self.calls if (dotted(c.func) or "") == f"self.{fn.name.value}"
        ]
        return bool(calls) and all(
            self.class_of(c) is cls
            and (g := self.function_of(c)) is not None
            and g.name.value == "__init__"
            for c in calls
        )

    def _passed_as_value(self, fn: cst.FunctionDef) -> bool:
        name = fn.name.value
        refs = self.findall(
            self.module,
            m.Name(name)
            if self.class_of(fn) is None
            else m.Attribute(attr=m.Name(name)),
        )
        for ref in refs:
            parent = self.parent.get(ref)
            if isinstance(parent, cst.Call) and parent.func is ref:
                continue  # called here
            if (
                isinstance(
                    parent,
                    (cst.FunctionDef, cst.ClassDef, cst.ImportAlias, cst.Attribute),
                )
                and ref is not parent
            ):
                continue  # its own def, an import, or x.name (another object's attribute)
            if (
                isinstance(ref, cst.Name)
                and isinstance(parent, cst.Attribute)
                and parent.attr is ref
            ):
                continue
            return True
        return False

    def _find_main_guard(self) -> cst.If | None:
        for stmt in self.module.body:
            if isinstance(stmt, cst.If) and m.matches(
                stmt.test,
                m.Comparison(
                    left=m.Name("__name__"),
                    comparisons=[m.ComparisonTarget(m.Equal(), m.SimpleString())],
                ),
            ):
                return stmt
        return None
