"""Values each rank computes differently by construction, followed through the program: a value
that reads the rank, or is computed from one (assignments, subscripts, comprehensions, calls and
their return values, objects the script's classes build from it), or is drawn from a random
generator seeded per rank. Lint asks it where a rank's *own* data comes from: a file named by the
rank, a list strided by the rank, a subset drawn after `random.seed(rank)`, a sampler or data set
class handed the rank. DistributedSampler is not followed: it gives every rank as many samples.
"""

from __future__ import annotations

from functools import cached_property

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import call_args, code, dotted
from ddpify.lint.values import UNK

GLOBAL_SEEDERS = {
    "random.seed": "random",
    "numpy.random.seed": "numpy",
    "torch.manual_seed": "torch",
    "torch.random.manual_seed": "torch",
}
GENERATORS = (
    "random.Random",
    "numpy.random.default_rng",
    "numpy.random.RandomState",
    "numpy.random.Generator",
)
# draws from the global generators of each module
DRAWS = {
    "random": "random.",
    "numpy": "numpy.random.",
    "torch": (
        "torch.rand",
        "torch.randn",
        "torch.randint",
        "torch.randperm",
        "torch.multinomial",
        "torch.bernoulli",
        "torch.normal",
    ),
}
NOT_A_COUNT = {
    "device",
    "map_location",
    "non_blocking",
    "dtype",
    "disable",
    "desc",
    "position",
    "leave",
    "pin_memory",
    "pin_memory_device",
    "generator",
    "worker_init_fn",
    "persistent_workers",
    "num_workers",
}
EVEN = (
    "torch.utils.data.distributed.DistributedSampler",
    "torch.utils.data.DistributedSampler",
)


class DerivedMixin:
    @cached_property
    def per_rank_seeded(self) -> dict[str, cst.Call]:
        """The global random generators (random, numpy, torch) seeded with a per-rank seed."""
        out: dict[str, cst.Call] = {}
        for c, qs in self.qualified_calls:
            for q in qs:
                if q in GLOBAL_SEEDERS:
                    pos, kw = call_args(c)
                    seed = (
                        pos[0].value
                        if pos
                        else kw["seed"].value
                        if "seed" in kw
                        else None
                    )
                    if seed is not None and self.ranks.reads_rank(seed):
                        out.setdefault(GLOBAL_SEEDERS[q], c)
        return out

    @cached_property
    def per_rank_generators(self) -> dict[str, cst.Call]:
        """Generator objects (bound to a name or attribute) seeded per rank: `rng = random.Random(42 + rank)`,
        `g = torch.Generator(); g.manual_seed(rank)`."""
        a = self.a
        out: dict[str, cst.Call] = {}
        for c, qs in self.qualified_calls:
            pos, kw = call_args(c)
            if qs & set(GENERATORS):
                seed = (
                    pos[0].value if pos else kw["seed"].value if "seed" in kw else None
                )
                target = a._assign_target(c)
                if seed is not None and target and self.ranks.reads_rank(seed):
                    out[target] = c
            elif (
                isinstance(c.func, cst.Attribute)
                and c.func.attr.value == "manual_seed"
                and pos
                and self.ranks.reads_rank(pos[0].value)
            ):
                base = c.func.value
                name = dotted(base) or (
                    a._assign_target(c) if isinstance(base, cst.Call) else None
                )
                if name and not (a.qualified(c.func) & set(GLOBAL_SEEDERS)):
                    out[name] = c
        return out

    def _draw(self, call: cst.Call) -> str | None:
        """The call draws from a generator seeded per rank: why, or None."""
        qs = self.a.qualified(call.func)
        _, kw = call_args(call)
        gen = kw.get("generator")
        if gen is not None:
            name = dotted(gen.value)
            return (
                f"a draw from {name}, seeded per rank"
                if name in self.per_rank_generators
                else None
            )
        for module, seeder in self.per_rank_seeded.items():
            prefixes = DRAWS[module]
            if any(q.startswith(prefixes) for q in qs):
                return f"a random draw after `{code(seeder)}` (a seed of its own on each rank)"
        if (
            isinstance(call.func, cst.Attribute)
            and dotted(call.func.value) in self.per_rank_generators
        ):
            return f"a draw from {dotted(call.func.value)}, seeded per rank"
        return None

    def rank_derived(
        self,
        node: cst.CSTNode | None,
        depth: int = 0,
        seen: set[int] | None = None,
        length: bool = False,
    ) -> str | None:
        """Why node's value differs from rank to rank by construction (None: not seen to). With
        length=True, why its *length* may: a random draw then counts only where it decides what
        is kept (a filter's condition), not where it only fills values."""
        a = self.a
        if node is None or depth > 8:
            return None
        seen = set() if seen is None else seen
        if id(node) in seen:
            return None
        seen.add(id(node))
        even = [c for c in a.findall(node, m.Call()) if a.qualified(c.func) & set(EVEN)]
        inside_even = {
            id(x)
            for c in even
            for x in a.findall(c, m.Name() | m.Attribute() | m.Call())
        }
        if length:  # where a value sits or how it is shown is not how many there are
            # a comprehension has as many items as its loops and filters give, whatever the
            # values it computes: `[(i * world + rank) % n for i in range(k)]` has k
            for comp_for in a.findall(node, m.CompFor()):
                comp = a.parent.get(comp_for)
                elt = getattr(comp, "elt", None)
                if elt is not None:
                    inside_even |= {
                        id(x)
                        for x in a.findall(elt, m.Name() | m.Attribute() | m.Call())
                    }
            for arg in a.findall(node, m.Arg()):
                call = a.parent.get(arg)
                placement = (
                    isinstance(call, cst.Call)
                    and isinstance(call.func, cst.Attribute)
                    and call.func.attr.value in ("to", "cuda")
                )
                if placement or (
                    arg.keyword is not None and arg.keyword.value in NOT_A_COUNT
                ):
                    inside_even |= {
                        id(x)
                        for x in a.findall(arg, m.Name() | m.Attribute() | m.Call())
                    }
        for sub in [node, *a.findall(node, m.Name() | m.Attribute() | m.Call())]:
            if id(sub) in inside_even:
                continue  # DistributedSampler(..., rank=rank) gives every rank as many samples
            if isinstance(sub, cst.Call):
                why = self._draw(sub)
                if why and (not length or self._filters(sub)):
                    return why
                callee = self.own_call(sub)
                if callee and depth < 6:
                    for fn in a.functions.get(callee, [])[:2]:
                        if a.class_of(fn) is None or callee != "__init__":
                            for r in a.findall(fn, m.Return()):
                                if r.value is not None and a.function_of(r) is fn:
                                    why = self.rank_derived(
                                        r.value, depth + 1, seen, length
                                    )
                                    if why:
                                        return f"{callee}() returns {why}"
                    cls = a.classes.get(callee)
                    if cls is not None:
                        why = self._class_draws(cls)
                        if why:
                            return f"{callee}(...) {why}"
                continue
            if isinstance(sub, (cst.Name, cst.Attribute)):
                if self.ranks.depends(sub):
                    v = self.ranks.values(sub)
                    if length and all(isinstance(x, bool) for x in v if x is not UNK):
                        continue  # a rank-0 test (logging, a progress bar), not a count
                    return f"`{code(sub)}` is the rank"
                if (
                    isinstance(sub, cst.Attribute)
                    and sub.value is not None
                    and isinstance(sub.value, cst.Name)
                    and sub.value.value == "self"
                ):
                    for v in self._self_values(sub):
                        why = self.rank_derived(v, depth + 1, seen, length)
                        if why:
                            return why
                    continue
                if isinstance(sub, cst.Name):
                    fn = a.function_of(sub)
                    values = (
                        a._local_values(fn, sub.value)
                        if fn is not None and a._is_local(fn, sub.value)
                        else a._local_values(None, sub.value)
                    )
                    for v in values[:6]:
                        if (
                            self.order(v) > self.order(sub)
                            and a.function_of(v) is fn
                            and a.enclosing_loop(sub) is None
                        ):
                            continue
                        why = self.rank_derived(v, depth + 1, seen, length)
                        if why:
                            return why
                    param = (
                        next(
                            (p for p in fn.params.params if p.name.value == sub.value),
                            None,
                        )
                        if fn is not None
                        else None
                    )
                    if param is not None and depth < 6:
                        for c in a.callers(fn)[:6]:
                            try:
                                arg = a.argument_for(c, fn, sub.value)
                            except ValueError:
                                arg = None
                            why = (
                                self.rank_derived(arg, depth + 1, seen, length)
                                if arg is not None
                                else None
                            )
                            if why:
                                return why
        return None

    def _filters(self, node: cst.CSTNode) -> bool:
        """node sits in a condition that decides what is kept: a comprehension's `if`, an `if` test."""
        a = self.a
        child, cur = node, a.parent.get(node)
        while cur is not None and not isinstance(
            cur, (cst.FunctionDef, cst.SimpleStatementLine)
        ):
            if isinstance(cur, cst.CompIf) or (
                isinstance(cur, (cst.If, cst.IfExp, cst.While)) and child is cur.test
            ):
                return True
            child, cur = cur, a.parent.get(cur)
        return False

    def _self_values(self, node: cst.Attribute) -> list[cst.BaseExpression]:
        a = self.a
        d = dotted(node)
        cls = a.class_of(node)
        return [
            asg.value
            for asg in a.assigns
            if isinstance(asg, cst.Assign)
            and a.class_of(asg) is cls
            and any(dotted(t.target) == d for t in asg.targets)
        ]

    def _class_draws(self, cls: cst.ClassDef) -> str | None:
        """A class of the script whose constructor computes from a rank it is handed (its
        parameters are followed to the arguments of its calls) or draws per-rank randomness."""
        a = self.a
        init = next(
            (f for f in a.functions.get("__init__", []) if a.class_of(f) is cls), None
        )
        if init is None:
            return None
        for asg in a.findall(init, m.Assign()):
            why = self.rank_derived(asg.value, 4)
            if why:
                return f"builds its data from {why}"
        return None

    def rank_derived_len(self, node: cst.CSTNode | None) -> str | None:
        return self.rank_derived(node, length=True)
