"""`--partial` drafts cannot run wrong: where a blocking finding remains, the draft raises at that
site, with the finding's message, before the statement it concerns. An engineer finishes the
last part by hand (and deletes the raise); meanwhile no run trains unsynchronised copies or writes
from every rank without saying so."""

from __future__ import annotations

import ast
import difflib

from ddpify.findings import Finding

MARK = "# ddpify --partial: unresolved"


def mark_unresolved(source: str, output: str, blocking: list[Finding]) -> str:
    """output with `raise RuntimeError(...)` before the statement of each blocking finding (at
    the output's line for the finding's line of source)."""
    if not blocking:
        return output
    try:
        tree = ast.parse(output)
    except SyntaxError:
        return output
    lines = output.splitlines(keepends=True)
    forward = _forward_map(source, output)
    inserts: dict[int, list[str]] = {}
    for f in sorted(set(blocking)):
        line = forward.get(f.line) or _nearest(forward, f.line)
        stmt = _statement_at(tree, lines, line)
        if stmt is None:
            continue
        indent = lines[stmt.lineno - 1][: stmt.col_offset]
        message = f"ddpify --partial: {f.code} at line {f.line} of the original is not converted: {f.message}"
        text = (
            f"{indent}raise RuntimeError(  {MARK} ({f.code})\n"
            f"{indent}    {message!r}\n"
            f"{indent})\n"
        )
        if text not in inserts.get(stmt.lineno, []):
            inserts.setdefault(stmt.lineno, []).append(text)
    out = []
    for k, text in enumerate(lines, start=1):
        out += inserts.get(k, [])
        out.append(text)
    return "".join(out)


def _statement_at(tree: ast.Module, lines: list[str], line: int) -> ast.stmt | None:
    """The innermost statement that holds `line` and starts its own line (so a statement can go
    right before it)."""
    best = None
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt) or not (
            node.lineno <= line <= (node.end_lineno or node.lineno)
        ):
            continue
        if lines[node.lineno - 1][: node.col_offset].strip():
            continue  # `if x: y`: y shares its line
        if (
            best is None
            or node.lineno >= best.lineno
            and (node.end_lineno or 0) <= (best.end_lineno or 0)
        ):
            best = node
    if best is None:
        body = [s for s in tree.body if not isinstance(s, (ast.Import, ast.ImportFrom))]
        best = body[0] if body else None
    return best


def _forward_map(source: str, output: str) -> dict[int, int]:
    """Source line -> output line, for the lines the conversion kept."""
    a, b = source.splitlines(), output.splitlines()
    out: dict[int, int] = {}
    for block in difflib.SequenceMatcher(
        None, a, b, autojunk=False
    ).get_matching_blocks():
        for k in range(block.size):
            out[block.a + k + 1] = block.b + k + 1
    return out


def _nearest(forward: dict[int, int], line: int) -> int:
    before = [k for k in forward if k < line]
    return forward[max(before)] + 1 if before else 1
