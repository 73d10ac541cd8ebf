"""Data sharding: DistributedSampler on the training DataLoader, set_epoch in the epoch loop."""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import Loader, call_args, code, dotted
from ddpify.transforms.base import Context, Transform, append_kwarg
from ddpify.transforms.batch_scale import batch_note
from ddpify.transforms.streams import library_stream, shard_stream, stream_class
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP020",
    "distributed-sampler",
    "DistributedSampler added to the training DataLoader",
    fix=True,
    check="data-sharding",
)
declare(
    "DDP021",
    "set-epoch",
    "sampler.set_epoch(epoch) added at the top of the epoch loop",
    fix=True,
    check="epoch-shuffle",
)
declare(
    "DDP022",
    "loader-argument-unnamed",
    "training DataLoader whose sampler, batch_sampler or data set ddpify cannot hand to a distributed sampler (it may be None, or it is built inside the call): shard it by hand",
    severity="blocking",
)
declare(
    "DDP115",
    "sampler-wrapped",
    "the training DataLoader's own sampler or batch_sampler wrapped in DistributedSamplerWrapper: each rank takes every WORLD_SIZE-th of what it yields, drawn alike on every rank",
    fix=True,
    check="data-sharding",
)
declare(
    "DDP024",
    "no-training-loader",
    "no training DataLoader found, and no batch source ddpify can follow: the training data would not be sharded",
    severity="blocking",
)
declare(
    "DDP025",
    "eval-loader-unsharded",
    "evaluation DataLoader left unsharded: every rank evaluates the full set",
)
declare(
    "DDP026",
    "batch-size-per-process",
    "batch_size is per process: the global batch is batch_size x WORLD_SIZE",
)
declare(
    "DDP027",
    "epoch-loop-not-found",
    "epoch loop not found: call sampler.set_epoch(epoch) by hand",
    severity="blocking",
)


class SamplerTransform(Transform):
    name = "sampler"
    _attr = "sampler"  # where the loader keeps the sampler that takes set_epoch

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        train = [ld for ld in a.loaders if ld.role == "train"]
        if a.steps and not train and not getattr(ctx, "batches_done", False):
            node = a.steps[0].backward
            ctx.finding(
                node,
                "DDP024",
                "no training DataLoader found, and ddpify cannot follow where this step's batches come from "
                "(not random draws, slices or rows of pre-loaded tensors, a list of batches or the script's own batch iterator): it cannot give each rank "
                "its share; shard them by RANK/WORLD_SIZE by hand",
                False,
            )
        ctx.sharded = []  # type: ignore[attr-defined]
        for ld in a.loaders:
            if not ctx.editable(ld.call):
                if ld.role == "train":
                    ctx.skipped_here(
                        ld.call,
                        "DistributedSampler not added: every rank trains on the full data set",
                        blocking=True,
                    )
                continue
            if ld.role == "eval" and not ctx.opts.shard_eval:
                ctx.finding(
                    ld.call,
                    "DDP025",
                    "evaluation DataLoader left unsharded: every rank evaluates the full set, so metrics stay exact",
                    False,
                )
                continue
            sharded = self._shard(ctx, ld)
            if sharded:
                ctx.sharded.append(ld)  # type: ignore[attr-defined]
                if ld.role == "train":
                    # a batch sampler of its own is wrapped where the loader keeps it
                    self._attr = (
                        "batch_sampler" if sharded == "batch_sampler" else "sampler"
                    )
                    self._set_epoch(ctx, ld)

    # -- the sampler ------------------------------------------------------------------
    def _shard(self, ctx: Context, ld: Loader) -> bool | str:
        """Shard the loader: its own sampler wrapped ("sampler", or "batch_sampler": where the
        loader keeps what takes set_epoch), else a DistributedSampler over its data set (True);
        False where it is not sharded."""
        a = ctx.a
        call = ld.call
        pos, kw = call_args(call)
        given = kw.get("sampler") or (pos[3] if len(pos) > 3 else None)
        batch_given = kw.get("batch_sampler") or (pos[4] if len(pos) > 4 else None)
        # `sampler=None` (or a name that is always None) is no sampler of its own
        if batch_given is not None and not _always_none(a, batch_given.value):
            return self._wrap(ctx, ld, batch_given, "batch_sampler")
        if given is not None and not _always_none(a, given.value):
            return self._wrap(ctx, ld, given, "sampler")
        star = [x for x in call.args if x.star == "**"]
        if ld.dataset is None and not star:
            return False
        if ld.dataset is not None and self._iterable(ctx, ld.dataset):
            shard_stream(ctx, ld)  # no sampler, so no set_epoch: not in ctx.sharded
            return False
        drop_pos_shuffle = None
        if "shuffle" in kw:
            shuffle = kw["shuffle"].value
        elif len(pos) >= 3:
            shuffle = pos[2].value
            drop_pos_shuffle = pos[2]
        elif star:
            shuffle = ctx.expr(f'{code(star[0].value)}.get("shuffle", False)')
        else:
            shuffle = cst.Name("False")
        ds_text = self._dataset_text(ctx, ld, star)
        if ds_text is None:
            return False
        sampler_cls = ctx.name("DistributedSampler")
        shuffle_text = code(shuffle)
        if ld.role == "eval":
            shuffle_text = "False"
        phase = self._training_key(ctx, ld)
        own_shuffle = shuffle_text
        if phase is not None and shuffle_text.strip("() ") == phase[0]:
            shuffle_text = "True"  # `shuffle=phase == "train"`, for the training phase
        sampler = (
            f"{sampler_cls}({ds_text})"
            if shuffle_text == "True"
            else f"{sampler_cls}({ds_text}, shuffle={shuffle_text})"
        )
        if phase is not None and shuffle_text != "False":
            # a comprehension over phases: the training phase alone gets the sampler, the
            # others keep their own shuffle
            test, other = phase
            sampler = f"{sampler} if {test} else None"
            keep = (
                "False"
                if own_shuffle.strip("() ") == test
                else other
                if own_shuffle == "True"
                else f"({own_shuffle}) and {other}"
            )
            kept = kw["shuffle"] if "shuffle" in kw else drop_pos_shuffle
            if kept is not None:
                ctx.edits.replace(kept.value, ctx.expr(keep))
            drop_pos_shuffle = None
        elif phase is not None:
            sampler = f"{sampler} if {phase[0]} else None"
        sampler_arg = cst.Arg(
            keyword=cst.Name("sampler"),
            value=ctx.expr(sampler),
            equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""),
                whitespace_after=cst.SimpleWhitespace(""),
            ),
        )
        shuffle_node = (
            kw["shuffle"] if "shuffle" in kw and phase is None else drop_pos_shuffle
        )
        # `sampler=None`: the DistributedSampler takes its place
        none_arg = given
        if none_arg is not None and none_arg.keyword is None:
            # positional: each argument keeps its place
            ctx.edits.replace(none_arg.value, ctx.expr(sampler))
            ctx.edits.replace(pos[2].value, cst.Name("False"))
            shuffle_node = star = None

        def fn(node: cst.CSTNode, shuffle_node=shuffle_node, star=star) -> cst.CSTNode:
            args = list(node.args)
            out = []
            for orig, new in zip(call.args, args):
                if orig is shuffle_node or (orig is none_arg and orig.keyword):
                    continue
                if star and orig is star[0]:
                    new = new.with_changes(
                        value=ctx.expr(f'{{**{code(orig.value)}, "shuffle": False}}')
                    )
                out.append(new)
            # the sampler goes where `shuffle` was (its comma and layout too), else after the
            # last keyword, separated as the call's arguments are
            at = next(
                (
                    i
                    for i, o in enumerate(call.args)
                    if o is shuffle_node or o is none_arg
                ),
                None,
            )
            if at is not None:
                old = args[at]
                out.insert(
                    len([o for o in call.args[:at] if o is not shuffle_node]),
                    sampler_arg.with_changes(
                        comma=old.comma, whitespace_after_arg=old.whitespace_after_arg
                    ),
                )
                return node.with_changes(args=out)
            idx = len(out)
            while idx > 0 and out[idx - 1].star:
                idx -= 1
            if idx == len(out):
                return append_kwarg(
                    node.with_changes(args=out), "sampler", sampler_arg.value
                )
            sep = (
                out[idx - 1].comma
                if idx and isinstance(out[idx - 1].comma, cst.Comma)
                else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            )
            out.insert(idx, sampler_arg.with_changes(comma=sep))
            return node.with_changes(args=out)

        if none_arg is None or none_arg.keyword:
            ctx.edits.replace(call, fn)
        # without set_epoch a shuffling sampler repeats its first order: see _epoch_severity
        ctx.shuffled = {
            **getattr(ctx, "shuffled", {}),
            id(ld.call): shuffle_text != "False",
        }  # type: ignore[attr-defined]
        what = "training" if ld.role == "train" else "evaluation"
        ctx.finding(
            call,
            "DDP020",
            f"DistributedSampler added to the {what} DataLoader (shuffle={shuffle_text})",
            True,
        )
        if ld.role == "train":
            ctx.finding(call, "DDP026", batch_note(ctx, call), False)
        else:
            ctx.finding(
                call,
                "DDP025",
                "evaluation is sharded (--shard-eval): the sampler pads with repeated samples, so all-reduce sums and counts for exact metrics",
                False,
            )
        return True

    def _dataset_text(self, ctx: Context, ld: Loader, star) -> str | None:
        """How a DistributedSampler names the loader's data set (None: refused, DDP022)."""
        if ld.dataset is None:  # DataLoader(**kwargs): the data set is one of them
            return f'{code(star[0].value)}["dataset"]'
        base = "train_dataset" if ld.role == "train" else "eval_dataset"
        return self._named(ctx, ld, ld.dataset, base, "the data set")

    def _named(
        self,
        ctx: Context,
        ld: Loader,
        expr: cst.BaseExpression,
        base: str,
        what: str,
        replace: bool = True,
    ) -> str | None:
        """expr, to be read twice: as it is where reading it builds nothing (`sets[phase]`),
        else a variable it is first assigned to, before the loader's statement (None where
        there is no such place: refused, DDP022)."""
        a = ctx.a
        call = ld.call
        if not a.findall(expr, m.Call()):
            return code(expr)
        stmt = ld.stmt
        if (
            not isinstance(stmt, cst.SimpleStatementLine)
            or not isinstance(a.block(stmt), (cst.IndentedBlock, cst.Module))
            or _in_comprehension(a, call)
        ):
            inside = _in_comprehension(a, call)
            how = (
                f"inside {inside}, where ddpify cannot give it a name of its own, and the "
                f"distributed sampler needs it too: build {what}s first, in a comprehension of "
                "their own (`items = [... for ...]`), then the loaders over them, and convert again"
                if inside
                else "in the header of a compound statement, where ddpify cannot give it a name "
                "of its own, and the distributed sampler needs it too: assign it to a variable "
                "first (`x = ...`, then `DataLoader(x, ...)`) and convert again"
            )
            ctx.finding(
                expr,
                "DDP022",
                f"{what} `{_short(expr)}` is built inside this DataLoader call, {how}",
                False,
            )
            return None
        name = _unique(a, base)
        ctx.edits.before[stmt].append(ctx.stmt(f"{name} = {code(expr)}\n"))
        if replace:
            ctx.edits.replace(expr, cst.Name(name))
        return name

    def _wrap(self, ctx: Context, ld: Loader, arg: cst.Arg, kind: str) -> bool | str:
        """The loader's own sampler (or batch sampler), whatever it is, gives each rank its
        share at run time: DistributedSamplerWrapper(sampler). Where the sampler may be None
        (no split, a parameter), a DistributedSampler over the data set in that case."""
        a = ctx.a
        call = ld.call
        expr = arg.value
        if not ctx.editable(expr):
            ctx.skipped_here(
                expr,
                f"{kind}= not wrapped to give each rank its share: every rank trains on all of it",
                blocking=ld.role == "train",
            )
            return False
        wrapper = "DistributedSamplerWrapper"
        ctx.helpers.add("sampler_wrapper")
        ctx.require("torch")
        maybe_none = [v for v in _values(a, expr) if _may_be_none(a, v)]
        if not maybe_none:
            ctx.edits.replace(
                expr, lambda n: cst.Call(func=cst.Name(wrapper), args=[cst.Arg(n)])
            )
            ctx.finding(
                expr,
                "DDP115",
                f"`{kind}={_short(expr)}` wrapped in {wrapper}: each rank takes every "
                "WORLD_SIZE-th of what it yields, drawn alike on every rank (set_epoch draws "
                "another order), a last incomplete round dropped so every rank runs as many steps",
                True,
            )
            ctx.finding(call, "DDP026", batch_note(ctx, call), False)
            # whether the sampler shuffles is its own business: a set_epoch not placed is a note
            ctx.shuffled = {**getattr(ctx, "shuffled", {}), id(call): False}  # type: ignore[attr-defined]
            return kind
        # it may be None: then the loader draws from its data set (shuffle=...) instead
        v = maybe_none[0]
        how = f"`{kind}={_short(expr)}` may be None here (" + (
            f"`{_short(a.statement(v))}`{_at(a, v)})"
            if m.matches(v, m.Name("None"))
            else f"`{_short(v)}` is not followed to a sampler)"
        )
        if kind == "batch_sampler":
            ctx.finding(
                expr,
                "DDP022",
                f"{how}: then this DataLoader batches its data set itself, with no sampler that "
                "ddpify could wrap; build it with batch_sampler= only where one is set (a "
                "DataLoader call for each case) and convert again",
                False,
            )
            return False
        pos, kw = call_args(call)
        star = [x for x in call.args if x.star == "**"]
        dataset = self._dataset_text(ctx, ld, star)
        text = dataset and self._named(
            ctx, ld, expr, "train_sampler", "the sampler", replace=False
        )
        if text is None:
            return False
        if "shuffle" in kw:
            shuffle = code(kw["shuffle"].value)
            ctx.edits.replace(kw["shuffle"].value, cst.Name("False"))
        elif len(pos) >= 3:
            shuffle = code(pos[2].value)
            ctx.edits.replace(pos[2].value, cst.Name("False"))
        elif star:
            shuffle = f'{code(star[0].value)}.get("shuffle", False)'
            ctx.edits.replace(
                star[0].value,
                ctx.expr(f'{{**{code(star[0].value)}, "shuffle": False}}'),
            )
        else:
            shuffle = "False"
        ds = ctx.name("DistributedSampler")
        ctx.edits.replace(
            expr,
            ctx.expr(
                f"{wrapper}({text}) if {text} is not None else {ds}({dataset}, shuffle={shuffle})"
            ),
        )
        ctx.shuffled = {**getattr(ctx, "shuffled", {}), id(call): shuffle != "False"}  # type: ignore[attr-defined]
        ctx.finding(
            expr,
            "DDP115",
            f"`sampler={_short(expr)}` wrapped in {wrapper} (each rank takes every "
            "WORLD_SIZE-th of what it yields, drawn alike on every rank); where it is None, a "
            f"DistributedSampler over {dataset} (shuffle={shuffle}) instead",
            True,
        )
        ctx.finding(call, "DDP026", batch_note(ctx, call), False)
        return True

    def _iterable(self, ctx: Context, ds: cst.BaseExpression) -> bool:
        a = ctx.a
        if library_stream(a, ds):
            return True
        cls_name, cls = stream_class(a, ds)
        if not cls_name:
            return False
        if cls is not None:
            return any("IterableDataset" in code(b.value) for b in cls.bases)
        return "IterableDataset" in cls_name

    # -- set_epoch --------------------------------------------------------------------
    def _set_epoch(self, ctx: Context, ld: Loader) -> None:
        a = ctx.a
        done: set[tuple[int, str]] = getattr(ctx, "_epoch_loops_done", set())
        ctx._epoch_loops_done = done  # type: ignore[attr-defined]
        # a loader rebuilt inside the epoch loop: set the epoch right after building it
        home = a.statement(
            ld.home
        )  # where the loader is bound (a subclass: where it is built)
        outer = a.enclosing_loop(home)
        if ld.scope is not None and outer is not None:
            ctx.finding(
                ld.call,
                "DDP027",
                "this loader is built inside a call, anew for each pass in a loop, so no statement can reach "
                "its sampler before the pass: build it before the call (`loader = DataLoader(...)`) and call "
                "loader.sampler.set_epoch(epoch) at the top of each epoch",
                False,
                _epoch_severity(ctx, ld),
            )
            return
        if (
            isinstance(outer, cst.For)
            and ld.target
            and isinstance(outer.target, cst.Name)
        ):
            ctx.edits.after[home].append(
                ctx.stmt(f"{ld.target}.{self._attr}.set_epoch({outer.target.value})\n")
            )
            ctx.finding(
                ld.call,
                "DDP021",
                "sampler.set_epoch(epoch) added so each epoch reshuffles differently",
                True,
            )
            return
        returned = a.returned_as(
            ld.home
        )  # `return DataLoader(...), ...`: the caller's names
        if not ld.target and not returned and a.dict_holders(ld.call):
            # loaders["train"]: each pass over what a training loop iterates starts an epoch
            if self._each_pass(ctx, ld):
                return
            if self._cycled_once(a, ld):
                ctx.finding(
                    ld.call,
                    "DDP021",
                    "no set_epoch needed: the training reads this loader through itertools.cycle, "
                    "which replays its first pass, so its sampler never starts another",
                    False,
                )
                return
        if not ld.target and not returned:
            ctx.finding(
                ld.call,
                "DDP027",
                "this loader has no name (it is built where it is used), so no statement can reach its sampler before a pass: "
                "bind it first (`loader = DataLoader(...)`) and call loader.sampler.set_epoch(epoch) at the top of each epoch",
                False,
                _epoch_severity(ctx, ld),
            )
            return
        before = len(done)
        sites = (
            []
            if returned
            else a.loader_iteration_sites(ld.target, ld.scope or a.function_of(home))
        )
        for name, caller in returned:
            sites += a.loader_iteration_sites(name, caller)
        if not sites:
            # train_loader = DataLoader(...); return train_loader, ... : follow it to the caller
            for name, caller in self._returned(a, ld):
                sites += a.loader_iteration_sites(name, caller)
        if not sites:
            # loaders = get_loaders(); ... self.train_loader = loaders[0]: the tuple's element
            par = a.parent.get(ld.home)
            values = [ld.home] + (
                [par.targets[0].target]
                if isinstance(par, cst.Assign)
                and isinstance(par.targets[0].target, cst.Name)
                else []
            )
            for value in values:
                for name, caller, idx in a.returned_whole(value):
                    sites += a.loader_iteration_sites(name, caller, element=idx)
        self._epoch_sites(ctx, sites, done, _epoch_severity(ctx, ld))
        if len(done) == before and not sites and not self._each_pass(ctx, ld):
            what = ld.target or "loader"
            ctx.finding(
                ld.call,
                "DDP027",
                f"epoch loop not found for `{what}`: call {what}.{self._attr}.set_epoch(epoch) at the top of each epoch by hand",
                False,
                _epoch_severity(ctx, ld),
            )

    def _each_pass(self, ctx: Context, ld: Loader) -> bool:
        """Where the loader cannot be followed to the loops that read it (`loaders["train"]` from a
        helper's dict), each training loop's pass over what it iterates starts a new epoch there,
        and so does each pass of a generator of the script's that hands the training its batches
        (`def cycle(loader): while True: for b in loader: yield b`): next_epoch(<what it
        iterates>) before the loop, which sets the epoch of a distributed sampler when the
        object has one, and does nothing otherwise."""
        a = ctx.a
        done: set[int] = ctx.__dict__.setdefault("_next_epoch_loops", set())
        added = False
        for loop in a.training_loops() + self._generator_passes(a):
            expr = _iterated(loop.iter)
            if expr is None or id(loop) in done or not ctx.editable(loop):
                continue
            done.add(id(loop))
            ctx.helpers.add("next_epoch")
            ctx.edits.before[loop].append(ctx.stmt(f"next_epoch({code(expr)})\n"))
            ctx.finding(
                loop,
                "DDP021",
                f"next_epoch({code(expr)}) added before each pass over the training data: a distributed "
                "sampler's epoch goes up by one there, so each epoch reshuffles differently",
                True,
            )
            added = True
        return added

    @staticmethod
    def _training_key(ctx: Context, ld: Loader) -> tuple[str, str] | None:
        """For a loader a dict comprehension builds for each phase (`{p: DataLoader(...) for p
        in phases}`): (`p == "train"`, `p != "train"`) for the one key the training reads; None
        where it is no such loader, or no one key is found (every phase is then sharded)."""
        comp = ctx.a.parent.get(ld.call)
        if not isinstance(comp, cst.DictComp) or not isinstance(comp.key, cst.Name):
            return None
        keys = ctx.a.trained_keys(ld.call)
        if len(keys) != 1 or "*" in keys:
            return None
        key = next(iter(keys))
        return f"{comp.key.value} == {key}", f"{comp.key.value} != {key}"

    def _generator_passes(self, a) -> list[cst.For]:
        """The loops over a parameter in the script's generator functions whose batches a
        training loop draws with next(): `batches = cycle(loader)`, then `next(batches)`."""
        out: list[cst.For] = []
        for loop in a.training_loops():
            for c in a.findall(loop.body, m.Call(func=m.Name("next"))):
                if not c.args or not isinstance(c.args[0].value, cst.Name):
                    continue
                scope = a.function_of(loop)
                for v in a._local_values(
                    scope, c.args[0].value.value
                ) or a._local_values(None, c.args[0].value.value):
                    name = dotted(v.func) if isinstance(v, cst.Call) else None
                    for fn in a.functions.get(name or "", []):
                        params = {p.name.value for p in fn.params.params}
                        if not a.findall(fn, m.Yield()):
                            continue
                        out += [
                            f
                            for f in a.findall(fn, m.For())
                            if a.function_of(f) is fn
                            and isinstance(f.iter, cst.Name)
                            and f.iter.value in params
                            and all(f is not x for x in out)
                        ]
        return out

    def _cycled_once(self, a, ld: Loader) -> bool:
        """The training reads the loader through itertools.cycle, which replays its first pass
        (in a training loop's header, or bound to a name the loop draws from with next()): the
        loader's sampler never starts another pass, so it needs no set_epoch."""
        holder, loops, fed = (
            a.dict_holders(ld.call),
            a.training_loops(),
            a.fed_by_next(),
        )
        for call in a.calls:
            if "itertools.cycle" not in a.qualified(call.func) or not call.args:
                continue
            if not isinstance(call.args[0].value, cst.Subscript) or (
                dotted(call.args[0].value.value) not in holder
            ):
                continue
            asg = a.parent.get(call)
            if any(_within(a, call, loop.iter) for loop in loops) or (
                isinstance(asg, cst.Assign)
                and any(dotted(t.target) in fed for t in asg.targets)
            ):
                return True
        return False

    def _epoch_stmt(
        self, ctx: Context, where: cst.CSTNode, used: str, counter: str
    ) -> cst.BaseStatement:
        """`used.sampler.set_epoch(counter)` (`used.batch_sampler` for a batch sampler of its
        own); in a helper handed its loader by its callers (a
        shared cycle(loader) or run_epoch(loader)), only where the sampler has set_epoch: another
        caller may hand it a loader without a distributed sampler."""
        fn, attr = ctx.a.function_of(where), self._attr
        head = used.split(".")[0]
        if (
            fn is not None
            and head != "self"
            and head in {p.name.value for p in fn.params.params}
        ):
            return ctx.stmt(
                "# another caller may hand in a loader without a distributed sampler\n"
                f'if hasattr({used}.{attr}, "set_epoch"):\n    {used}.{attr}.set_epoch({counter})\n'
            )
        return ctx.stmt(f"{used}.{attr}.set_epoch({counter})\n")

    @staticmethod
    def _returned(a, ld: Loader):
        """(name, caller) for `train_loader = DataLoader(...)` that its function returns."""
        par = a.parent.get(ld.home)
        if isinstance(par, cst.Assign) and isinstance(par.targets[0].target, cst.Name):
            return a.returned_as(par.targets[0].target)
        return []

    def _epoch_sites(
        self, ctx: Context, sites, done: set[tuple[int, str]], severity: str
    ) -> None:
        a = ctx.a
        for site, used in sites:
            stmt = (
                site if isinstance(site, cst.For) else a.statement(site)
            )  # iter(loader), a comprehension
            loops = self._epoch_loops(ctx, site, used)
            if self._starts_an_epoch(a, stmt, loops):
                # `it = iter(loader)` on rollover, or a pass over the loader inside a
                # `while` loop: the epoch starts right there
                if (id(stmt), used) not in done and not ctx.editable(stmt):
                    done.add((id(stmt), used))
                    ctx.skipped_here(
                        stmt,
                        f"{used}.{self._attr}.set_epoch(...) where this pass over the loader starts",
                        severity == "blocking",
                    )
                elif (id(stmt), used) not in done:
                    done.add((id(stmt), used))
                    counter = (
                        self._epoch_counter(a, stmt) or f"{used}.{self._attr}.epoch + 1"
                    )
                    ctx.edits.before[stmt].append(
                        self._epoch_stmt(ctx, stmt, used, counter)
                    )
                    ctx.finding(
                        stmt,
                        "DDP021",
                        "sampler.set_epoch(...) added where each pass over the loader starts, so each epoch reshuffles differently",
                        True,
                    )
                continue
            for loop, expr in loops:
                if loop is None:
                    continue
                # one set_epoch per loader in the loop: zip(l1, l2) has two
                if (id(loop), expr) in done:
                    continue
                done.add((id(loop), expr))
                if (
                    isinstance(loop, cst.For)
                    and isinstance(loop.target, cst.Name)
                    and not ctx.editable_header(loop)
                ):
                    ctx.skipped_here(
                        loop,
                        f"{expr}.{self._attr}.set_epoch({loop.target.value}) at the top of this epoch loop",
                        severity == "blocking",
                    )
                elif isinstance(loop, cst.For) and any(
                    code(c.func) == f"{expr}.{self._attr}.set_epoch"
                    for c in a.findall(loop.body, m.Call())
                ):
                    ctx.finding(
                        loop,
                        "DDP021",
                        f"{expr}.{self._attr}.set_epoch(...) is called in this epoch loop already",
                        False,
                    )
                elif isinstance(loop, cst.For) and isinstance(loop.target, cst.Name):
                    ctx.edits.prepend[loop].append(
                        self._epoch_stmt(ctx, loop, expr, loop.target.value)
                    )
                    ctx.finding(
                        loop,
                        "DDP021",
                        "sampler.set_epoch(epoch) added so each epoch reshuffles differently",
                        True,
                    )
                elif isinstance(loop, cst.While) and ctx.editable_header(loop):
                    # `while epoch < EPOCHS:` counting by hand: its counter, else the sampler's own count
                    counter = self._epoch_counter(a, loop)
                    counter = (
                        counter
                        if counter and self._counts_in(a, loop, counter)
                        else f"{expr}.{self._attr}.epoch + 1"
                    )
                    ctx.edits.prepend[loop].append(
                        self._epoch_stmt(ctx, loop, expr, counter)
                    )
                    ctx.finding(
                        loop,
                        "DDP021",
                        f"sampler.set_epoch({counter}) added at the top of this epoch loop so each epoch reshuffles differently",
                        True,
                    )
                else:
                    ctx.finding(
                        loop,
                        "DDP027",
                        f"epoch loop is not `for epoch in ...`: call {expr}.{self._attr}.set_epoch(epoch) at the top of each epoch by hand",
                        False,
                        severity,
                    )

    @staticmethod
    def _starts_an_epoch(a, stmt: cst.CSTNode, loops) -> bool:
        """True when the pass over the loader is not the body of a `for epoch` loop of its own."""
        loop = a.enclosing_loop(stmt)
        if isinstance(stmt, cst.For):
            return isinstance(loop, cst.While)
        if not isinstance(a.block(stmt), (cst.IndentedBlock, cst.Module)):
            return False
        if loop is None:
            return not loops  # no caller runs it in a loop either
        # directly in the loop's body (not under try/if): the loop is the epoch loop
        return not (isinstance(loop, cst.For) and a.parent.get(a.block(stmt)) is loop)

    @staticmethod
    def _counts_in(a, loop: cst.CSTNode, name: str) -> bool:
        """name goes up by a step inside loop (`epoch += 1`)."""
        return any(
            isinstance(x.target, cst.Name)
            and x.target.value == name
            and isinstance(x.operator, cst.AddAssign)
            for x in a.findall(loop, m.AugAssign())
        )

    @staticmethod
    def _epoch_counter(a, stmt: cst.CSTNode) -> str | None:
        """The epoch counter, by what the code does: for a `while` epoch loop, a name its test
        reads and its body increases (`while ep < n: ... ep += 1`); where a pass restarts
        inside the loop (`it = iter(loader)` on StopIteration), a name increased beside it
        (`epoch += 1`)."""
        if isinstance(stmt, cst.While):
            tested = {n.value for n in a.findall(stmt.test, m.Name())}
            for aug in a.findall(stmt.body, m.AugAssign()):
                if (
                    isinstance(aug.target, cst.Name)
                    and aug.target.value in tested
                    and isinstance(aug.operator, cst.AddAssign)
                    and a.enclosing_loop(aug) is stmt
                ):
                    return aug.target.value
            return None
        # the statements that start a pass over the same iterator: this one, and the restarts
        # that bind the same name again (`batches = iter(loader)` before the loop and in it)
        starts = [stmt]
        target = (
            stmt.body[0].targets[0].target
            if isinstance(stmt, cst.SimpleStatementLine)
            and isinstance(stmt.body[0], cst.Assign)
            else None
        )
        if target is not None and dotted(target):
            for asg in a.assigns:
                if (
                    isinstance(asg, cst.Assign)
                    and a.function_of(asg) is a.function_of(stmt)
                    and any(dotted(t.target) == dotted(target) for t in asg.targets)
                ):
                    starts.append(a.statement(asg))
        for start in starts:
            for sib in getattr(a.block(start), "body", ()):
                for aug in sib.body if isinstance(sib, cst.SimpleStatementLine) else ():
                    if (
                        isinstance(aug, cst.AugAssign)
                        and isinstance(aug.target, cst.Name)
                        and isinstance(aug.operator, cst.AddAssign)
                    ):
                        # the first pass, before its counter is bound (`passes = 0` after
                        # it): epoch 0, the restarts count on from there
                        bound = _bound_before(a, aug.target.value, stmt)
                        return aug.target.value if bound else "0"
        return None

    def _epoch_loops(self, ctx: Context, site: cst.CSTNode, used: str):
        """(epoch loop, loader expression there) around an iteration site."""
        a = ctx.a
        if not isinstance(site, cst.For):  # iter(loader), a comprehension
            site = a.statement(site)
        loop = a.enclosing_loop(site)
        if loop is not None:
            return [(loop, used)]
        # no loop here: the loops of the callers (`_run_epoch` called once per epoch)
        fn = a.function_of(site)
        if fn is None:
            return []
        params = [p.name.value for p in fn.params.params]
        out = []
        for call in a.callers(fn):
            cloop = a.enclosing_loop(call)
            if cloop is None:
                # one level further: the caller's own callers
                cfn = a.function_of(call)
                if cfn is None:
                    continue
                expr = self._arg_for(a, call, fn, params, used)
                if expr is None:
                    continue
                for call2 in a.callers(cfn):
                    l2 = a.enclosing_loop(call2)
                    if l2 is not None:
                        e2 = self._arg_for(
                            a,
                            call2,
                            cfn,
                            [p.name.value for p in cfn.params.params],
                            expr,
                        )
                        if e2:
                            out.append((l2, e2))
                continue
            expr = self._arg_for(a, call, fn, params, used)
            if expr:
                out.append((cloop, expr))
        return out

    @staticmethod
    def _arg_for(
        a, call: cst.Call, fn: cst.FunctionDef, params: list[str], used: str
    ) -> str | None:
        if used.startswith("self.") and isinstance(call.func, cst.Attribute):
            # trainer.train_epoch() iterates self.loader: at the call site that is trainer.loader
            receiver = code(call.func.value)
            return (
                used
                if receiver == "self"
                else (f"{receiver}.{used[5:]}" if dotted(call.func.value) else None)
            )
        if used not in params:
            return used  # a global: same name at the call site
        arg = a.argument_for(call, fn, used)
        return (
            code(arg) if arg is not None and dotted(arg) is not None else None
        )  # a name the loop can reach


def _iterated(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """What a loop iterates, through enumerate/tqdm/zip-like wrappers: a name, an attribute or a
    literal subscript (`loaders["train"]`); None for a call built in place or a range."""
    while (
        isinstance(node, cst.Call)
        and node.args
        and (dotted(node.func) or "").rsplit(".", 1)[-1]
        in ("enumerate", "tqdm", "iter", "trange", "progress", "track")
    ):
        node = node.args[0].value
    if isinstance(node, (cst.Name, cst.Attribute)):
        return node
    if (
        isinstance(node, cst.Subscript)
        and len(node.slice) == 1
        and isinstance(node.slice[0].slice, cst.Index)
        and isinstance(
            node.slice[0].slice.value, (cst.SimpleString, cst.Integer, cst.Name)
        )
    ):
        return node
    return None


def _values(a, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """What a sampler argument may be, both branches of a conditional expression apart."""
    out: list[cst.BaseExpression] = []
    work, seen = list(a.values_of(expr)), set()
    while work:
        v = work.pop(0)
        if id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v, cst.IfExp):
            work += [*a.values_of(v.body), *a.values_of(v.orelse)]
        elif isinstance(v, cst.Call) and a._returns_of(v, 0) != [v]:
            # pick(...), a function of the program: what it returns
            work += [x for r in a._returns_of(v, 0) for x in a.values_of(r)]
        else:
            out.append(v)
    return out


def _always_none(a, expr: cst.BaseExpression) -> bool:
    """`sampler=None`, or a name bound to None wherever it is assigned: no sampler of its own."""
    return all(m.matches(v, m.Name("None")) for v in _values(a, expr))


def _may_be_none(a, value: cst.BaseExpression) -> bool:
    """value may be None: None itself, or a name or attribute not followed to a value (a
    parameter, an attribute set elsewhere)."""
    if m.matches(value, m.Name("None")):
        return True
    return isinstance(value, (cst.Name, cst.Attribute)) and not a.classes.get(
        dotted(value) or ""
    )


def _at(a, node: cst.CSTNode) -> str:
    """ " at line N" where the node is in the file the finding names (one file)."""
    return "" if a.several_files() else f" at line {a.line_col(node)[0]}"


def _bound_before(a, name: str, stmt: cst.CSTNode) -> bool:
    """name is assigned before stmt in stmt's function (`passes = 0` before the first pass)."""
    fn, at = a.function_of(stmt), a._order.get(id(stmt), 0)
    return any(
        a.function_of(asg) is fn
        and a._order.get(id(asg), 0) < at
        and any(
            # `step, epoch = 0, 0` binds it too
            isinstance(n, cst.Name) and n.value == name
            for tt in getattr(asg, "targets", ())
            for n in (
                [tt.target] + [e.value for e in getattr(tt.target, "elements", ())]
            )
        )
        for asg in a.assigns
        if isinstance(asg, cst.Assign)
    )


def _within(a, node: cst.CSTNode, container: cst.CSTNode) -> bool:
    cur = node
    while cur is not None:
        if cur is container:
            return True
        cur = a.parent.get(cur)
    return False


def _in_comprehension(a, node: cst.CSTNode) -> str:
    """ "a comprehension" or "a lambda" that holds node within its statement ("" if none)."""
    cur = a.parent.get(node)
    while cur is not None and not isinstance(cur, cst.BaseStatement):
        if isinstance(cur, cst.Lambda):
            return "a lambda"
        if isinstance(cur, (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)):
            return "a comprehension"
        cur = a.parent.get(cur)
    return ""


def _short(node: cst.CSTNode, limit: int = 60) -> str:
    text = " ".join(code(node).split())
    if len(text) > limit and isinstance(node, cst.Call):
        text = f"{_short(node.func, limit)}(...)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _unique(a, base: str) -> str:
    names = {n.value for n in a.findall(a.module, m.Name())}
    name, k = base, 2
    while name in names:
        name, k = f"{base}_{k}", k + 1
    return name


def _epoch_severity(ctx: Context, ld: Loader) -> str:
    """A missing set_epoch blocks only where the sampler shuffles (else the order is fixed anyway)."""
    return "blocking" if getattr(ctx, "shuffled", {}).get(id(ld.call), True) else "note"
