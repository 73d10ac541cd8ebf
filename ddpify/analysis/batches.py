"""Where a training batch comes from when no DataLoader feeds the step:

  random    drawn at random each step (offsets or indices from torch.randint/randperm,
            np.random, random; synthetic torch.randn batches)
  range     a pre-loaded tensor sliced by a `for i in range(...)` loop variable
  sequence  a list of pre-made batches iterated by the loop
  index     full-batch training: the loss picks its rows with an index (graph nets)
  closure   an LBFGS optimizer, whose line search re-evaluates the loss (refused)

A source with `problem` set cannot be sharded safely; the problem says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import ddpify.match as m
from ddpify.analysis.tree import _flatten_targets, call_args, code, dotted

TORCH_DRAWS = frozenset(
    f"torch.{n}"
    for n in (
        "randint",
        "randperm",
        "rand",
        "randn",
        "randint_like",
        "rand_like",
        "randn_like",
        "multinomial",
        "normal",
        "bernoulli",
        "poisson",
    )
)
SEEDS = (
    "torch.manual_seed",
    "torch.cuda.manual_seed",
    "torch.cuda.manual_seed_all",
    "torch.random.manual_seed",
    "numpy.random.seed",
    "random.seed",
)
GENERATORS = (
    "numpy.random.default_rng",
    "numpy.random.RandomState",
    "numpy.random.Generator",
    "random.Random",
    "torch.Generator",
)
_NOT_DRAWS = {
    "seed",
    "get_state",
    "set_state",
    "getstate",
    "setstate",
    "RandomState",
    "default_rng",
    "Generator",
    "Random",
}


@dataclass
class BatchSource:
    kind: str  # "random" | "range" | "sequence" | "iterable" | "index" | "full" | "closure"
    node: cst.CSTNode  # what gets sharded: the range call, the iterable, the loss statement, the step call
    loop: cst.CSTNode | None = None  # the loop that draws the batches
    families: set[str] = field(
        default_factory=set
    )  # random: "torch", "numpy", "random"
    index: str | None = None  # index: the name of the index
    problem: str | None = None  # why it cannot be sharded (blocking)
    reads: list = field(
        default_factory=list
    )  # full: the reads of the whole tensors in the loop


class BatchesMixin:
    # -- random draws -----------------------------------------------------------------
    def draw_family(self, call: cst.Call) -> str | None:
        """ "torch"/"numpy"/"random" for a draw from that library's global generator."""
        for q in self.qualified(call.func):
            if q in TORCH_DRAWS:
                return "torch"
            for fam, prefix in (("numpy", "numpy.random."), ("random", "random.")):
                if (
                    q.startswith(prefix)
                    and q.count(".") == prefix.count(".")
                    and q.rsplit(".", 1)[-1] not in _NOT_DRAWS
                ):
                    return fam
        return None

    def _reached(self, stmts: list[cst.CSTNode], depth: int = 3) -> list[cst.CSTNode]:
        """stmts and the bodies of the script's functions they call (not the models' methods)."""
        out, work, seen = [], [(s, 0) for s in stmts], set()
        while work:
            node, d = work.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            out.append(node)
            if d >= depth:
                continue
            for c in self.findall(node, m.Call()):
                if self._is_forward_call(c):
                    continue
                name = dotted(c.func)
                if not name:
                    continue
                method = "." in name and not name.startswith("self.")
                if method and (
                    self._local_module(name) or self.is_model_ref(c.func.value)
                ):
                    method = False if self._local_module(name) else None
                if method is None:
                    continue
                for fn in self.functions.get(name.rsplit(".", 1)[-1], []):
                    if fn.name.value in ("forward", "__init__"):
                        continue
                    if method and self.class_of(fn) is None:
                        continue  # buffer.sample(...) reaches a method of the program's classes only
                    work.append((fn.body, d + 1))
        return out

    def _draws_in(self, nodes: list[cst.CSTNode]) -> list[cst.Call]:
        return [
            c for n in nodes for c in self.findall(n, m.Call()) if self.draw_family(c)
        ]

    # -- the batch source of a step ---------------------------------------------------
    def batch_source(self, step) -> BatchSource | None:
        closure = self._closure_step(step)
        if closure is not None:
            return closure
        loop, first = self._data_loop(step)
        if isinstance(loop, cst.For):
            found = (
                self._range_source(loop)
                or self._sequence_source(loop)
                or self._iterable_source(loop)
            )
            if found is not None:
                return found
            body = (
                list(loop.body.body)
                if isinstance(loop.body, cst.IndentedBlock)
                else [loop.body]
            )
            nodes, needed = self._feeding(body, first)
            it, names = self._loop_names(loop)
            if m.matches(it, m.Call(func=m.Name("range"))):
                # a counter: it feeds the batch only as an index (X[i]), which is not sharded here
                if any(
                    x.value in names
                    for node in nodes
                    for sub in self.findall(node, m.Subscript())
                    for x in self.findall(sub, m.Name())
                ):
                    return None
            elif needed & set(
                names + [dotted(t) for t in _flatten_targets(loop.target)]
            ):
                return None  # the loop hands out the batches (a loader from elsewhere): not known here
        found = (
            self._next_source(first, loop)
            or self._random_source(first, loop)
            or self._own_generator_source(first, loop)
        )
        if found is not None:
            return found
        return self._index_source(step) or self._full_batch_source(step, loop)

    def _own_generator_source(
        self, first: cst.CSTNode, loop: cst.CSTNode | None
    ) -> BatchSource | None:
        """The batches are drawn (in the step's code or the script's functions it calls: an
        environment's rollout) from a generator object of the script's own. One made without a
        seed, or from the process's own entropy (os.getpid(), time), already differs on every
        rank: kind "per_rank", left as it is. One seeded alike on every rank would give every
        rank the same batches: a problem."""
        if loop is None:
            return None
        for node in self._reached_from(first, loop):
            for c in self.findall(node, m.Call(func=m.Attribute())):
                made = self._generator_made(c.func.value)
                if made is None:
                    continue
                origin = self._seed_origin(made)
                src = BatchSource("per_rank", made, loop)
                if origin == "same":
                    src.problem = (
                        f"the batches are drawn from `{code(made)}`, a generator of the script's own "
                        "seeded alike on every process: every rank would train on the same batches; "
                        "add the rank to its seed by hand (RANK = int(os.environ.get('RANK', 0)))"
                    )
                elif origin is None:
                    src.problem = (
                        f"the batches are drawn from `{code(made)}`, a generator of the script's own "
                        "whose seed ddpify cannot follow, so it cannot tell whether every rank would "
                        "draw the same batches: add the rank to its seed by hand (RANK = "
                        "int(os.environ.get('RANK', 0)))"
                    )
                return src
        return None

    _PRIVATE = (
        "numpy.random.default_rng",
        "numpy.random.RandomState",
        "numpy.random.Generator",
        "random.Random",
    )
    _ENTROPY = (
        "os.getpid",
        "os.urandom",
        "time.time",
        "time.time_ns",
        "time.perf_counter",
        "uuid.uuid4",
        "secrets.randbits",
        "secrets.token_bytes",
        "random.SystemRandom",
    )

    def _generator_made(self, receiver: cst.BaseExpression) -> cst.Call | None:
        """The construction of the generator object `receiver` is (`rng`, `self.rng`)."""
        if not isinstance(receiver, (cst.Name, cst.Attribute)):
            return None
        for v in self.values_of(receiver):
            if isinstance(v, cst.Call) and self.is_call(v, *self._PRIVATE):
                return v
        return None

    def _seed_origin(self, made: cst.Call) -> str | None:
        """ "process": made with no seed, or from the process's own entropy or rank (each rank
        its own); "same": from values every rank shares (literals, configuration); None: a
        seed ddpify cannot follow."""
        args = [a.value for a in made.args if not a.star]
        if not args or m.matches(args[0], m.Name("None")):
            return "process"
        return self._seed_origin_of(args[0], self.function_of(made))

    def _seed_origin_of(
        self, seed: cst.BaseExpression, fn, depth: int = 0
    ) -> str | None:
        if self._entropy(seed):
            return "process"
        if depth > 4:
            return None
        params = {p.name.value for p in fn.params.params} if fn is not None else set()
        origins: set[str | None] = set()
        for n in [seed] if isinstance(seed, cst.Name) else self.findall(seed, m.Name()):
            par = self.parent.get(n)
            if isinstance(par, cst.Attribute) and par.attr is n:
                continue
            if isinstance(par, cst.Call) and par.func is n:
                continue  # int(...), hash(...): what they are handed counts
            if n.value in params:
                callers = self.callers(fn)
                if not callers:
                    return None
                for call in callers:
                    arg = self.argument_for(call, fn, n.value)
                    origins.add(
                        "same"
                        if arg is None  # its default
                        else self._seed_origin_of(
                            arg, self.function_of(call), depth + 1
                        )
                    )
                continue
            for v in self.values_of(n):
                if v is not n:
                    origins.add(self._seed_origin_of(v, self.function_of(v), depth + 1))
        if None in origins:
            return None
        return "process" if "process" in origins else "same"

    def _entropy(self, seed: cst.BaseExpression) -> bool:
        """seed reads the process's own entropy or its rank (os.getpid(), time, RANK)."""
        calls = self.findall(seed, m.Call()) + (
            [seed] if isinstance(seed, cst.Call) else []
        )
        return any(self.is_call(c, *self._ENTROPY) for c in calls) or any(
            x.evaluated_value in ("RANK", "LOCAL_RANK")
            for x in self.findall(seed, m.SimpleString())
        )

    def _next_source(
        self, first: cst.CSTNode, loop: cst.CSTNode | None
    ) -> BatchSource | None:
        """`batch = next(batches)` in the loop, `batches` made once before it by the script's own
        generator (a generator function or method, iter() of its class with __iter__)."""
        if loop is None:
            return None
        body = (
            list(loop.body.body)
            if isinstance(loop.body, cst.IndentedBlock)
            else [loop.body]
        )
        scope = self.function_of(loop)
        for node in self._feeding(body, first)[0]:
            for c in self.findall(node, m.Call(func=m.Name("next"))):
                if not c.args or not isinstance(c.args[0].value, cst.Name):
                    continue
                name = c.args[0].value.value
                values = self._local_values(scope, name) or self._local_values(
                    None, name
                )
                if len(values) != 1:
                    continue
                made = values[0]
                if m.matches(made, m.Call(func=m.Name("iter"))) and made.args:
                    made = self._made_from(made.args[0].value, scope)
                if self._own_batches(made, scope):
                    return BatchSource("iterable", values[0], loop)
        return None

    _MOVES = {
        "to",
        "cuda",
        "float",
        "double",
        "long",
        "half",
        "bfloat16",
        "contiguous",
        "detach",
    }

    def _full_batch_source(self, step, loop: cst.CSTNode | None) -> BatchSource | None:
        """Every step reads whole tensors made before the loop (full-batch training): the model's
        inputs, traced back through the loop's assignments (`x, y = X, Y`, `.to(device)`), end at
        names the loop does not assign. Those reads get this rank's rows."""
        if loop is None or not isinstance(loop.body, cst.IndentedBlock):
            return None
        region = [
            n
            for n in (step.loss_stmt or step.forward_first, step.stmt)
            if n is not None
        ]
        forwards = [
            c
            for n in region
            for c in self.findall(n, m.Call())
            if self.is_model_ref(c.func) or self._model_method(c)
        ]
        if not forwards:
            return None
        # the step in a function the loop calls once a pass: its parameters are the call's
        # arguments, read in the loop
        fn = self.function_of(step.stmt)
        site = None
        if fn is not None and not self._within_node(step.stmt, loop):
            site = self._call_in(loop, fn)
            if site is None:
                return None
        assigned: dict[str, list[cst.Assign]] = {}  # in the loop
        for asg in self.findall(loop.body, m.Assign()):
            for t in asg.targets:
                for el in _flatten_targets(t.target):
                    if dotted(el):
                        assigned.setdefault(dotted(el), []).append(asg)
        in_fn: dict[str, list[cst.Assign]] = {}  # in the step's function
        for asg in self.findall(fn.body, m.Assign()) if site is not None else ():
            for t in asg.targets:
                for el in _flatten_targets(t.target):
                    if dotted(el):
                        in_fn.setdefault(dotted(el), []).append(asg)
        if any(self.findall(n, m.Subscript()) for n in region):
            return None  # rows or keys picked from the batch or the output: not whole tensors
        work = [a.value for c in forwards for a in c.args]
        outputs = {
            dotted(t.target)
            for c in forwards
            for t in getattr(self.parent.get(c), "targets", ())
        }
        for n in (
            region
        ):  # criterion(model(x), y) or criterion(out, y): y beside the model's output
            for call in self.findall(n, m.Call()):
                vals = [a.value for a in call.args]
                if any(
                    v in forwards or dotted(v) in outputs for v in vals
                ) and not self.is_model_ref(call.func):
                    work += [
                        v
                        for v in vals
                        if v not in forwards and dotted(v) not in outputs
                    ]
        reads: list[cst.Name] = []
        seen: set[tuple[str, bool]] = set()
        inner = site is not None  # the forward's arguments are the function's names
        todo = [(e, inner) for e in work]
        while todo:
            e, inner = todo.pop()
            if (
                isinstance(e, cst.Call)
                and isinstance(e.func, cst.Attribute)
                and e.func.attr.value in self._MOVES
            ):
                todo.append((e.func.value, inner))
                continue
            if not isinstance(e, cst.Name):
                return None  # a slice, a call, an index: not a whole tensor each step
            if (e.value, inner) in seen:
                continue
            seen.add((e.value, inner))
            asgs = (in_fn if inner else assigned).get(e.value)
            if inner and e.value in _params(
                fn
            ):  # also where `x = x.to(device)` follows
                arg = self.argument_for(site, fn, e.value)
                if arg is None:
                    return None
                todo.append((arg, False))
                if asgs is None:
                    continue
            elif asgs is None and inner:
                return None  # a global the function reads: not the loop's
            if asgs is None:
                if (
                    e.value in self.functions
                    or e.value in self.classes
                    or e.value in ("True", "False", "None")
                ):
                    return None
                reads.append(e)
                continue
            for asg in asgs:  # `x = X`, then `if cuda: x = x.cuda()`
                target = asg.targets[0].target
                if len(asg.targets) == 1 and isinstance(target, cst.Name):
                    todo.append((asg.value, inner))
                elif (
                    len(asg.targets) == 1
                    and isinstance(target, cst.Tuple)
                    and isinstance(asg.value, cst.Tuple)
                    and len(target.elements) == len(asg.value.elements)
                ):
                    # x, y = X, Y: both are the batch
                    todo += [(el.value, inner) for el in asg.value.elements]
                else:
                    return None
        if not reads:
            return None
        # the read to shard is the one in the loop (an outside name read there, or the forward's own)
        inside = []
        for r in reads:
            hits = [
                n
                for n in self.findall(loop.body, m.Name(r.value))
                if not isinstance(self.parent.get(n), cst.Attribute)
                or self.parent.get(n).value is n
            ]
            inside += [
                n
                for n in hits
                if not any(
                    n is t
                    for a in assigned.get(r.value, [])
                    for tt in a.targets
                    for t in _flatten_targets(tt.target)
                )
            ]
        return BatchSource("full", inside[0], loop, reads=inside) if inside else None

    # calls on the model that are no forward pass
    _NOT_FORWARD = {
        "parameters",
        "named_parameters",
        "to",
        "cuda",
        "cpu",
        "train",
        "eval",
    }
    _NOT_FORWARD |= {
        "zero_grad",
        "state_dict",
        "load_state_dict",
        "modules",
        "children",
    }

    def _model_method(self, c: cst.Call) -> bool:
        """`model.loss(x, y)`: a method of the model that runs its forward on the batch."""
        return (
            isinstance(c.func, cst.Attribute)
            and c.func.attr.value not in self._NOT_FORWARD
            and self.is_model_ref(c.func.value)
        )

    def _within_node(self, node: cst.CSTNode, outer: cst.CSTNode) -> bool:
        while node is not None and node is not outer:
            node = self.parent.get(node)
        return node is outer

    def _call_in(self, loop: cst.CSTNode, fn: cst.FunctionDef) -> cst.Call | None:
        """The one call of fn in the loop's body."""
        calls = [c for c in self.callers(fn) if self._within_node(c, loop)]
        return calls[0] if len(calls) == 1 else None

    def _data_loop(self, step) -> tuple[cst.CSTNode | None, cst.CSTNode]:
        """The loop that feeds the step, and the node in it where the step's forward starts:
        train(x, y) called once per batch from a loop gets its batch from that loop."""
        first = (
            step.loss_stmt or step.forward_first or step.stmt
        )  # the training forward, not an evaluation before it
        loop = self.enclosing_loop(step.stmt)
        fn = self.function_of(step.stmt)
        if loop is None and fn is not None:
            callers = [
                c
                for c in self.callers(fn)
                if not (
                    isinstance(c.func, cst.Attribute)
                    and self.is_model_ref(c.func.value)
                )
            ]
            if len(callers) == 1 and self.enclosing_loop(callers[0]) is not None:
                return self.enclosing_loop(callers[0]), callers[0]
        return loop, first

    def _closure_step(self, step) -> BatchSource | None:
        """optimizer.step(closure) of an LBFGS optimizer (the backward is inside the closure)."""
        for c in self.calls:
            if not m.matches(
                c.func, m.Attribute(attr=m.Name("step"))
            ) or not self.is_optimizer_ref(c.func.value):
                continue
            pos, kw = call_args(c)
            opt = dotted(c.func.value)
            made = self.optimizers.get(opt or "")
            if (
                (pos or "closure" in kw)
                and made is not None
                and self.is_call(made, "torch.optim.LBFGS", "torch.optim.lbfgs.LBFGS")
            ):
                return BatchSource(
                    "closure",
                    c,
                    problem=(
                        "LBFGS re-evaluates the loss in its line search: on each rank that loss is the rank's own, "
                        "so the ranks take different steps (and a different number of backward passes, which hangs DDP); "
                        "ddpify cannot shard this training. Keep it on one process, or use a first-order optimizer"
                    ),
                )
        return None

    def _loop_names(self, loop: cst.For) -> tuple[cst.BaseExpression, list[str]]:
        """The iterable under enumerate(), and the names the loop binds to its items."""
        it, target = loop.iter, loop.target
        if (
            m.matches(it, m.Call(func=m.Name("enumerate")))
            and it.args
            and isinstance(target, cst.Tuple)
            and len(target.elements) == 2
        ):
            it, target = it.args[0].value, target.elements[1].value
        return it, [dotted(t) for t in _flatten_targets(target) if dotted(t)]

    def _slices_with(self, nodes: list[cst.CSTNode], names: set[str]) -> bool:
        """A slice `a[i:i + n]` bounded by one of names (`lrs[epoch]` picks a value, not a batch)."""
        for n in nodes:
            for sub in self.findall(n, m.Subscript()):
                for el in sub.slice:
                    if isinstance(el.slice, cst.Slice) and any(
                        x.value in names for x in self.findall(el.slice, m.Name())
                    ):
                        return True
        return False

    def _range_source(self, loop: cst.For) -> BatchSource | None:
        it, names = self._loop_names(loop)
        if not (m.matches(it, m.Call(func=m.Name("range"))) and names):
            return None
        if self._slices_with([loop.body], set(names)):
            return BatchSource("range", it, loop)
        # get_batch(source, i): the callee slices with the parameter the loop variable fills
        for c in self.findall(loop.body, m.Call()):
            name = dotted(c.func)
            for fn in (
                self.functions.get((name or "").rsplit(".", 1)[-1], []) if name else []
            ):
                params = [
                    p.name.value
                    for p in fn.params.params
                    if p.name.value not in ("self", "cls")
                ]
                pos, kw = call_args(c)
                filled = {
                    params[i]
                    for i, arg in enumerate(pos)
                    if i < len(params) and dotted(arg.value) in names
                }
                filled |= {k for k, arg in kw.items() if dotted(arg.value) in names}
                if filled and self._slices_with([fn.body], filled):
                    return BatchSource("range", it, loop)
        return None

    def _sequence_source(self, loop: cst.For) -> BatchSource | None:
        it, names = self._loop_names(loop)
        if not any(n.value in names for n in self.findall(loop.body, m.Name())):
            return None
        parts = (
            [a.value for a in it.args]
            if m.matches(it, m.Call(func=m.Name("zip")))
            else [it]
        )
        if not parts or not all(isinstance(p, cst.Name) for p in parts):
            return None
        scope = self.function_of(loop)
        for p in parts:
            values = self._local_values(scope, p.value) or self._local_values(
                None, p.value
            )
            if len(values) != 1 or not self._prebatched(values[0]):
                return None
        return BatchSource("sequence", it, loop)

    def _iterable_source(self, loop: cst.For) -> BatchSource | None:
        """The loop iterates an object the script makes its own batches with: an instance of
        its class that defines __iter__, or a call of its generator function (one with yield)."""
        it, names = self._loop_names(loop)
        if not names or not isinstance(it, (cst.Name, cst.Call)):
            return None
        made = self._made_from(it, self.function_of(loop))
        if self._own_batches(made, self.function_of(loop)):
            return BatchSource("iterable", it, loop)
        return None

    def _own_batches(self, made, scope) -> bool:
        """made is the script's own batch iterator: an instance of its class with __iter__ (not
        a Dataset), a call of its generator function, or of a generator method of its object
        (`data.batches(16)`)."""
        if not isinstance(made, cst.Call):
            return False
        if isinstance(made.func, cst.Attribute):
            return self._generator_method(made.func, scope) is not None
        if not isinstance(made.func, cst.Name):
            return False
        name = made.func.value
        cls = self.classes.get(name)
        if cls is not None:
            defs = [s for s in cls.body.body if isinstance(s, cst.FunctionDef)]
            return any(d.name.value == "__iter__" for d in defs) and not any(
                d.name.value == "__getitem__" for d in defs
            )
        fns = self.functions.get(name, [])
        return bool(
            len(fns) == 1
            and self.function_of(fns[0]) is None
            and self.findall(fns[0], m.Yield())
        )

    def _generator_method(self, func: cst.Attribute, scope) -> cst.FunctionDef | None:
        """`obj.method` where obj is made by a class of the program (or is `self` in one) whose
        method of that name yields: the batches come from the script's own generator."""
        receiver = func.value
        if m.matches(receiver, m.Name("self")):
            cls = self.class_of(func)
        else:
            made = (
                self._made_from(receiver, scope)
                if isinstance(receiver, cst.Name)
                else next(iter(self.values_of(receiver)), None)
            )
            cls = (
                self.classes.get(made.func.value)
                if isinstance(made, cst.Call) and isinstance(made.func, cst.Name)
                else None
            )
        if cls is None:
            return None
        for stmt in cls.body.body:
            if (
                isinstance(stmt, cst.FunctionDef)
                and stmt.name.value == func.attr.value
                and any(
                    self.function_of(y) is stmt for y in self.findall(stmt, m.Yield())
                )
            ):
                return stmt
        return None

    def _made_from(
        self, e: cst.BaseExpression, scope, depth: int = 0
    ) -> cst.BaseExpression | None:
        """The one value a name holds where it is iterated: its assignment in scope, or, for a
        parameter of a function with one caller, what that caller hands it."""
        if not isinstance(e, cst.Name) or depth > 3:
            return e
        param = scope is not None and e.value in {
            p.name.value for p in scope.params.params
        }
        values = self._local_values(scope, e.value) or (
            [] if param else self._local_values(None, e.value)
        )
        if len(values) == 1:
            return (
                self._made_from(values[0], scope, depth + 1)
                if isinstance(values[0], cst.Name)
                else values[0]
            )
        callers = self.callers(scope) if param and not values else []
        if len(callers) == 1:
            arg = self.argument_for(callers[0], scope, e.value)
            if arg is not None:
                return self._made_from(arg, self.function_of(callers[0]), depth + 1)
        return None

    def _prebatched(self, value: cst.BaseExpression) -> bool:
        """A list of batches made up front: a list/comprehension, or tensor.split/chunk."""
        if isinstance(
            value, (cst.List, cst.Tuple)
        ):  # [0.1, 0.01] are settings, not batches
            return bool(value.elements) and not any(
                isinstance(e.value, (cst.BaseNumber, cst.BaseString))
                for e in value.elements
            )
        if isinstance(value, cst.ListComp):
            return True
        if isinstance(value, cst.Call):
            if self.is_call(value, "torch.split", "torch.chunk", "torch.unbind"):
                return True
            if (
                isinstance(value.func, cst.Attribute)
                and value.func.attr.value in ("split", "chunk", "unbind")
                and not isinstance(value.func.value, cst.SimpleString)
            ):
                return True
            if m.matches(value.func, m.Name("list")) and value.args:
                return self._prebatched(value.args[0].value) or isinstance(
                    value.args[0].value, cst.GeneratorExp
                )
        return False

    def _random_source(
        self, first: cst.CSTNode, loop: cst.CSTNode | None
    ) -> BatchSource | None:
        if loop is None:
            return None
        reached = self._reached_from(first, loop)
        draws = self._draws_in(reached)
        if not draws:
            return None
        src = BatchSource(
            "random", loop, loop, families={self.draw_family(c) for c in draws}
        )
        src.problem = self._random_problem(loop, reached, draws) or self._data_gate(
            first, loop
        )
        return src

    def _reached_from(self, first: cst.CSTNode, loop: cst.CSTNode) -> list[cst.CSTNode]:
        """What computes the forward's inputs in the loop, up to the forward, and the bodies of
        the script's functions it calls."""
        body = (
            list(loop.body.body)
            if isinstance(loop.body, cst.IndentedBlock)
            else [loop.body]
        )
        top = first
        while top is not None and top not in body:
            top = self.parent.get(top)
        upto = body[: body.index(top) + 1] if top in body else body
        return self._reached(self._feeding(upto, first)[0])

    def _data_gate(self, first: cst.CSTNode, loop: cst.CSTNode) -> str | None:
        """A `while` or `if` around the step whose test reads what the loop computes from its data
        (`while not done:` of an episode, `if done:` at its end): with per-rank data the ranks
        would run different numbers of steps."""
        gates = []
        cur = self.parent.get(first)
        while cur is not None:
            if isinstance(cur, (cst.If, cst.While)):
                gates.append(cur)
            if cur is loop:
                break
            cur = self.parent.get(cur)
        plain = {"len", "range", "int", "float", "min", "max", "abs", "round", "bool"}
        for gate in gates:
            names = {n.value for n in self.findall(gate.test, m.Name())}
            for asg in self.findall(loop, m.Assign() | m.AugAssign()):
                targets = (
                    {
                        dotted(el)
                        for t in asg.targets
                        for el in _flatten_targets(t.target)
                    }
                    if isinstance(asg, cst.Assign)
                    else {dotted(asg.target)}
                )
                if not targets & names:
                    continue
                calls = [
                    c
                    for c in self.findall(asg.value, m.Call())
                    if dotted(c.func) not in plain
                ]
                if not calls:
                    continue
                test = code(gate.test)
                if isinstance(gate, cst.While):
                    return (
                        f"the training steps run in `while {test}:`, which ends when the data says so "
                        f"({code(calls[0].func)}(...)): once each rank draws its own data, the ranks would run different numbers "
                        "of steps and DDP's gradient all-reduce would wait forever; give every rank the same number of updates "
                        "(e.g. collect, then update a fixed number of times), or train on one process"
                    )
                return (
                    f"`if {test}:` decides from the data ({code(calls[0].func)}(...)) whether a training step runs: once each rank "
                    "draws its own data, the ranks would run different numbers of steps and DDP's gradient all-reduce would wait "
                    "forever; give every rank the same number of updates, or train on one process"
                )
        return None

    def _feeding(
        self, stmts: list[cst.CSTNode], first: cst.CSTNode
    ) -> tuple[list[cst.CSTNode], set[str]]:
        """What computes the forward's inputs: the forward statement and, going back through
        stmts, the assignments to the names it reads (an evaluation before it does not count)."""
        out: list[cst.CSTNode] = [first]
        needed = {n.value for n in self.findall(first, m.Name())}
        for s in reversed(stmts):
            if s is first or self._order.get(id(s), 0) > self._order.get(id(first), 0):
                continue
            for asg in self.findall(s, m.Assign()):
                targets = {
                    dotted(el) for t in asg.targets for el in _flatten_targets(t.target)
                }
                if targets & needed:
                    out.append(asg.value)
                    needed |= {n.value for n in self.findall(asg.value, m.Name())}
        return out, needed

    def _random_problem(
        self, loop: cst.CSTNode, reached: list[cst.CSTNode], draws: list[cst.Call]
    ) -> str | None:
        for c in draws:
            if "generator" in call_args(c)[1]:
                return f"`{dotted(c.func)}(..., generator=...)` draws the batch from a generator of the script's own: seed it with RANK added by hand"
        for node in [loop, *reached]:
            for c in self.findall(node, m.Call()):
                if self.is_call(c, *SEEDS):
                    return f"`{dotted(c.func)}` re-seeds the generator inside the training loop: every rank would draw the same batches again; add RANK to that seed by hand"
        for if_ in self.findall(loop.body, m.If()):
            if any(
                self.draw_family(c) for c in self.findall(if_.test, m.Call())
            ) and self.findall(
                if_.body,
                m.Break()
                | m.Continue()
                | m.Return()
                | m.Call(func=m.Attribute(attr=m.Name("backward") | m.Name("step"))),
            ):
                return "a random draw decides whether this step runs: with per-rank draws the ranks would run different numbers of steps (DDP hangs)"
        for fam in {self.draw_family(c) for c in draws} - {"torch"}:
            if self.module_alias(fam) is None:
                return f"the {fam} draws come from names imported out of `{fam}`: ddpify needs `import {fam}` to re-seed it per rank"
        return None

    def module_alias(self, fam: str) -> str | None:
        """The name a library module is bound to at module level ("numpy" -> "np")."""
        full = {"torch": "torch", "numpy": "numpy", "random": "random"}[fam]
        for name, whats in self.bindings.get(None, {}).items():
            if full in whats:
                return name
        return None

    # -- full-batch index -------------------------------------------------------------
    def _index_source(self, step) -> BatchSource | None:
        stmt = step.loss_stmt or step.stmt
        fn = self.function_of(stmt)
        # `target[t]` in a loop over time steps is not a row index
        loop_vars = {
            dotted(t)
            for f in self.fors
            if self.function_of(f) is fn
            for t in _flatten_targets(f.target)
        }
        names = []
        for sub in self.findall(stmt, m.Subscript()):
            if len(sub.slice) == 1 and isinstance(sub.slice[0].slice, cst.Index):
                idx = dotted(sub.slice[0].slice.value)
                if (
                    idx
                    and not idx.isupper()
                    and idx not in names
                    and idx not in loop_vars
                ):
                    names.append(idx)
        if not names:
            return None
        src = BatchSource("index", stmt, self.enclosing_loop(step.stmt), index=names[0])
        picks = sum(
            1
            for sub in self.findall(stmt, m.Subscript())
            if len(sub.slice) == 1
            and isinstance(sub.slice[0].slice, cst.Index)
            and dotted(sub.slice[0].slice.value) == names[0]
        )
        if len(names) > 1:
            src.problem = f"the loss picks rows with several indices ({', '.join(names)}): shard them alike by hand"
        elif picks < 2:
            return None  # out[idx] against targets picked elsewhere: not a full-batch index ddpify can follow
        else:
            src.problem = self._index_origin_problem(stmt, names[0])
        return src

    def _index_origin_problem(self, at: cst.CSTNode, name: str) -> str | None:
        """The index must be the same on every rank, or the ranks' shares overlap and miss rows."""
        values = self._values_reaching(at, name)
        if not values:
            return f"where `{name}` comes from is not visible here: ddpify cannot tell it is the same on every rank"
        # and the values of the names they are computed from (perm in `idx = perm[:30]`)
        seen, work = {name}, list(values)
        while work and len(values) < 32:
            v = work.pop()
            for n in self.findall(v, m.Name()):
                par = self.parent.get(n)
                if (
                    n.value in seen
                    or (isinstance(par, cst.Call) and par.func is n)
                    or (isinstance(par, cst.Attribute) and par.attr is n)
                ):
                    continue
                seen.add(n.value)
                more = self._values_reaching(v, n.value)
                values += more
                work += more
        seeded = {
            fam
            for fam in ("numpy", "random")
            if any(
                self.is_call(
                    c, f"{fam}.random.seed" if fam == "numpy" else "random.seed"
                )
                for c in self.calls
            )
        }
        # unseeded draws before training are seeded from rank 0's seed at the set-up (seeds.py,
        # DDP145): what they draw is the same on every rank
        seeded |= set(self.unseeded_draws().draws)
        for v in values:
            if isinstance(v, (cst.BaseNumber, cst.BaseString, cst.Dict)):
                return f"`{name}` is `{code(v)}`, not an index of rows: ddpify cannot tell which rows the loss reads"
            for c in (
                self.findall(v, m.Call())
                if not isinstance(v, cst.Call)
                else [v, *self.findall(v, m.Call())]
            ):
                fam = self.draw_family(c)
                if fam in ("numpy", "random") and fam not in seeded:
                    return f"`{name}` is drawn with an unseeded {fam} generator: it differs per rank, so the ranks' shares would overlap"
                name_c = dotted(c.func) or ""
                local = (
                    self.functions.get(name_c.rsplit(".", 1)[-1])
                    if "." not in name_c
                    else None
                )
                if local:
                    for fam in (
                        {
                            self.draw_family(d)
                            for d in self._draws_in(
                                self._reached([f.body for f in local])
                            )
                        }
                        - {"torch", None}
                        - seeded
                    ):
                        return f"`{name}` comes from {name_c}(), which draws with an unseeded {fam} generator: it may differ per rank"
                elif (
                    self.draw_family(c) is None
                    and not self._plain_call(c)
                    and "numpy" not in seeded
                ):
                    return (
                        f"`{name}` comes from {name_c}(), which ddpify cannot see: if it splits at random without a seed, "
                        "the ranks' indices differ (seed numpy with np.random.seed, or shard by hand)"
                    )
        return None

    def _plain_call(self, c: cst.Call) -> bool:
        """A call that cannot draw at random: a method of a tensor (.cuda(), .to()), a builtin, a torch op."""
        if isinstance(c.func, cst.Attribute) and not (dotted(c.func) or "").startswith(
            ("np.", "numpy.", "random.")
        ):
            q = self.qualified(c.func)
            return not q or all(x.startswith("torch.") for x in q)
        return dotted(c.func) in (
            "range",
            "list",
            "len",
            "int",
            "sorted",
            "tuple",
            "Variable",
        ) or any(q.startswith("torch.") for q in self.qualified(c.func))

    def _values_reaching(
        self, at: cst.CSTNode, name: str, depth: int = 0
    ) -> list[cst.BaseExpression]:
        """Right-hand sides of the assignments to name in at's scope, following a parameter
        to the callers' arguments (one level) and module-level names."""
        fn = self.function_of(at)
        if fn is not None and name in [p.name.value for p in fn.params.params]:
            if depth > 1:
                return []
            i = [p.name.value for p in fn.params.params].index(name)
            out = []
            for call in self.callers(fn):
                pos, kw = call_args(call)
                arg = (
                    kw[name].value
                    if name in kw
                    else pos[i].value
                    if i < len(pos)
                    else None
                )
                if arg is None or dotted(arg) is None:
                    return []
                out += self._values_reaching(call, dotted(arg), depth + 1)
            return out
        out = []
        for scope in [fn, None] if fn is not None else [None]:
            for asg in self.assigns:
                if (
                    not isinstance(asg, cst.Assign)
                    or self.function_of(asg) is not scope
                ):
                    continue
                if any(
                    dotted(el) == name
                    for t in asg.targets
                    for el in _flatten_targets(t.target)
                ):
                    out.append(asg.value)
            if out:
                return out
        return out


def _params(fn: cst.FunctionDef) -> set[str]:
    return {p.name.value for p in fn.params.params}
