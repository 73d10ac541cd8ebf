"""Lint one file, or an entry script and the local modules it imports (project mode): parse once,
analyse once (the converter's Analysis), run every rule of ddpify/lint/rules/ over it, keep what
`# ddpify: ignore[CODE]` and [tool.ddpify] ignore do not suppress."""

from __future__ import annotations

import gc
import os
import stat
from dataclasses import dataclass, field

import libcst as cst

from ddpify.analysis import Analysis
from ddpify.analysis.writes import Effects
from ddpify.directives import ignored_codes
from ddpify.findings import Finding
from ddpify.lint.facts import Facts
from ddpify.options import Options
from ddpify.result import ConversionError

# A file that names none of these is not distributed: no analysis needed to say so.
WORDS = (
    "distributed",
    "DistributedDataParallel",
    "DDP",
    "local_rank",
    "local-rank",
    "LOCAL_RANK",
    "RANK",
    "spawn",
    "accelerate",
    "deepspeed",
    "horovod",
    "lightning",
    "fsdp",
    "FSDP",
    "torchrun",
)


@dataclass
class LintResult:
    path: str
    status: str  # "checked" | "not-distributed" | "empty"
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.blocking]


class Context:
    """What every rule gets: the analysis, lint's facts, the options; `report` records a finding."""

    def __init__(self, a: Analysis, text: str, options: Options) -> None:
        self.a = a
        self.text = text
        self.options = options
        self.effects = Effects(a, options.writers)
        self.facts = Facts(a, text, self.effects)
        self.findings: list[Finding] = []
        self._seen: set[tuple[int, int, str]] = set()

    def report(
        self, node: cst.CSTNode | None, code: str, message: str, severity: str = ""
    ) -> None:
        line, col = self.a.line_col(node) if node is not None else (1, 1)
        if (line, col, code) in self._seen:
            return
        if node is not None and self.a.skipped(node):
            return  # `# ddpify: skip` / off ... on
        self._seen.add((line, col, code))
        self.findings.append(Finding(line, col, code, message, False, severity))


def parse(text: str) -> cst.Module:
    try:
        return cst.parse_module(text)
    except cst.ParserSyntaxError as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else "syntax error"
        raise ConversionError(
            f"cannot parse: {msg}", e.raw_line, e.raw_column + 1
        ) from None
    except RecursionError:
        raise ConversionError("cannot parse: nesting too deep") from None


def run_rules(a: Analysis, text: str, options: Options) -> tuple[str, list[Finding]]:
    from ddpify.lint.rules import RULES

    ctx = Context(a, text, options)
    if not ctx.facts.distributed:
        return "not-distributed", []
    for rule in RULES:
        rule.check(ctx)
    return "checked", sorted(ctx.findings)


def _kept(findings: list[Finding], text: str, options: Options) -> list[Finding]:
    marks = ignored_codes(text)
    out = []
    for f in findings:
        if f.code in options.ignore:
            continue
        codes = marks.get(f.line, frozenset())
        if codes is None or f.code in codes:
            continue
        out.append(f)
    return out


def lint_source(
    text: str, options: Options | None = None, path: str = "<stdin>"
) -> LintResult:
    """Lint one script. Raises ConversionError (with line and column) when it does not parse."""
    options = options or Options()
    text = text.removeprefix("\ufeff")  # a byte-order mark, which Python skips too
    if not text.strip():
        return LintResult(path, "empty")
    if not any(w in text for w in WORDS):
        parse(text)  # a syntax error is still an error
        return LintResult(path, "not-distributed")
    enabled = gc.isenabled()
    gc.disable()  # see pipeline.convert_source: the trees are freed by reference counting
    try:
        module = parse(text)
        status, findings = run_rules(Analysis(module, text), text, options)
    finally:
        if enabled:
            gc.enable()
    return LintResult(path, status, _kept(findings, text, options))


# A script inside a large package (timm's train.py imports timm, hundreds of modules): lint the
# entry with the modules it imports itself, not the whole package, so one file costs seconds.
MAX_PROJECT_FILES = 24
MAX_PROJECT_CHARS = 400_000


def _within_budget(files: list) -> list:
    if (
        len(files) <= MAX_PROJECT_FILES
        and sum(len(f.text) for f in files) <= MAX_PROJECT_CHARS
    ):
        return files
    entry, direct = files[0], set(files[0].deps)
    kept, size = [entry], len(entry.text)
    for f in files[1:]:
        if (
            os.path.realpath(f.path) in {os.path.realpath(d) for d in direct}
            and len(kept) < MAX_PROJECT_FILES
            and size + len(f.text) <= MAX_PROJECT_CHARS
        ):
            kept.append(f)
            size += len(f.text)
    return [entry] + [f for f in files[1:] if f in kept]


def lint_project(
    entry: str, options: Options | None = None, read=None
) -> list[LintResult]:
    """Lint an entry script and the local modules it imports as one program (the training loop
    may live in a trainer module, the wrap in the entry): the files are merged as for a
    conversion (ddpify/merge.py) and each finding goes back to its file and line."""
    from ddpify.analysis.project import local_modules
    from ddpify.merge import merge, where

    options = options or Options()
    if read is None:

        def read(p: str) -> str:
            if not stat.S_ISREG(os.stat(p).st_mode):  # a FIFO would block the open
                raise OSError(f"{p}: not a regular file")
            # utf-8-sig: a file that starts with a byte-order mark reads as Python reads it
            with open(p, encoding="utf-8-sig") as f:
                return f.read()

    _, files = local_modules(entry, read)
    files = _within_budget(files)
    merged = merge(files)
    per_file: list[list[Finding]] = [[] for _ in files]
    status = "not-distributed"
    text = merged.text.replace("\ufeff", "")  # byte-order marks at the files' starts
    if any(w in text for w in WORDS):
        enabled = gc.isenabled()
        gc.disable()
        try:
            module = parse(text)
            status, findings = run_rules(Analysis(module, text), text, options)
        finally:
            if enabled:
                gc.enable()
        for f in findings:
            index, line = where(merged, f.line)
            per_file[index].append(
                Finding(line, f.col, f.code, f.message, f.fixed, f.severity)
            )
    return [
        LintResult(
            os.path.realpath(mod.path) if k else entry,
            status,
            sorted(set(_kept(fs, mod.text, options))),
        )
        for k, (mod, fs) in enumerate(zip(files, per_file))
    ]
