"""The conversion's output laid out as black and ruff lay it out, so that a repository they
format gets no churn (and no E501) from it: `fit_lines(before, after, limit)`.

- Line length: each statement the conversion wrote or changed (a physical line of it absent from
  the input) that is too long is rewrapped as black's right-hand split does it: at the last
  bracket pair, the arguments on one indented line, or one a line with a trailing comma when
  they do not fit; an assigned or returned value with operators in parentheses; a magic
  trailing comma kept exploded. Where black and ruff differ, ruff's layout is written (a long
  tuple value is parenthesised, one `with` item too). In a file black formats (each statement
  the input splits is split as black splits it), an edited statement is laid out anew, joined
  where it now fits; in any other file the script's own layout is kept. New comment lines are
  wrapped at words.
- Blank lines: two after a top-level def or class the conversion added (E305); no whitespace on
  an empty line it wrote.

Statements with comments inside, backslashes or multi-line strings stay as they are, and so
does every line the input had. A rewrap that would change the syntax tree is dropped.

`line_length_for(path)`: `line-length` of [tool.ruff] (or ruff.toml), else of [tool.black], from
the nearest pyproject.toml (or ruff.toml) that sets one; 88 by default, as black and ruff.
"""

from __future__ import annotations

import ast
import io
import os
import tokenize
from functools import lru_cache

from ddpify.config import read_toml
from ddpify.parsed import parse
from ddpify.formatting.leaves import DEFAULT, INDENT, _SKIP, _statement, _width
from ddpify.formatting.splits import _transform

__all__ = ["DEFAULT", "fit_lines", "line_length_for"]


def _logical_lines(text: str, lines: list[str], strings: set[int] | None = None):
    """(first row, last row, tokens) per statement, and (row, None, comment) per comment line;
    nothing from a `# fmt: off` ... `# fmt: on` region. `strings` gets the rows inside a
    multi-line string (after its first): their whitespace is the string's."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return
    stmt: list[tokenize.TokenInfo] = []
    fmt_off = False
    for tok in tokens:
        if (
            strings is not None
            and tok.start[0] != tok.end[0]
            and tok.type not in (tokenize.NL, tokenize.NEWLINE)
        ):
            strings.update(range(tok.start[0] + 1, tok.end[0] + 1))
        if tok.type in _SKIP and not stmt or tok.type == tokenize.ENDMARKER:
            continue
        if tok.type == tokenize.COMMENT and not stmt:
            fmt_off = {"# fmt: off": True, "# fmt: on": False}.get(
                tok.string.strip(), fmt_off
            )
            if not fmt_off and lines[tok.start[0] - 1].strip() == tok.string:
                yield tok.start[0], None, tok.string
            continue
        if tok.type != tokenize.NEWLINE:
            stmt.append(tok)
            continue
        stmt, found = [], stmt
        if not fmt_off:
            yield (
                found[0].start[0],
                tok.start[0],
                [t for t in found if t.type not in _SKIP],
            )


def _render(
    rows: list[str], tokens, lines: list[str], limit: int, unit: str | None = None
) -> list[str] | None:
    line = _statement(tokens, lines)
    if line is None:
        return None
    line.base = rows[0][: len(rows[0]) - len(rows[0].lstrip())]
    line.unit = _unit(lines) if unit is None else unit
    return [part.text() for part in _transform(line, limit)]


# What one file's statements teach the next: the generated set-up and much of a script's code
# recur from file to file in a run over many files, so a top-level statement's tokens and a
# statement's new layout are kept by their text.
_TOKENS: dict[str, list] = {}
_LAYOUTS: dict[tuple, list[str] | None] = {}


def _kept(cache: dict, key, make):
    got = cache.get(key, cache)
    if got is cache:
        if len(cache) >= 4096:
            cache.clear()
        got = cache[key] = make()
    return got


def _top_level(text: str, lines: list[str]) -> list[tuple[int, int, bool]] | None:
    """(first row, last row, has a logical line over several rows) of each top-level statement,
    with the comment and blank rows before it, and of the rows after the last one: a statement
    at the top level starts where the tokenizer holds nothing open. None where the text must be
    read whole (`# fmt: off`, a lone carriage return, a text ast does not parse)."""
    if "fmt:" in text or "\r" in text:
        return None
    try:
        tree = parse(text)  # the gate's tree of the same output
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    out, start = [], 1
    for stmt in tree.body:
        end = stmt.end_lineno or stmt.lineno
        if end >= start:
            out.append((start, end, _spans_rows(stmt)))
            start = end + 1
    if start <= len(lines):
        out.append((start, len(lines), False))
    return out


def _spans_rows(stmt: ast.stmt) -> bool:
    """A logical line of stmt may cover more than one row (never False where one does)."""
    work = [stmt]
    while work:
        s = work.pop()
        if isinstance(s, ast.Match):
            return True
        body = getattr(s, "body", None)
        if not isinstance(body, list):  # a simple statement
            if (s.end_lineno or s.lineno) > s.lineno:
                return True
            continue
        if body and body[0].lineno > s.lineno + 1:
            return True  # a header over several rows (or a comment under it)
        if any(
            (d.end_lineno or d.lineno) > d.lineno
            for d in getattr(s, "decorator_list", ())
        ):
            return True
        work += body
        for field in ("orelse", "finalbody"):
            work += getattr(s, field, [])
        for h in getattr(s, "handlers", []):
            if h.body and h.body[0].lineno > h.lineno + 1:
                return True
            work += h.body
    return False


def _chunk_lines(text: str, lines: list[str], wanted, strings: set[int] | None = None):
    """_logical_lines over the top-level statements `wanted(first, last, spans)` asks for, each
    tokenized alone (and once per text): (first row, last row, tokens, the rows the tokens'
    positions count from, the row before them)."""
    chunks = _top_level(text, lines)
    if chunks is None:
        for first, last, tokens in _logical_lines(text, lines, strings):
            yield first, last, tokens, lines, 0
        return
    for first, last, spans in chunks:
        if not wanted(first, last, spans):
            continue
        rows = lines[first - 1 : last]
        body = "\n".join(rows) + "\n"
        found = _kept(_TOKENS, body, lambda: _read_chunk(body, rows))
        off = first - 1
        for a, b, tokens, inside in found:
            if strings is not None:
                strings.update(r + off for r in inside)
            yield a + off, None if b is None else b + off, tokens, rows, off


def _read_chunk(body: str, rows: list[str]) -> list:
    out = []
    for a, b, tokens in _logical_lines(body, rows, inside := set()):
        out.append((a, b, tokens, set()))
    if out:
        out[0] = (*out[0][:3], inside)  # a chunk's string rows, told once
    return out


def _unit(lines: list[str]) -> str:
    """The file's indentation step: a tab where it indents with tabs (any row that starts with
    one: the first indented row may be a continuation line that ddpify generated)."""
    return "\t" if any(row[:1] == "\t" for row in lines) else INDENT


def _black_style(text: str, limit: int) -> bool:
    """Whether every statement the input splits over lines (or leaves too long) is laid out as
    black lays it out: then an edited statement is laid out anew, joined where it now fits."""
    lines = text.split("\n")
    unit = _unit(lines)

    def wanted(first: int, last: int, spans: bool) -> bool:
        return spans or any(_width(row) > limit for row in lines[first - 1 : last])

    for first, last, tokens, base, off in _chunk_lines(text, lines, wanted):
        if last is None:
            continue
        rows = lines[first - 1 : last]
        if len(rows) > 1 or _width(rows[0]) > limit:
            new = _layout(rows, tokens, base, limit, unit)
            if new is not None and new != rows:
                return False
    return True


def _layout(
    rows: list[str], tokens, base: list[str], limit: int, unit: str
) -> list[str] | None:
    """_render's layout of a statement, once per text."""
    return _kept(
        _LAYOUTS,
        (tuple(rows), limit, unit),
        lambda: _render(rows, tokens, base, limit, unit),
    )


def fit_lines(before: str, after: str, limit: int = DEFAULT) -> str:
    """`after`, its statements not in `before` wrapped as black would where they are too long
    (and, in a file black formats, laid out as black would)."""
    if not limit:
        return after
    known = set(before.split("\n"))
    lines = after.split("\n")
    black: bool | None = None  # found out when first needed
    replaced: dict[
        int, tuple[int, list[str]]
    ] = {}  # first row -> (last row, new lines)
    strings: set[int] = set()
    unit = _unit(lines)

    def changed(first: int, last: int, spans: bool) -> bool:
        # only statements with a row the input does not have are laid out
        return not all(row in known for row in lines[first - 1 : last])

    for first, last, tokens, base, off in _chunk_lines(after, lines, changed, strings):
        if last is None:  # a comment line
            if _too_long(lines[first - 1], known, limit):
                replaced[first] = (first, _wrap_comment(lines[first - 1], limit))
            continue
        rows = lines[first - 1 : last]
        if all(row in known for row in rows):
            continue
        if not any(_width(row) > limit for row in rows):
            if len(rows) == 1:
                continue
            if black is None:
                black = _black_style(before, limit)
            if not black:
                continue  # the script's own layout is kept
        new = _kept(
            _LAYOUTS,
            ("same", tuple(rows), limit, unit),
            lambda: _checked(rows, _layout(rows, tokens, base, limit, unit)),
        )
        if new is not None:
            replaced[first] = (last, new)
    out, row, moved = [], 1, {}
    while row <= len(lines):
        if row in replaced:
            last, new = replaced[row]
            out += new
            row = last + 1
        else:
            out.append(lines[row - 1])
            moved[row] = len(out)
            row += 1
    if any(
        row not in known
        and (
            (row and not row.strip())
            or row.startswith(("def ", "class ", "async def ", "@"))
        )
        for row in out
    ):
        out = _blank_lines(out, known, {moved[r] for r in strings if r in moved})
    return after if out == lines else "\n".join(out)


def _checked(rows: list[str], new: list[str] | None) -> list[str] | None:
    """new where it is a rewrap of rows that keeps the syntax tree, else None."""
    return new if new is not None and new != rows and _same_tree(rows, new) else None


def _same_tree(rows: list[str], new: list[str]) -> bool:
    """A rewrap changes the layout only: the statement's syntax tree stays the same (a wrong
    one is dropped, the statement stays as it was)."""

    def tree(part: list[str]) -> str:
        text = "\n".join(
            [part[0].lstrip(), *part[1:]]
        )  # continuation lines are inside brackets
        try:
            return ast.dump(ast.parse(text))
        except SyntaxError:  # a block's header: give it a body
            return ast.dump(ast.parse(text + "\n pass"))

    try:
        return tree(rows) == tree(new)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def _blank_lines(out: list[str], known: set[str], strings: set[int]) -> list[str]:
    """No whitespace on a new empty line; two blank lines after a top-level def or class the
    conversion wrote, before the next top-level statement (or its comment)."""
    out = [
        "" if not row.strip() and row and row not in known and i not in strings else row
        for i, row in enumerate(out, start=1)
    ]
    result: list[str] = []
    in_new_def = False
    row_no = 0
    for row in out:
        row_no += 1
        starts = row[:1] not in ("", " ", "\t") and row_no not in strings
        if starts and in_new_def and not row.startswith(("@", ")", "]", "}")):
            blank = 0
            while blank < len(result) and result[len(result) - 1 - blank] == "":
                blank += 1
            if blank < 2 and len(result) > blank:
                result += [""] * (2 - blank)
            in_new_def = False
        if starts and row.startswith(("def ", "class ", "async def ", "@")):
            in_new_def = row not in known
        result.append(row)
    return result


def _too_long(row: str, known: set[str], limit: int) -> bool:
    return _width(row) > limit and row not in known


def _wrap_comment(row: str, limit: int) -> list[str]:
    """A comment line the conversion wrote, wrapped at word boundaries."""
    indent = row[: len(row) - len(row.lstrip())]
    words = row.strip()[1:].split()
    out, cur = [], ""
    for word in words:
        if cur and len(indent) + 2 + len(cur) + 1 + len(word) > limit:
            out.append(f"{indent}# {cur}")
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    if cur:
        out.append(f"{indent}# {cur}")
    return out or [row]


# --------------------------------------------------------------------------- the project's length


@lru_cache(maxsize=None)
def _length_in(directory: str) -> int:
    for name, table in (
        ("ruff.toml", ()),
        (".ruff.toml", ()),
        ("pyproject.toml", ("tool", "ruff")),
        ("pyproject.toml", ("tool", "black")),
    ):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        doc = read_toml(path)
        for key in table:
            doc = doc.get(key) if isinstance(doc, dict) else None
        value = (
            doc.get("line-length", doc.get("line_length"))
            if isinstance(doc, dict)
            else None
        )
        if isinstance(value, int) and value > 0:
            return value
    parent = os.path.dirname(directory)
    return DEFAULT if parent == directory else _length_in(parent)


def clear_cache() -> None:
    """Forget the line lengths read (a new command line run may follow edited files)."""
    _length_in.cache_clear()


def line_length_for(path: str | None) -> int:
    """The line length of the project a file (None: the working directory) belongs to."""
    start = os.getcwd() if path is None else os.path.dirname(os.path.abspath(path))
    return _length_in(start)
