"""Rank-0 work: printing, saving, logging, progress bars, metric files and trackers happen
once, on global rank 0. A statement that runs the model or a collective is never guarded."""

from __future__ import annotations

import ast
import re

import libcst as cst
import ddpify.match as m

from ddpify.analysis import call_args, code, dotted
from ddpify.analysis.tree import _inside
from ddpify.analysis import effect_kinds
from ddpify.analysis.writes import WRITE_MODE
from ddpify.transforms.base import Context, Transform, append_kwarg
from ddpify.transforms.dataprep import rank0_alone
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare("DDP060", "rank0-guard", "rank-0 guard added", fix=True, check="rank0-writes")
declare(
    "DDP061",
    "unguarded-collective",
    "not guarded: the statement runs a collective or the model, so every rank must run it",
)
declare(
    "DDP062",
    "progress-bar-rank0",
    "progress bar disabled on ranks other than 0",
    fix=True,
    check="rank0-writes",
)
declare(
    "DDP063",
    "tracker-rank0-only",
    "a tracker that exists on rank 0 only is used on every rank: a value read from it is sent from rank 0 (rank0_value); where it cannot be, a blocking finding",
    severity="blocking",
    fix=True,
    check="rank0-writes",
)
declare(
    "DDP064",
    "unguardable-write",
    "a file write on every rank that ddpify cannot guard: every rank would write the file",
    severity="blocking",
)

LOG_METHODS = {"debug", "info", "warning", "warn", "log"}
MKDIR = ("os.makedirs", "os.mkdir")
TQDM = (
    "tqdm.tqdm",
    "tqdm.auto.tqdm",
    "tqdm.notebook.tqdm",
    "tqdm.trange",
    "tqdm.auto.trange",
    "tqdm.std.tqdm",
)
TRACKER_PREFIXES = ("wandb.", "mlflow.", "neptune.", "comet_ml.")
SUMMARY_WRITERS = (
    "torch.utils.tensorboard.SummaryWriter",
    "tensorboardX.SummaryWriter",
    "torch.utils.tensorboard.writer.SummaryWriter",
)
PURE_BUILTINS = {
    "round",
    "len",
    "str",
    "int",
    "float",
    "abs",
    "min",
    "max",
    "sum",
    "format",
    "repr",
    "bool",
}


class Rank0Transform(Transform):
    name = "rank0"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        loggers = self._bound_to(ctx, lambda c: a.is_call(c, "logging.getLogger"))
        writers = self._bound_to(ctx, lambda c: self._creates(a, c))
        # a tracker (None on other ranks) passed to a function: its parameter there is one too
        self._trackers = a._propagate(sorted(writers)) if writers else {}
        self._homes = {
            (id(a.function_of(c)), a._assign_target(c))
            for c in a.calls
            if self._creates(a, c) and a._assign_target(c)
        }
        self._home_classes = {
            (id(a.class_of(c)), t)
            for f, t in self._homes
            for c in a.calls
            if id(a.function_of(c)) == f and a._assign_target(c) == t
        }
        bars = self._bound_to(ctx, lambda c: a.is_call(c, *TQDM))
        csv_writers = self._bound_to(
            ctx, lambda c: a.is_call(c, "csv.writer", "csv.DictWriter")
        )
        guarded: set[cst.BaseStatement] = set()
        unguarded: list[
            tuple[cst.Call, str]
        ] = []  # file writes in statements a guard cannot hold
        # data preparation that rank 0 alone runs, whole (dataprep.py puts the barrier after it):
        # what it and the functions only it calls write needs no guard of its own
        whole, self._prep_only = rank0_alone(ctx)
        for stmt in whole:
            guarded.add(stmt)
            ctx.edits.guarded.add(stmt)
        for call in a.calls:
            if not ctx.editable(call) or self._rank0_already(a, call, whole):
                continue
            if a.is_call(call, *TQDM):
                self._quiet_bar(ctx, call)
                continue
            if self._creates_tracker(ctx, call):
                continue
            reason = self._rank0_reason(ctx, call, loggers, writers, bars, csv_writers)
            if reason is None:
                continue
            stmt = a.statement(call)
            if stmt in guarded:
                continue
            if not self._guardable(ctx, stmt, call):
                if ctx.effects.writer(call) is not None:
                    unguarded.append((call, reason))
                continue
            if a.runs_collective(stmt) and self._hoist(ctx, stmt, call, reason):
                guarded.add(stmt)
                ctx.edits.guarded.add(stmt)
                continue
            if a.runs_collective(stmt):
                ctx.finding(
                    call,
                    "DDP061",
                    f"{reason} left on every rank: the statement also runs the model or a collective; compute the value first, then print/save it under `if RANK == 0:`",
                    False,
                )
                continue
            guarded.add(stmt)
            ctx.edits.guarded.add(stmt)
            ctx.finding(call, "DDP060", f"{reason} on global rank 0 only", True)
        self._open_for_write(ctx, guarded)
        self._tracker_uses(ctx, guarded)
        for call, reason in unguarded:
            if not self._in_guarded(a, call, guarded):
                ctx.finding(
                    call,
                    "DDP064",
                    f"{reason} writes a file on every rank, and this statement cannot be put under a guard as it is: write it as its own statement under `if RANK == 0:`",
                    False,
                )
        ctx.edits.guard_test = ctx.expr("RANK == 0")

    def _rank0_already(self, a, node: cst.CSTNode, whole) -> bool:
        """node runs on rank 0 alone already: in a statement guarded whole, or in a function of the
        script that only such statements call."""
        if any(_inside(a, node, w) for w in whole) or a.hand_guarded(node):
            return True
        fn = a.function_of(node)
        while fn is not None:
            if fn.name.value in self._prep_only:
                return True
            fn = a.function_of(fn)
        return False

    def _tracker(self, a, node: cst.CSTNode, name: str | None) -> bool:
        """name is, where node is, a tracker that exists on rank 0 only."""
        fn = a.function_of(node)
        return (
            name is not None and fn is not None and name in self._trackers.get(fn, ())
        )

    def _tracker_uses(self, ctx: Context, guarded: set) -> None:
        """A tracker is None on other ranks: a use left outside a rank-0 guard (an assignment
        from it, an argument to a call ddpify does not guard) would fail there."""
        a = ctx.a
        names = {n for ns in self._trackers.values() for n in ns}
        if not names:
            return
        for attr in a.attributes:
            # run.config.update(...): the tracker is `run`; self.writer.log_dir: `self.writer`
            parts = (dotted(attr.value) or "").split(".")
            base = next(
                (
                    ".".join(parts[:k])
                    for k in range(len(parts), 0, -1)
                    if ".".join(parts[:k]) in names
                ),
                None,
            )
            if (
                base is None
                or not ctx.editable(attr)
                or isinstance(a.parent.get(attr), cst.Attribute)
            ):
                continue
            fn = a.function_of(attr)
            home = (id(fn), base) in self._homes or (
                fn is not None
                and (id(None), base) in self._homes
                and not a._is_local(fn, base)
            )
            # self.writer made in __init__: every method of the class reads the same attribute
            home = home or (
                base.startswith("self.")
                and (id(a.class_of(attr)), base) in self._home_classes
            )
            if not home and base not in self._trackers.get(fn, ()):
                continue  # another variable of the same name
            if self._in_guarded(a, attr, guarded | ctx.edits.guarded) or self._checked(
                a, attr, base
            ):
                continue
            stmt = a.statement(attr)
            if self._tracker_statement(ctx, stmt, base):
                guarded.add(stmt)
                ctx.edits.guarded.add(stmt)
                ctx.finding(
                    attr,
                    "DDP060",
                    f"{code(attr)} on global rank 0 only ({base} exists there only)",
                    True,
                )
                continue
            if self._rank0_caller(ctx, stmt):
                continue  # only rank 0 runs it, where the tracker exists
            why = self._from_rank0(ctx, attr, base)
            if why is None:
                continue
            ctx.finding(
                attr,
                "DDP063",
                f"{base} exists on global rank 0 only (None elsewhere) and {code(attr)} is used here on every rank, "
                f"where ddpify cannot send rank 0's value ({why}): read it once where every rank passes, "
                f"or put this use under `if {base} is not None:`",
                False,
            )

    def _from_rank0(self, ctx: Context, attr: cst.Attribute, base: str) -> str | None:
        """A value read from a tracker ddpify made rank-0-only (`log_dir = writer.log_dir`,
        `name = f"model-{run.id}.pt"`): rank 0 reads it and sends it to every rank
        (rank0_value(lambda: ...), one broadcast), so every rank goes on with the value the one
        process had. Only where every rank runs the statement as often as the others: not per
        item, not in a function handed over as a value (a callback), not in a `while` loop that
        trains nothing (a `for` loop runs as often on every rank; a loop that trains does too,
        its backward being a collective). None when done, else why not."""
        a = ctx.a
        expr: cst.CSTNode = attr
        while True:
            par = a.parent.get(expr)
            if (
                isinstance(par, cst.Call)
                and par.func is expr
                or isinstance(par, (cst.Subscript, cst.Attribute))
                and par.value is expr
            ):
                expr = par
            else:
                break
        stmt = a.statement(expr)
        if (
            stmt is None
            or not isinstance(a.block(stmt), (cst.IndentedBlock, cst.Module))
            or not ctx.editable(stmt)
        ):
            return "a statement ddpify cannot change here"
        if a.runs_per_item(stmt):
            return "code that runs per item or is handed over as a value (a Dataset's method, a callback)"
        if any(isinstance(n, cst.Lambda) for n in _ancestors(a, expr, stmt)):
            return "a lambda, which may run any number of times on each rank"
        loop = a.enclosing_loop(stmt)
        while loop is not None:
            if isinstance(loop, cst.While) and not any(
                _inside(a, st.stmt, loop) for st in a.steps
            ):
                return "a `while` loop that may run a different number of times on each rank"
            loop = a.enclosing_loop(loop)
        if a.runs_model(expr) or a.runs_collective(expr):
            return "the value runs the model or a collective"
        # what rank 0 alone would evaluate must have no effect the other ranks need
        other = next(
            (
                c
                for c in a.findall(expr, m.Call())
                if not _on(c.func, base) and not self._pure(c)
            ),
            None,
        )
        if other is not None:
            return f"it also runs {code(other.func)}(...), which every rank must run"
        if (
            isinstance(stmt, cst.SimpleStatementLine)
            and isinstance(stmt.body[0], cst.Expr)
            and stmt.body[0].value is expr
        ):
            return "a call whose value is not kept: nothing to send"
        ctx.helpers.add("rank0_value")
        ctx.edits.replace(
            expr,
            lambda n: cst.Call(
                func=cst.Name("rank0_value"),
                args=[cst.Arg(cst.Lambda(params=cst.Parameters(), body=n))],
            ),
        )
        ctx.finding(
            attr,
            "DDP063",
            f"{code(expr)} read on global rank 0, where {base} exists, and sent to every rank (rank0_value: one broadcast)",
            True,
        )
        return None

    @staticmethod
    def _rank0_caller(ctx: Context, stmt: cst.CSTNode) -> bool:
        """stmt runs on rank 0 alone: its function is called only from statements guarded to rank 0
        (or from functions called only so)."""
        a = ctx.a
        fn = a.function_of(stmt)
        seen: set[int] = set()

        def only_rank0(f, depth=0) -> bool:
            if f is None or depth > 6 or id(f) in seen:
                return False
            seen.add(id(f))
            calls = a.callers(f)
            return bool(calls) and all(
                any(c is g or _inside(a, c, g) for g in ctx.edits.guarded)
                or only_rank0(a.function_of(c), depth + 1)
                for c in calls
            )

        return only_rank0(fn)

    def _tracker_statement(self, ctx: Context, stmt: cst.CSTNode, base: str) -> bool:
        """A statement that only feeds the tracker, so rank 0 alone may run it: one call whose
        result is dropped (run.config.update(...)) or an assignment into the tracker
        (run.summary["best"] = acc), that runs no model, no collective and none of the script's
        own functions (their side effects may be needed on every rank), and is a statement of a
        block (a guard can hold it). Its value is not kept, so no rank needs it later."""
        a = ctx.a
        if (
            not isinstance(stmt, cst.SimpleStatementLine)
            or len(stmt.body) != 1
            or not ctx.editable(stmt)
        ):
            return False
        if not isinstance(a.block(stmt), (cst.IndentedBlock, cst.Module)):
            return False
        small = stmt.body[0]
        if isinstance(small, cst.Expr):
            if not isinstance(small.value, cst.Call) or _root(small.value.func) != base:
                return False
        elif isinstance(small, (cst.Assign, cst.AugAssign)):
            targets = (
                [t.target for t in small.targets]
                if isinstance(small, cst.Assign)
                else [small.target]
            )
            if not all(
                isinstance(t, (cst.Attribute, cst.Subscript)) and _root(t) == base
                for t in targets
            ):
                return False
        else:
            return False
        if a.runs_model(stmt) or a.runs_collective(stmt):
            return False
        for c in a.findall(stmt, m.Call()):
            name = (dotted(c.func) or "").rsplit(".", 1)[-1]
            if name in a.functions or name == "next":
                return False
        return True

    @staticmethod
    def _checked(a, node: cst.CSTNode, name: str) -> bool:
        """node sits under `if name:` / `if name is not None:` / `x if name else y` / a RANK test
        (ddpify's or the script's own)."""
        if a.hand_guarded(node):
            return True
        cur = a.parent.get(node)
        while cur is not None:
            if isinstance(cur, (cst.If, cst.IfExp)) and re.search(
                rf"(?<![\w.]){re.escape(name)}(?![\w(])|\bRANK\b", code(cur.test)
            ):
                return True
            if isinstance(cur, cst.BooleanOperation) and re.search(
                rf"(?<![\w.]){re.escape(name)}(?![\w(])", code(cur.left)
            ):
                return True
            cur = a.parent.get(cur)
        return False

    def _hoist(
        self, ctx: Context, stmt: cst.BaseStatement, call: cst.Call, reason: str
    ) -> bool:
        """print(..., evaluate(model)): every rank evaluates (DDP's forward syncs buffers),
        rank 0 prints. The call is hoisted into a variable when the arguments before it are
        plain formatting, so no side effect changes order."""
        a = ctx.a
        if (
            reason not in ("print", "logging")
            or not isinstance(stmt, cst.SimpleStatementLine)
            or stmt.body[0].value is not call
        ):  # type: ignore[attr-defined]
            return False
        inner = [
            c
            for c in a.findall(call, m.Call())
            if c is not call
            and (
                a._is_collective_call(c)
                or a._calls_function_in(c, a.collective_functions)
            )
        ]
        # outermost collective calls only, in source order
        inner = [
            c
            for c in inner
            if not any(o is not c and self._within(a, c, o) for o in inner)
        ]
        if not inner:
            return False
        # a call inside a comprehension or lambda reads names bound there: it cannot move out
        scoped = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp, cst.Lambda)
        for c in inner:
            cur = a.parent.get(c)
            while cur is not None and cur is not call:
                if isinstance(cur, scoped):
                    return False
                cur = a.parent.get(cur)
        first = a.pos[inner[0]].start
        for c in a.findall(call, m.Call()):
            if c is call or any(c is i or self._within(a, c, i) for i in inner):
                continue
            if (a.pos[c].start.line, a.pos[c].start.column) < (
                first.line,
                first.column,
            ) and not self._pure(c):
                return False
        # the hoisted copy carries the edits planned inside it so far (train(ddp_model, ...))
        if any(node is c for c in inner for node in ctx.edits.expr):
            return False
        names: list[str] = []
        taken = {n.value for n in a.findall(a.module, m.Name())}
        for c in inner:
            base = (dotted(c.func) or "value").rsplit(".", 1)[-1].strip("_") or "value"
            name, k = f"{base}_result", 2
            while name in taken:
                name, k = f"{base}_result_{k}", k + 1
            taken.add(name)
            names.append(name)
            ctx.edits.before[stmt].append(
                ctx.stmt(f"{name} = {code(_double_quoted(_edited(ctx, c)))}\n")
            )
            ctx.edits.replace(c, cst.Name(name))
        ctx.finding(
            call,
            "DDP060",
            f"{reason} on global rank 0 only; {', '.join(names)} computed on every rank first (it runs the model or a collective)",
            True,
        )
        return True

    @staticmethod
    def _pure(c: cst.Call) -> bool:
        return (
            m.matches(c.func, m.Name())
            and c.func.value in PURE_BUILTINS
            or (  # type: ignore[attr-defined]
                isinstance(c.func, cst.Attribute)
                and c.func.attr.value in ("item", "format", "tolist", "mean", "sum")
            )
        )

    def _bound_to(self, ctx: Context, pred) -> set[str]:
        names = set()
        for c in ctx.a.calls:
            if pred(c):
                t = ctx.a._assign_target(c)
                if t:
                    names.add(t)
                par = ctx.a.parent.get(c)
                if isinstance(par, cst.WithItem) and par.asname is not None:
                    n = dotted(par.asname.name)
                    if n:
                        names.add(n)
        return names

    def _rank0_reason(
        self, ctx, call, loggers, writers, bars, csv_writers
    ) -> str | None:
        a = ctx.a
        func = call.func
        if m.matches(func, m.Name("print")):
            _, kw = call_args(call)
            if "file" in kw and dotted(kw["file"].value) == "sys.stderr":
                return None  # stderr stays on every rank: each rank's warnings and errors show
            return "print"
        what = ctx.effects.writer(
            call
        )  # the one table of file writers (ddpify/analysis/writes.py)
        if what is not None:
            return what
        if a.is_call(call, *MKDIR):
            _, kw = call_args(call)
            if "exist_ok" in kw and m.matches(kw["exist_ok"].value, m.Name("True")):
                return None
            return f"{dotted(func)}"
        qs = a.qualified(func)
        if any(q.startswith(TRACKER_PREFIXES) for q in qs):
            return f"{dotted(func)}"
        if isinstance(func, cst.Attribute):
            base = dotted(func.value)
            meth = func.attr.value
            if any(
                q.startswith("logging.") and q.rsplit(".", 1)[-1] in LOG_METHODS
                for q in qs
            ):
                return "logging"
            if base in loggers and meth in LOG_METHODS:
                return "logging"
            if base in writers or self._tracker(a, call, base):
                return f"{base}.{meth}"
            if base in csv_writers:
                return f"{base}.{meth}"
            if meth == "write" and (
                base in bars
                or any(q in ("tqdm.tqdm.write", "tqdm.auto.tqdm.write") for q in qs)
            ):
                return "progress-bar write"
            if meth == "mkdir" and not any(
                k.keyword
                and k.keyword.value == "exist_ok"
                and m.matches(k.value, m.Name("True"))
                for k in call.args
            ):
                return None if base is None else None
        return self._library_effect(a, call)

    @staticmethod
    def _library_effect(a, call: cst.Call) -> str | None:
        """A call into an imported library, handed a path, whose value is dropped: it writes
        somewhere, whatever the library is (analysis/effect_kinds.py)."""
        if not isinstance(a.parent.get(call), cst.Expr):
            return None
        root = call.func
        while isinstance(root, cst.Attribute):
            root = root.value
        if not isinstance(root, cst.Name) or root is call.func:
            return None
        bound = [w for names in a.bindings.values() for w in names.get(root.value, ())]
        # `try: import imageio except ImportError: imageio = None`: where it is called, it is
        # the library (the gate reads it so too)
        imported = any(w != "<value>" for w in bound) and not any(
            w.startswith("__ddpify_import_") for w in bound
        )
        name = next(iter(sorted(a.qualified(call.func))), dotted(call.func) or "")
        given = any(_pathish(a, arg.value) for arg in call.args)
        return (
            f"{dotted(call.func)} (a library call given a path)"
            if effect_kinds.library_effect(name, imported, given, False)
            else None
        )

    def _guardable(self, ctx: Context, stmt: cst.BaseStatement, call: cst.Call) -> bool:
        a = ctx.a
        if not isinstance(a.block(stmt), (cst.IndentedBlock, cst.Module)):
            return False
        if (
            isinstance(stmt, cst.If)
            and isinstance(stmt.body, cst.SimpleStatementSuite)
            and stmt.orelse is None
        ):
            # `if best: torch.save(...)` on one line: the whole if goes under the guard
            body = stmt.body.body
            return (
                len(body) == 1
                and isinstance(body[0], cst.Expr)
                and (body[0].value is call or self._within(a, call, body[0].value))
            )
        if isinstance(stmt, cst.SimpleStatementLine):
            if len(stmt.body) != 1 or not isinstance(stmt.body[0], cst.Expr):
                return False
            return stmt.body[0].value is call or self._within(
                a, call, stmt.body[0].value
            )
        return False

    @staticmethod
    def _within(a, node, container) -> bool:
        cur = a.parent.get(node)
        while cur is not None:
            if cur is container:
                return True
            cur = a.parent.get(cur)
        return False

    @staticmethod
    def _creates(a, call: cst.Call) -> bool:
        return a.is_call(call, *SUMMARY_WRITERS) or any(
            q.startswith(TRACKER_PREFIXES) and q.endswith(".init")
            for q in a.qualified(call.func)
        )

    def _creates_tracker(self, ctx: Context, call: cst.Call) -> bool:
        """writer = SummaryWriter(...) / run = wandb.init(...): None on other ranks."""
        a = ctx.a
        if not self._creates(a, call):
            return False
        par = a.parent.get(call)
        if isinstance(par, (cst.Assign, cst.AnnAssign)):
            ctx.edits.replace(
                call,
                lambda n: cst.IfExp(
                    test=ctx.expr("RANK == 0"), body=n, orelse=cst.Name("None")
                ),
            )
            ctx.finding(
                call,
                "DDP060",
                f"{dotted(call.func)} created on global rank 0 only (None elsewhere)",
                True,
            )
            return True
        return False

    def _quiet_bar(self, ctx: Context, call: cst.Call) -> None:
        _, kw = call_args(call)
        stars = [x for x in call.args if x.star == "**"]
        read = self._bar_read(ctx, call)
        if read is not None:
            self._bar_to_stdout(ctx, call, read)
            return
        if "disable" in kw:
            old = code(kw["disable"].value)
            old = (
                old
                if isinstance(
                    kw["disable"].value,
                    (cst.Name, cst.Attribute, cst.Call, cst.Subscript),
                )
                else f"({old})"
            )
            ctx.edits.replace(kw["disable"].value, ctx.expr(f"{old} or RANK != 0"))
        elif stars:
            # **opts may hold disable= itself: a second keyword would be a TypeError
            last = stars[-1]
            opts = code(last.value)
            merged = ctx.expr(
                f'{{**{opts}, "disable": {opts}.get("disable", False) or RANK != 0}}'
            )
            ctx.edits.replace(last.value, merged)
        else:
            ctx.edits.replace(
                call, lambda n: append_kwarg(n, "disable", ctx.expr("RANK != 0"))
            )
        ctx.finding(call, "DDP062", "progress bar shown on global rank 0 only", True)

    @staticmethod
    def _bar_read(ctx: Context, call: cst.Call) -> str | None:
        """A value the script reads off the bar (`pbar.n`, `pbar.format_dict`, a method whose
        result it keeps): a disabled bar counts nothing, so those reads would differ on other
        ranks (0, and a ZeroDivisionError where the script divides by it). None where the script
        only drives its display."""
        a = ctx.a
        name = a._assign_target(call)
        par = a.parent.get(call)
        if name is None and isinstance(par, cst.WithItem) and par.asname is not None:
            name = dotted(par.asname.name)
        if not name:
            return None
        # where that name means this bar: its function, or the class for self.pbar
        home = a.class_of(call) if name.startswith("self.") else a.function_of(call)
        for attr in a.attributes:
            if dotted(attr.value) != name or (
                home is not None and not _inside(a, attr, home)
            ):
                continue
            if home is None and a.function_of(attr) is not None:
                if a._is_local(a.function_of(attr), name):
                    continue  # another variable of the same name
            use = a.parent.get(attr)
            if isinstance(use, cst.Call) and use.func is attr:
                if isinstance(a.parent.get(use), cst.Expr):
                    continue  # pbar.update(1), pbar.set_postfix(...): display only
                return code(use)
            if isinstance(use, (cst.AssignTarget, cst.AugAssign)) and (
                getattr(use, "target", None) is attr
            ):
                continue  # pbar.total = n: set, not read
            return code(attr)
        return None

    def _bar_to_stdout(self, ctx: Context, call: cst.Call, read: str) -> None:
        """The bar keeps counting on every rank; only its display changes stream: other ranks'
        stdout goes to os.devnull from the set-up on (launch.py)."""
        _, kw = call_args(call)
        sysname = ctx.name("sys")
        if "file" in kw:
            old = kw["file"].value
            if dotted(old) in ("sys.stdout", f"{sysname}.stdout"):
                ctx.finding(
                    call,
                    "DDP062",
                    f"progress bar kept counting on every rank (the script reads {read}); "
                    "it writes to stdout, which is os.devnull on the other ranks",
                    True,
                )
                return
            ctx.edits.replace(
                old,
                lambda n: cst.IfExp(
                    test=ctx.expr("RANK == 0"),
                    body=n,
                    orelse=ctx.expr(f"{sysname}.stdout"),
                ),
            )
        else:
            value = ctx.expr(f"{sysname}.stderr if RANK == 0 else {sysname}.stdout")
            ctx.edits.replace(call, lambda n: append_kwarg(n, "file", value))
        ctx.finding(
            call,
            "DDP062",
            f"progress bar shown on global rank 0 only, and still counting on every rank (the "
            f"script reads {read}): the other ranks draw it on their stdout, which is os.devnull "
            "there",
            True,
        )

    def _open_for_write(self, ctx: Context, guarded: set) -> None:
        """open(path, "w") on other ranks writes to os.devnull: the code around it runs
        unchanged on every rank, and only rank 0's file reaches the disk. The same for the
        file of a logging.FileHandler / basicConfig(filename=...)."""
        a = ctx.a
        for call in a.calls:
            if (
                not ctx.editable(call)
                or self._in_guarded(a, call, guarded)
                or self._rank0_already(a, call, ())
            ):
                continue
            mode = ctx.effects.open_mode(call)
            if (
                mode is not None
                and WRITE_MODE.search(mode)
                and isinstance(call.func, cst.Attribute)
                and dotted(call.func) not in ("io.open", "codecs.open")
            ):
                self._path_open(ctx, call, guarded)
                continue
            if (
                mode is not None
                and WRITE_MODE.search(mode)
                and call.args
                and call.args[0].keyword is None
            ):
                path, what = call.args[0].value, "file opened for writing"
            else:
                path, what = ctx.effects.file_handler(call), f"{dotted(call.func)} file"
                if path is None:
                    if ctx.effects.other_opener(call):
                        ctx.finding(
                            call,
                            "DDP064",
                            f"{dotted(call.func) or code(call.func)} opens a file for writing on every rank: "
                            "open it under `if RANK == 0:` (or give other ranks a path of their own)",
                            False,
                        )
                    continue
            osname = ctx.name("os")
            ctx.edits.replace(
                path,
                lambda n, osname=osname: cst.IfExp(
                    test=ctx.expr("RANK == 0"),
                    body=n,
                    orelse=ctx.expr(f"{osname}.devnull"),
                ),
            )
            guarded.add(path)  # the path is read on rank 0 alone now
            ctx.finding(
                call,
                "DDP060",
                f"{what} on global rank 0 only (os.devnull elsewhere)",
                True,
            )

    def _path_open(self, ctx: Context, call: cst.Call, guarded: set) -> None:
        """(out / "log.txt").open("w"): a Path of the same type to os.devnull on other ranks."""
        path = call.func.value  # type: ignore[attr-defined]
        if not all(
            isinstance(
                n, (cst.Name, cst.Attribute, cst.SimpleString, cst.BinaryOperation)
            )
            for n in ctx.a.findall(path, m.Name() | m.Call())
        ) or ctx.a.findall(path, m.Call()):
            ctx.finding(
                call,
                "DDP064",
                f"{code(call.func)} writes a file on every rank: open it under `if RANK == 0:` (or a path to os.devnull elsewhere)",
                False,
            )
            return
        osname = ctx.name("os")
        ctx.edits.replace(
            path,
            lambda n, osname=osname: ctx.expr(
                f"({code(n)} if RANK == 0 else type({code(n)})({osname}.devnull))"
            ),
        )
        guarded.add(path)
        ctx.finding(
            call,
            "DDP060",
            "file opened for writing on global rank 0 only (os.devnull elsewhere)",
            True,
        )

    @staticmethod
    def _in_guarded(a, node, guarded) -> bool:
        cur = node
        while cur is not None:
            if cur in guarded:
                return True
            cur = a.parent.get(cur)
        return False


def _ancestors(a, node: cst.CSTNode, stop: cst.CSTNode):
    cur = a.parent.get(node)
    while cur is not None and cur is not stop:
        yield cur
        cur = a.parent.get(cur)


def _pathish(a, node: cst.BaseExpression) -> bool:
    """A path, as the gate reads one (analysis/effect_kinds.py): a string with a folder or an
    extension, an f-string, `d / "x"`, os.path.join(...)/Path(...), a name such as out_dir or
    ckpt_path, or a name whose value is one of those."""
    fn = a.function_of(node)

    def values(n: ast.AST) -> list[ast.AST]:
        if not isinstance(n, ast.Name):
            return []
        found = a._local_values(fn, n.id)
        if not found and fn is not None and not a._is_local(fn, n.id):
            found = a._local_values(None, n.id)
        return [v for v in (_as_ast(x) for x in found) if v is not None]

    tree = _as_ast(node)
    return tree is not None and effect_kinds.pathish(tree, values)


def _as_ast(node: cst.CSTNode) -> ast.AST | None:
    try:
        return ast.parse(code(node).strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None


def _root(node: cst.CSTNode) -> str | None:
    """run for run.config.update, run.summary["best"]: the name an attribute chain starts at."""
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        node = node.value
    return dotted(node)


def _edited(ctx: Context, node: cst.CSTNode) -> cst.CSTNode:
    """node with the expression edits planned inside it so far."""
    from ddpify.edits import Applier

    applier = Applier(ctx.edits)
    return node.visit(applier) if applier.dirty is None else applier._visit(node)


def _on(node: cst.CSTNode, base: str) -> bool:
    """node is reached from `base` (writer.get_logdir().rstrip, self.writer.file_writer.flush)."""
    while node is not None:
        name = dotted(node)
        if name is not None and (name == base or name.startswith(base + ".")):
            return True
        node = (
            node.func
            if isinstance(node, cst.Call)
            else getattr(node, "value", None)
            if isinstance(node, (cst.Attribute, cst.Subscript))
            else None
        )
    return False


class _DoubleQuotes(cst.CSTTransformer):
    def leave_SimpleString(self, original, updated):
        v = updated.value
        prefix = v[: len(v) - len(v.lstrip("rbuRBU"))]
        body = v[len(prefix) :]
        if (
            body[:1] == "'"
            and body[:3] != "'''"
            and '"' not in body
            and "\\" not in body
        ):
            return updated.with_changes(value=f'{prefix}"{body[1:-1]}"')
        return updated


def _double_quoted(node: cst.CSTNode) -> cst.CSTNode:
    """A call hoisted out of an f-string keeps the single quotes it needed there; outside it,
    the quotes black and ruff write."""
    return node.visit(_DoubleQuotes())
