"""Python's own syntax tree of a text, made once for the readers of the same text: the
invariant gate and the layout of the output both read the converted program with `ast`."""

from __future__ import annotations

import ast

_LAST: list[tuple[str, ast.Module]] = []


def parse(text: str) -> ast.Module:
    """ast.parse(text), the same tree for the same text (read it, never change it)."""
    for known, tree in _LAST:
        if known is text or known == text:
            return tree
    tree = ast.parse(text)
    _LAST.insert(0, (text, tree))
    del _LAST[2:]
    return tree
