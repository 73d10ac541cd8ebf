"""Which lines carry ddpify's comment directives: `# ddpify: skip`, `off` ... `on`, `ignore[...]`.

Only real comments count (found with tokenize): the same words inside a string or a docstring
are text, not a directive. A comment shaped like a directive (`# ddpify: WORD`, nothing after
but `[...]` or another comment) whose word is none of these is reported (DDP009), so that a typo
(`# ddpify: skp`) is not a silent no-op; ddpify's own `# ddpify: ...` comments are sentences.
"""

from __future__ import annotations

import io
import re
import tokenize

from ddpify.findings import Finding
from ddpify.rules import declare

KNOWN = ("skip", "off", "on", "ignore")
# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP009",
    "unknown-directive",
    "a `# ddpify:` comment names no directive ddpify knows (skip, off, on, ignore, ignore[CODES]): it does nothing",
)

SKIP_RE = re.compile(r"#\s*ddpify:\s*skip\b")
OFF_RE = re.compile(r"#\s*ddpify:\s*off\b")
ON_RE = re.compile(r"#\s*ddpify:\s*on\b")
# `# ddpify: ignore` or `# ddpify: ignore[DDP027, DDP034]`
IGNORE_RE = re.compile(r"#\s*ddpify:\s*ignore(?:\[([A-Za-z0-9_,\s]*)\])?")
# one word, then nothing but `[...]` or another comment: a directive, not one of ddpify's sentences
DIRECTIVE_RE = re.compile(
    r"#\s*ddpify:\s*(?P<word>[A-Za-z_][\w-]*)\s*(?:\[[^\]]*\])?\s*(?:#.*)?$"
)


def comments(source: str) -> dict[int, str]:
    """line -> the comment on it, for comments that mention ddpify (1-based lines)."""
    out: dict[int, str] = {}
    if "ddpify" not in source:
        return out
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT and "ddpify" in tok.string:
                out[tok.start[0]] = tok.string
    except (tokenize.TokenError, SyntaxError):
        # source that tokenize rejects (the parser accepted it): fall back to whole lines
        return {
            i: ln for i, ln in enumerate(source.splitlines(), start=1) if "ddpify" in ln
        }
    return out


def skipped_lines(source: str) -> set[int]:
    """Lines ddpify must leave as written: `# ddpify: skip` lines and `off` ... `on` ranges."""
    marks = comments(source)
    if not marks:
        return set()
    skipped: set[int] = set()
    off_from: int | None = None
    for line in sorted(marks):
        text = marks[line]
        if OFF_RE.search(text) and off_from is None:
            off_from = line
        if SKIP_RE.search(text):
            skipped.add(line)
        if ON_RE.search(text) and off_from is not None:
            skipped.update(range(off_from, line + 1))
            off_from = None
    if off_from is not None:  # off to the end of the file
        skipped.update(range(off_from, source.count("\n") + 2))
    return skipped


def ignored_codes(source: str) -> dict[int, frozenset[str] | None]:
    """line -> codes suppressed on it (None: every code)."""
    out: dict[int, frozenset[str] | None] = {}
    for line, text in comments(source).items():
        mo = IGNORE_RE.search(text)
        if mo:
            codes = mo.group(1)
            out[line] = (
                None
                if codes is None
                else frozenset(c.strip().upper() for c in codes.split(",") if c.strip())
            )
    return out


def unknown_directives(source: str) -> list[Finding]:
    """DDP009 for each directive-shaped comment whose word ddpify does not know."""
    out = []
    lines = source.splitlines()
    for line, text in comments(source).items():
        mo = DIRECTIVE_RE.search(text)
        if mo is None or mo.group("word") in KNOWN:
            continue
        col = lines[line - 1].find(text) + 1 if line <= len(lines) else 1
        out.append(
            Finding(
                line,
                max(col, 1),
                "DDP009",
                f"unknown directive `# ddpify: {mo.group('word')}`: it does nothing; "
                "ddpify knows skip, off, on, ignore and ignore[CODES] (`# ddpify: ignore[DDP024]`)",
            )
        )
    return out
