"""What every concern gets: the shared analysis, the options, the edit plan and findings."""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import Analysis, devices
from ddpify.analysis.project import binds
from ddpify.edits import Edits
from ddpify.analysis.writes import Effects
from ddpify.findings import Finding
from ddpify.options import Options
from ddpify.rules import Said, declare
from ddpify.transforms.plans import Plans

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP098",
    "skipped-by-directive",
    "left as written where `# ddpify: skip`/`off` asked (says what was not done)",
)

# Import each generated name needs, and the alias conventionally used for it.
IMPORTS = {
    "os": ("import os", "os"),
    "sys": ("import sys", "sys"),
    "torch": ("import torch", "torch"),
    "dist": ("import torch.distributed as dist", "dist"),
    "DDP": ("from torch.nn.parallel import DistributedDataParallel as DDP", "DDP"),
    "DistributedSampler": (
        "from torch.utils.data.distributed import DistributedSampler",
        "DistributedSampler",
    ),
    "contextlib": ("import contextlib", "contextlib"),
    "numpy": ("import numpy as np", "np"),
    "random": ("import random", "random"),
}
QUALIFIED = {
    "os": "os",
    "sys": "sys",
    "torch": "torch",
    "dist": "torch.distributed",
    "DDP": "torch.nn.parallel.DistributedDataParallel",
    "DistributedSampler": "torch.utils.data.distributed.DistributedSampler",
    "contextlib": "contextlib",
    "numpy": "numpy",
    "random": "random",
}


class Context:
    def __init__(self, analysis: Analysis, options: Options) -> None:
        self.a = analysis
        self.opts = options
        self.edits = Edits()
        self.findings: list[Finding] = []
        self.imports_needed: list[str] = []
        self.helpers: set[str] = (
            set()
        )  # generated helper blocks: "amp", "rank0_decides"
        self.plans = Plans()  # what the two-step concerns decided (plans.py)
        self.helper_texts: list[
            str
        ] = []  # generated helper definitions the set-up block ends with
        self.apex_models: list[
            tuple[str, cst.BaseStatement, cst.BaseStatement]
        ] = []  # --amp apex: (name, bind, anchor)
        self.preamble: list[
            cst.BaseStatement
        ] = []  # statements emitted before the set-up block
        self.setup_extra: list[
            cst.BaseStatement
        ] = []  # module-level helpers emitted after the set-up block
        self.legacy = (
            False  # the legacy planners run (the script keeps its own process group)
        )
        self.apex_kept: dict[
            str, str
        ] = {}  # apex name kept with torch.amp -> why (no torch equivalent)
        self.barrier_stmts: list[
            cst.CSTNode
        ] = []  # statements a barrier was added around (need the process group)
        self.after_setup: list[
            cst.BaseStatement
        ] = []  # statements to run right after ddp_setup()
        self.setup_before: list[
            cst.CSTNode
        ] = []  # module-level statements the set-up must precede
        self._alias = self._resolve_aliases()
        self.effects = Effects(
            analysis, options.writers
        )  # which calls write / read files
        # a script that never names a device stays a CPU program (gloo, no device_ids, no AMP);
        # apex needs CUDA, so --amp apex keeps the GPU set-up (and DDP035 where the model stays)
        self.cpu_only = (
            options.amp != "apex" and devices.device_handling(analysis) is None
        )
        self.path = (
            "<stdin>"  # the script's path: --optimize reads model classes beside it
        )
        self._console = (
            options.console
        )  # (region, function) console scripts start; see console()
        self.model_code: dict[
            str, object
        ] = {}  # --optimize: model name -> its class code (or why none)

    def barrier(self, node: cst.CSTNode, why: str) -> str:
        """`dist.barrier()  # why`; in a module of the project other than the entry, only where
        there is a process group: the repository's other scripts (an inference script calling
        the model's load()) import that module too and run it as a plain process."""
        dist = self.name("dist")
        if self.a.region_of(node) == 0:
            return f"{dist}.barrier()  # {why}\n"
        return (
            f"if {dist}.is_initialized():  # other scripts run this without a group\n"
            f"    {dist}.barrier()  # {why}\n"
        )

    def console(self) -> list[cst.FunctionDef]:
        """The module-level functions of the program that the project's console scripts start
        (they run without any `if __name__ == "__main__":` block)."""
        from ddpify.analysis.entries import console_functions

        targets = (
            self._console
            if self._console is not None
            else tuple((0, f) for f in console_functions(self.path))
        )
        # functions a decorator runs when the entry file runs (sacred's @ex.automain)
        targets += tuple((0, f) for f in self._run_by_decorator())
        out = []
        for region, name in targets:
            for s in self.a.module.body:
                if (
                    isinstance(s, cst.FunctionDef)
                    and s.name.value == name
                    and self.a.region_of(s) == region
                ):
                    out.append(s)
        return out

    def _run_by_decorator(self) -> list[str]:
        import ast

        from ddpify.analysis.entries import run_by_decorator

        if "automain" not in self.a.pos.source:
            return []
        try:
            tree = ast.parse(self.a.pos.source)
        except (SyntaxError, ValueError, RecursionError):
            return []
        # the entry's own statements: a merged project's modules are not run as scripts
        entry = [
            s for s, c in zip(tree.body, self.a.module.body) if self.a.region_of(c) == 0
        ]
        return run_by_decorator(entry)

    # -- names ------------------------------------------------------------------------
    def _resolve_aliases(self) -> dict[str, str]:
        """Reuse the script's own import of a name; fall back to the full path on a clash."""
        out: dict[str, str] = {}
        bound: dict[str, set[str]] = {}
        # project mode: only what the entry file binds; an import in another of the project's
        # files (`from torch.nn.parallel import DistributedDataParallel` in a helper module) is
        # not a name the entry can use
        entry = None
        if self.a.several_files():
            entry = set().union(
                *(binds(s) for s in self.a.module.body if self.a.region_of(s) == 0)
            )
        for name, whats in self.a.bindings.get(None, {}).items():
            if entry is None or name in entry:
                bound[name] = set(whats)
        self._bound = bound
        # a function's own `dist = ...` (a distance) would hide `dist` where ddpify adds dist.barrier()
        local = {
            n
            for scope, names in self.a.bindings.items()
            if scope is not None
            for n in names
        }
        for key, (_stmt, alias) in IMPORTS.items():
            full = QUALIFIED[key]
            existing = [
                n
                for n, fulls in bound.items()
                if full in fulls
                or (
                    key == "DistributedSampler"
                    and "torch.utils.data.DistributedSampler" in fulls
                )
            ]
            if existing and not (
                existing[0] in local and key not in ("os", "sys", "torch", "contextlib")
            ):
                out[key] = existing[0]
            elif alias in bound or (
                alias in local and key not in ("os", "sys", "torch", "contextlib")
            ):
                out[key] = (
                    full if key not in ("os", "sys", "torch", "contextlib") else alias
                )
            else:
                out[key] = alias
        return out

    def name(self, key: str) -> str:
        """The expression that names `key` in this module, importing it if needed."""
        alias = self._alias[key]
        if alias in self._bound and alias == IMPORTS[key][1]:
            return alias
        if alias == QUALIFIED[key] and alias != IMPORTS[key][1]:
            self.require("torch")
            return alias
        self.require(key)
        return alias

    def require(self, key: str) -> None:
        if key not in self.imports_needed:
            self.imports_needed.append(key)

    # -- building code ----------------------------------------------------------------
    # Parsed once per text (a parse costs ~0.2 ms, the same few snippets recur in every file);
    # each caller gets a node of its own, as edits and lists of statements go by identity.
    _snippets: dict[tuple[str, str], cst.CSTNode] = {}

    @staticmethod
    def stmt(text: str) -> cst.BaseStatement:
        return Context._snippet("s", text, cst.parse_statement)  # type: ignore[return-value]

    @staticmethod
    def expr(text: str) -> cst.BaseExpression:
        return Context._snippet("e", text, cst.parse_expression)  # type: ignore[return-value]

    @staticmethod
    def _snippet(kind: str, text: str, parse) -> cst.CSTNode:
        cache = Context._snippets
        node = cache.get((kind, text))
        if node is None:
            if (
                len(cache) >= 4096
            ):  # texts that name the script's variables differ per file
                cache.clear()
            node = cache[(kind, text)] = parse(text)
        return node.with_changes()

    def finding(
        self,
        node: cst.CSTNode | None,
        code: str,
        message: str,
        fixed: bool = False,
        severity: str = "",
    ) -> None:
        """severity "" takes the code's default (findings.BLOCKING)."""
        line, col = self.a.line_col(node) if node is not None else (1, 1)
        self.findings.append(Finding(line, col, code, message, fixed, severity))

    def say(self, said: Said) -> None:
        """A finding made by its rule (`DDP030.at(node, ...)`)."""
        self.finding(said.node, said.code, said.message, said.fixed, said.severity)  # type: ignore[arg-type]

    def editable_header(self, compound: cst.CSTNode) -> bool:
        """For an edit at the top of a loop's body: only the header line and the first body
        statement count, not a skipped line deeper inside the loop."""
        skipped = self.a._skipped_lines
        if not skipped:
            return True
        lines = {self.a.pos.start(compound).line}
        body = getattr(getattr(compound, "body", None), "body", ())
        if body:
            lines.add(self.a.pos.start(body[0]).line)
        return not (lines & skipped)

    def skipped_here(
        self, node: cst.CSTNode, what: str, blocking: bool = False
    ) -> None:
        """Say what `# ddpify: skip`/`off` kept ddpify from doing at node (DDP098)."""
        self.finding(
            node,
            "DDP098",
            f"not done because of `# ddpify: skip`/`off`: {what}",
            False,
            "blocking" if blocking else "note",
        )

    def editable(self, node: cst.CSTNode) -> bool:
        """False where the user asked ddpify to keep out (# ddpify: skip / off)."""
        return not self.a.skipped(node)


def append_kwarg(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """call(..., name=value), keeping the call's layout: the separator its arguments already
    use, a trailing comma if it had one, and the closing parenthesis where it was."""
    args = list(call.args)
    new = cst.Arg(
        keyword=cst.Name(name),
        value=value,
        equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""),
            whitespace_after=cst.SimpleWhitespace(""),
        ),
    )
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    # How this call separates its arguments: one per line, or ", " on one line.
    prev = args[-2].comma if len(args) > 1 else None
    if isinstance(prev, cst.Comma):
        sep = prev.whitespace_after
    elif isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        sep = call.whitespace_before_args
    else:
        sep = cst.SimpleWhitespace(" ")
    if isinstance(last.comma, cst.Comma):
        # f(a,\n) keeps its trailing comma and the ")" on its own line.
        new = new.with_changes(comma=last.comma)
        args[-1] = last.with_changes(
            comma=last.comma.with_changes(whitespace_after=sep)
        )
    else:
        # The whitespace before ")" belongs to the last argument: it moves to the new one.
        new = new.with_changes(whitespace_after_arg=last.whitespace_after_arg)
        args[-1] = last.with_changes(
            comma=cst.Comma(
                whitespace_after=sep
                if isinstance(prev, cst.Comma)
                else cst.SimpleWhitespace(" ")
            ),
            whitespace_after_arg=cst.SimpleWhitespace(""),
        )
    args.append(new)
    return call.with_changes(args=args)


class Transform:
    """One concern. plan() reads ctx.a and records edits and findings in ctx."""

    name = "transform"

    def plan(self, ctx: Context) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class PipelineOrderError(RuntimeError):
    """A concern reads a plan that no concern before it in the pipeline makes."""


class Concern(Transform):
    """A concern in two steps. decide() is a function of the analysis, the options and the plans
    named in `reads`, and returns the plan kept as `ctx.plans.<makes>`; emit() turns it into
    edits and findings. The pipeline runs every decide() first, in its order, then every
    concern's emit() or plan() in the same order, so an emit may read any plan."""

    makes = ""  # the field of Plans its decide() fills
    reads: tuple[str, ...] = ()  # the plans its decide() reads

    def decide(self, ctx: Context) -> object:  # pragma: no cover - interface
        raise NotImplementedError

    def emit(self, ctx: Context, plan: object) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def run_decide(self, ctx: Context) -> None:
        missing = [r for r in self.reads if getattr(ctx.plans, r) is None]
        if missing:
            raise PipelineOrderError(
                f"{type(self).__name__} reads plans.{', plans.'.join(missing)}, which no "
                "concern before it in the pipeline made"
            )
        setattr(ctx.plans, self.makes, self.decide(ctx))

    def plan(self, ctx: Context) -> None:
        self.emit(ctx, getattr(ctx.plans, self.makes))
