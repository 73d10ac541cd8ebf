"""one writer: every effect outside the process happens on global rank 0 or at a per-rank path.
A write is what code does: open() in a mode that writes, a known writer (the table of
analysis/writes.py), a file handler, a directory made without exist_ok, or any call into an
imported library that is handed a path and whose value is dropped (analysis/effect_kinds.py).
Each must run under a test that holds on rank 0 alone (or in a function only such code calls),
or write to os.devnull or a path with the rank in it elsewhere. stdout is not a file here: the
output's set-up sends other ranks' stdout to os.devnull when the script runs."""

from __future__ import annotations

import ast

from ddpify.analysis import effect_kinds
from ddpify.analysis.writes import (
    FILE_HANDLERS,
    FILE_OPENERS,
    WRITE_METHODS,
    WRITE_MODE,
    WRITERS,
)
from ddpify.gate.common import Violation, mentions, on_rank0, rank_names
from ddpify.gate.program import Program
from ddpify.rules import declare

declare(
    "DDP152",
    "invariant-one-writer",
    "the output would write a file (or another effect outside the process) on "
    "every rank: not converted",
    severity="blocking",
    tool="gate",
)

GENERATED = {"ddp_setup", "rank0_seed", "rank0_value", "rank0_decides", "rank_batches"}


def looks_like_path(p: Program, node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return effect_kinds.pathish_literal(node.value)
    if isinstance(node, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.Constant) else "x" for v in node.values]
        return effect_kinds.pathish_literal("".join(str(x) for x in parts))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return True
    if isinstance(node, ast.Call):
        name = p.call_name(node) or p.last(node)
        return (
            name.endswith(("path.join", "Path", "joinpath", "with_suffix", "with_name"))
            or p.last(node) == "format"
        )
    name = p.unparse(node) if isinstance(node, (ast.Name, ast.Attribute)) else ""
    return bool(name) and effect_kinds.pathish_name(name)


def _arg(call: ast.Call, where) -> ast.AST | None:
    if where is None:
        return None
    i, kw = where
    for k in call.keywords:
        if k.arg == kw:
            return k.value
    return call.args[i] if len(call.args) > i else None


def _mode(call: ast.Call, i: int) -> str | None:
    node = _arg(call, (i, "mode"))
    if node is None:
        return "r"
    return (
        node.value
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        else None
    )


def write_of(p: Program, call: ast.Call) -> tuple[str, ast.AST | None] | None:
    """(what it is, the path it writes where known) for a call that writes; None otherwise."""
    name = p.call_name(call)
    f = call.func
    if isinstance(f, ast.Name) and f.id == "open" or name in ("io.open", "codecs.open"):
        mode = _mode(call, 1)
        return (
            ("open", call.args[0] if call.args else None)
            if mode and WRITE_MODE.search(mode)
            else None
        )
    if (
        isinstance(f, ast.Attribute)
        and f.attr == "open"
        and not (isinstance(f.value, ast.Name) and p.is_import(f.value))
    ):
        mode = _mode(call, 0)
        return (
            ("open", f.value)
            if mode and WRITE_MODE.search(mode) and looks_like_path(p, f.value)
            else None
        )
    if name in WRITERS:
        target = _arg(call, WRITERS[name])
        if target is not None and any(
            isinstance(o.node, ast.Call)
            and p.call_name(o.node) in ("io.BytesIO", "io.StringIO")
            for o in p.origins(target)
        ):
            return None  # into memory: every rank needs its own bytes
        return name, target
    if name in FILE_HANDLERS:
        target = _arg(call, FILE_HANDLERS[name])
        return (name, target) if target is not None else None
    if name in FILE_OPENERS:
        path, mode = FILE_OPENERS[name]
        m = _arg(call, mode)
        if (
            isinstance(m, ast.Constant)
            and isinstance(m.value, str)
            and WRITE_MODE.search(m.value)
        ):
            return name, _arg(call, path)
        return None
    if name in ("os.makedirs", "os.mkdir"):
        ok = any(
            k.arg == "exist_ok"
            and isinstance(k.value, ast.Constant)
            and k.value.value is True
            for k in call.keywords
        )
        return None if ok else (name, call.args[0] if call.args else None)
    if isinstance(f, ast.Attribute) and f.attr in WRITE_METHODS:
        where = WRITE_METHODS[f.attr]
        if where == "self":
            return (
                (f.attr, f.value)
                if looks_like_path(p, f.value) or isinstance(f.value, ast.Call)
                else None
            )
        target = _arg(call, where)  # type: ignore[arg-type]
        return (
            (f.attr, target)
            if target is not None and looks_like_path(p, target)
            else None
        )
    # a library call handed a path whose value is dropped
    root = f
    while isinstance(root, ast.Attribute):
        root = root.value
    # a module of the project is code the gate reads: its own writes are checked where they are
    imported = (
        isinstance(root, ast.Name)
        and p.is_import(root)
        and root is not f
        and not name.startswith("__ddpify_import_")
    )
    kept = not isinstance(p.parent.get(call), ast.Expr)
    path = next(
        (
            a
            for a in list(call.args) + [k.value for k in call.keywords]
            if looks_like_path(p, a)
        ),
        None,
    )
    if effect_kinds.library_effect(name, imported, path is not None, kept):
        return name, path
    return None


def check(p: Program) -> list[Violation]:
    ranks = rank_names(p)
    out: list[Violation] = []
    for call in p.calls:
        what = write_of(p, call)
        if what is None:
            continue
        kind, target = what
        fn = p.function_of(call)
        if fn is not None and fn.name in GENERATED:
            continue
        if target is not None and (
            mentions(target, ranks) or "devnull" in ast.unparse(target)
        ):
            continue  # a path of this rank's own, or os.devnull on the others
        if on_rank0(p, call, ranks):
            continue
        out.append(
            Violation(
                call,
                "DDP152",
                f"one writer: `{ast.unparse(call.func)}(...)` ({kind}) would run on every "
                "rank, each writing the same file",
            )
        )
    return out
