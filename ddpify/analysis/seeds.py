"""Random state made before training: which global generators (torch, numpy, random) the script
draws from before its training loop starts with no seed of that generator before the draw.

Unseeded, every process starts its generators from a seed of its own: one process draws one
target function, one random split, one synthetic data set; under torchrun each rank would draw
its own and the ranks would train one model on different problems. The walk follows the
program in order from the top (module level, the main guard, the script's functions and the
__init__ of its non-model classes, a few calls deep) and stops where training starts: the
outermost loop that runs a training step (training_anchor). A model's __init__ is not followed:
DDP broadcasts rank 0's weights at the wrap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import ddpify.match as m
from ddpify.analysis.batches import _NOT_DRAWS
from ddpify.analysis.tree import _inside, call_args, dotted

# calls that seed a global generator (torch.cuda.manual_seed seeds CUDA only, not the CPU)
SEED_FAMILIES = {
    "torch.manual_seed": ("torch",),
    "torch.random.manual_seed": ("torch",),
    "numpy.random.seed": ("numpy",),
    "random.seed": ("random",),
    # the usual "seed everything" helpers of libraries
    "pytorch_lightning.seed_everything": ("torch", "numpy", "random"),
    "lightning.seed_everything": ("torch", "numpy", "random"),
    "lightning.pytorch.seed_everything": ("torch", "numpy", "random"),
    "transformers.set_seed": ("torch", "numpy", "random"),
    "accelerate.utils.set_seed": ("torch", "numpy", "random"),
}
# library calls that draw from a global generator unless given one of their own:
# name -> (family, keyword of their own generator, its position)
LIBRARY_DRAWS = {
    "torch.utils.data.random_split": ("torch", "generator", 2),
    "torch.utils.data.dataset.random_split": ("torch", "generator", 2),
    "sklearn.model_selection.train_test_split": ("numpy", "random_state", None),
    "sklearn.utils.shuffle": ("numpy", "random_state", None),
}
# generators of the script's own that start from fresh entropy when given no seed (a bare
# torch.Generator() starts from a fixed seed: the same on every rank)
OWN_GENERATORS = (
    "numpy.random.default_rng",
    "numpy.random.RandomState",
    "random.Random",
)
_DEPTH = 4


@dataclass
class _Walk:
    stops: list[cst.CSTNode]
    seeded: set[str] = field(default_factory=set)
    draws: dict[str, cst.Call] = field(
        default_factory=dict
    )  # family -> its first unseeded draw
    tops: dict[str, cst.BaseStatement] = field(
        default_factory=dict
    )  # family -> module statement running it
    seen: set[int] = field(default_factory=set)
    top: cst.BaseStatement | None = None
    gens: dict[str, tuple[cst.Call, bool, cst.BaseStatement | None]] = field(
        default_factory=dict
    )  # name -> (unseeded constructor, conditional, top)
    own: dict[int, tuple[cst.Call, cst.Call, bool, cst.BaseStatement | None]] = field(
        default_factory=dict
    )  # constructor -> (it, first draw, conditional, top)


@dataclass
class PreTraining:
    """What the walk found before training."""

    draws: dict[
        str, cst.Call
    ]  # family -> its first unseeded draw from the global generator
    tops: dict[
        str, cst.BaseStatement
    ]  # family -> the module-level statement that runs that draw
    own: list[
        tuple[cst.Call, cst.Call, bool, cst.BaseStatement | None]
    ]  # (unseeded constructor, first draw, conditional, top)


class SeedsMixin:
    def training_anchor(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The outermost loop that runs the training around node, climbing through the functions
        that run it in a loop (train() called once per epoch: the epoch loop); None when such a
        function is called from several places."""

        def outermost(n):
            outer = self.enclosing_loop(n)
            while outer is not None:
                n, outer = outer, self.enclosing_loop(outer)
            return n

        def callers(fn):  # model.train() is not a call of a Trainer's train()
            return [
                c
                for c in self.callers(fn)
                if not (
                    isinstance(c.func, cst.Attribute)
                    and self.is_model_ref(c.func.value)
                )
            ]

        def runs_in_loop(fn, depth=0):
            if fn is None or depth > 4:
                return False
            return any(
                self.enclosing_loop(c) is not None
                or runs_in_loop(self.function_of(c), depth + 1)
                for c in callers(fn)
            )

        node = outermost(node)
        while True:
            fn = self.function_of(node)
            if fn is None or not runs_in_loop(fn):
                return node
            found = callers(fn)
            if len(found) > 1:
                return None
            node = outermost(self.statement(found[0]))

    def seed_family(self, call: cst.Call) -> tuple[str, ...]:
        for q in self.qualified(call.func):
            if q in SEED_FAMILIES:
                return SEED_FAMILIES[q]
        return ()

    def _a_generator(
        self, node: cst.BaseExpression, where: cst.CSTNode, depth: int = 0
    ) -> bool:
        """node holds a generator of the script's own (not None): `g`, bound to torch.Generator(),
        or a parameter every caller hands one. A parameter whose default or argument is None
        draws from the global generator."""
        if m.matches(node, m.Name("None")) or depth > 3:
            return False
        if not isinstance(node, cst.Name):
            return True  # self.gen, a call: taken as a generator
        fn = self.function_of(where)
        values = self._local_values(fn, node.value)
        if values:
            return all(self._a_generator(v, v, depth + 1) for v in values)
        param = next(
            (
                p
                for p in (fn.params.params if fn is not None else ())
                if p.name.value == node.value
            ),
            None,
        )
        if param is None:
            return True
        calls = self.callers(fn)
        if not calls:
            return param.default is None or self._a_generator(
                param.default, param, depth + 1
            )
        for c in calls:
            arg = self.argument_for(c, fn, node.value)
            if arg is None:  # the default is used
                if param.default is None or not self._a_generator(
                    param.default, param, depth + 1
                ):
                    return False
            elif not self._a_generator(arg, c, depth + 1):
                return False
        return True

    def global_draw(self, call: cst.Call) -> str | None:
        """The global generator a call draws from: torch/numpy/random draws, and library calls
        (random_split, train_test_split) not given a generator of their own."""
        fam = self.draw_family(call)
        if fam is not None:
            given = call_args(call)[1].get("generator")
            return (
                None
                if given is not None and self._a_generator(given.value, call)
                else fam
            )
        for q in self.qualified(call.func):
            if q in LIBRARY_DRAWS:
                fam, kw, pos = LIBRARY_DRAWS[q]
                given, named = call_args(call)
                own = kw in named or (pos is not None and len(given) > pos)
                return None if own else fam
        return None

    def unseeded_draws(self) -> PreTraining:
        """The draws from global generators that run before training with no seed of that
        generator before them, and the draws from generators of the script's own made with no seed."""
        stops = []
        for step in self.steps:
            loop = self.enclosing_loop(step.stmt)
            anchor = self.training_anchor(loop or step.stmt)
            stops.append(anchor if anchor is not None else (loop or step.stmt))
        w = _Walk(stops)
        reached = False
        for stmt in self.module.body if stops else []:
            w.top = stmt
            if self._walk_stmt(stmt, w, 0, False):
                reached = True
                break
        fn = self.function_of(stops[0]) if stops and not reached else None
        for _ in range(4):  # up to its one caller that the walk did not reach either
            found = self.callers(fn) if fn is not None else []
            outer = self.function_of(found[0]) if len(found) == 1 else None
            if outer is None or id(outer) in w.seen:
                break
            w.stops.append(self.statement(found[0]))
            fn = outer
        if fn is not None and id(fn) not in w.seen:
            # the training function is started by something the walk cannot follow (a CLI
            # library's registry, a callback): what runs before training is its own start
            w.top, w.seen = None, w.seen | {id(fn)}
            for s in fn.body.body if isinstance(fn.body, cst.IndentedBlock) else []:
                if self._walk_stmt(s, w, 1, False):
                    break
        return PreTraining(w.draws, w.tops, list(w.own.values()))

    # -- the walk ---------------------------------------------------------------------
    def _walk_stmt(self, stmt: cst.CSTNode, w: _Walk, depth: int, cond: bool) -> bool:
        """Visit stmt's draws and seeds in order; True once training starts."""
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            return False
        if any(stmt is s for s in w.stops):
            return True
        if any(_inside(self, s, stmt) for s in w.stops):
            # a compound statement around the training: its header, then the block holding it
            for blk in self._blocks(stmt):
                if any(_inside(self, s, blk) for s in w.stops):
                    inner = cond or (
                        isinstance(stmt, cst.If) and stmt is not self.main_guard
                    )
                    for s in blk.body:
                        if self._walk_stmt(s, w, depth, inner):
                            return True
                    return False
            return False
        return self._visit(stmt, w, depth, cond)

    def _blocks(self, stmt: cst.CSTNode) -> list[cst.CSTNode]:
        out = []
        for attr in ("body", "orelse", "handlers", "finalbody"):
            v = getattr(stmt, attr, None)
            for x in v if isinstance(v, (list, tuple)) else [v]:
                if isinstance(x, cst.IndentedBlock):
                    out.append(x)
                elif x is not None and isinstance(
                    getattr(x, "body", None), cst.IndentedBlock
                ):
                    out.append(x.body)
                    if isinstance(x, cst.If):  # elif
                        out += self._blocks(x)
        return out

    def _visit(self, node: cst.CSTNode, w: _Walk, depth: int, cond: bool) -> bool:
        for c in self.findall(node, m.Call()):
            under_if = cond or self._conditional(c, node)
            for fam in self.seed_family(c):
                if not under_if:
                    w.seeded.add(fam)
            fam = self.global_draw(c)
            if fam is not None and fam not in w.seeded and fam not in w.draws:
                w.draws[fam] = c
                if w.top is not None and self.function_of(c) is None:
                    w.tops[fam] = w.top
            self._own_generator(c, w, under_if)
            if depth < _DEPTH and self._follow(c, w, depth, under_if):
                return True
        return False

    def _own_generator(self, c: cst.Call, w: _Walk, cond: bool) -> None:
        """`rng = np.random.default_rng()` (no seed), then `rng.normal(...)` before training."""
        top = w.top if self.function_of(c) is None else None
        if not c.args and self.is_call(c, *OWN_GENERATORS):
            asg = self.parent.get(c)
            if (
                isinstance(asg, cst.Assign)
                and len(asg.targets) == 1
                and dotted(asg.targets[0].target)
            ):
                w.gens[dotted(asg.targets[0].target)] = (c, cond, top)
            return
        if isinstance(c.func, cst.Attribute) and c.func.attr.value not in _NOT_DRAWS:
            made = w.gens.get(dotted(c.func.value) or "")
            if made is not None and id(made[0]) not in w.own:
                w.own[id(made[0])] = (made[0], c, made[1], made[2])

    def _conditional(self, c: cst.CSTNode, root: cst.CSTNode) -> bool:
        cur = self.parent.get(c)
        while cur is not None and cur is not root:
            if isinstance(cur, (cst.If, cst.IfExp)) and cur is not self.main_guard:
                return True
            cur = self.parent.get(cur)
        return isinstance(root, cst.If) and root is not self.main_guard

    def _follow(self, c: cst.Call, w: _Walk, depth: int, cond: bool) -> bool:
        """Into the script's function (or its non-model class's __init__) that c calls."""
        name = dotted(c.func)
        if (
            not name
            or ("." in name and not name.startswith("self."))
            or self._is_forward_call(c)
        ):
            return False
        short = name.rsplit(".", 1)[-1]
        bodies = [
            fn
            for fn in self.functions.get(short, [])
            if fn.name.value not in ("forward", "__init__")
        ]
        cls = self.classes.get(short) if "." not in name else None
        if cls is not None and not self._module_class(cls):
            bodies += [
                s
                for s in cls.body.body
                if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"
            ]
        for fn in bodies:
            if id(fn) in w.seen:
                continue
            w.seen.add(id(fn))
            for s in fn.body.body if isinstance(fn.body, cst.IndentedBlock) else []:
                if self._walk_stmt(s, w, depth + 1, cond):
                    return True
        return False

    def _module_class(self, cls: cst.ClassDef, depth: int = 0) -> bool:
        """An nn.Module subclass (its draws in __init__ make weights, which DDP broadcasts)."""
        for base in cls.bases:
            if any(q.startswith("torch.nn.") for q in self.qualified(base.value)):
                return True
            own = self.classes.get(dotted(base.value) or "")
            if (
                own is not None
                and own is not cls
                and depth < 4
                and self._module_class(own, depth + 1)
            ):
                return True
        return False
