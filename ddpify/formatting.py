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
import keyword
import os
import tokenize
from functools import lru_cache

from ddpify.config import read_toml

DEFAULT = 88
INDENT = "    "
OPEN, CLOSE = "([{", ")]}"
# black's delimiter priorities: a line splits at the highest one outside its brackets
COMPREHENSION, COMMA, TERNARY, LOGIC, STRING, COMPARATOR, DOT = 20, 18, 16, 14, 12, 10, 1
MATH = {"|": 9, "^": 8, "&": 7, "<<": 6, ">>": 6, "+": 5, "-": 5, "*": 4, "/": 4, "//": 4, "%": 4, "@": 4, "**": 2}
COMPARATORS = {"<", ">", "==", "!=", "<=", ">="}
AUGMENTED = {"+=", "-=", "*=", "/=", "//=", "%=", "@=", "&=", "|=", "^=", ">>=", "<<=", "**="}
_STRING_START = {getattr(tokenize, n) for n in ("FSTRING_START", "TSTRING_START") if hasattr(tokenize, n)}
_STRING_END = {getattr(tokenize, n) for n in ("FSTRING_END", "TSTRING_END") if hasattr(tokenize, n)}
_SKIP = {tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}


class CannotSplit(Exception):
    pass


class Leaf:
    __slots__ = ("kind", "value", "space", "bracket", "opening", "comment")

    def __init__(self, kind: str, value: str, space: str = "") -> None:
        self.kind = kind  # name | number | string | op
        self.value = value  # "" while an optional parenthesis is invisible
        self.space = space  # whitespace before it, unless it starts a line
        self.bracket = "open" if value and value in OPEN else "close" if value and value in CLOSE else ""
        self.opening: Leaf | None = None  # a closing bracket's opening one
        self.comment = ""  # a trailing comment that follows this leaf


def _operand(leaf: Leaf | None) -> bool:
    """Ends an operand: a bracket after it is a call or subscript, an operator after it binary."""
    return leaf is not None and (leaf.bracket == "close" or leaf.kind in ("string", "number") or (
        leaf.kind == "name" and (not keyword.iskeyword(leaf.value) or leaf.value in ("None", "True", "False"))))


class Line:
    def __init__(self, leaves: list[Leaf], base: str, depth: int = 0, inside: bool = False, unit: str = INDENT) -> None:
        self.leaves = leaves
        self.base = base  # the statement's indentation
        self.depth = depth  # continuation levels below it
        self.inside = inside  # the contents of a bracket pair
        self.explode = False  # black's should_split_rhs: one item a line
        self.unit = unit  # a continuation level: four spaces, or a tab in a tabbed file

    def text(self) -> str:
        # continuation lines indent as the file does: four spaces, or a tab in a tabbed file
        parts = [self.base + self.unit * self.depth]
        for i, leaf in enumerate(self.leaves):
            parts.append(leaf.value if i == 0 else leaf.space + leaf.value)
        parts += ["  " + leaf.comment for leaf in self.leaves if leaf.comment]
        return "".join(parts)

    def fits(self, limit: int) -> bool:
        """ruff leaves pragma comments (# type:, # noqa, ...) out of the width."""
        drop = sum(len(x.comment) + 2 for x in self.leaves if x.comment and _pragma(x.comment))
        return _width(self.text()) - drop <= limit

    def lengths(self):
        """(index, leaf, its length) as black counts them (comments included)."""
        for i, leaf in enumerate(self.leaves):
            yield i, leaf, len(leaf.value if i == 0 else leaf.space + leaf.value) + len(leaf.comment)

    def width(self) -> int:
        return _width(self.base) + len(INDENT) * self.depth

    def magic_comma(self) -> bool:
        """A comma before a closing bracket keeps the pair exploded (not a one-element tuple or subscript)."""
        leaves = self.leaves
        for i, leaf in enumerate(leaves):
            if i and leaf.bracket == "close" and leaf.value and leaves[i - 1].value == "," and leaf.opening in leaves:
                if not _one_sequence(leaves, leaf):
                    return True
        return False

    def delimiters(self) -> dict[int, int]:
        """id(leaf) -> priority of a split right after that leaf, outside the line's brackets."""
        out: dict[int, int] = {}
        depth, extra, seen_for = 0, [], False
        leaves = self.leaves
        for i, leaf in enumerate(leaves):
            prev = leaves[i - 1] if i else None
            ends_extra = bool(extra) and extra[-1][0] == depth and (
                (extra[-1][1] == "for" and leaf.value == "in") or (extra[-1][1] == "lambda" and leaf.value == ":"))
            if ends_extra:
                depth -= 1
                extra.pop()
            if leaf.bracket == "close":
                depth -= 1
            elif leaf.bracket == "open":
                depth += 1
            if depth == 0 and not ends_extra:
                nxt = leaves[i + 1] if i + 1 < len(leaves) else None
                before = _split_before(leaf, prev, nxt, seen_for)
                if before and prev is not None:
                    out[id(prev)] = before
                elif leaf.value == ",":
                    out[id(leaf)] = COMMA
                seen_for = seen_for or (leaf.kind == "name" and leaf.value == "for")
            if leaf.kind == "name" and leaf.value in ("for", "lambda") and not leaf.bracket:
                depth += 1
                extra.append((depth, leaf.value))
        return out


def _width(text: str) -> int:
    return len(text.expandtabs(4)) if "\t" in text else len(text)


def _pragma(comment: str) -> bool:
    body = comment[1:].strip()
    return body.startswith(("type:", "noqa", "pyright:", "pylint:", "nosec", "isort:", "mypy:", "ruff:"))


def _one_sequence(leaves: list[Leaf], closing: Leaf) -> bool:
    """(a,) or x[a,]: one item and its comma, where the comma is not magic. A call's is."""
    start = leaves.index(closing.opening)
    if _top_commas(leaves[start + 1:leaves.index(closing)]) != 1 or closing.value == "}":
        return False
    call = _operand(leaves[start - 1] if start else None)
    return (closing.value == ")" and not call) or (closing.value == "]" and call)


def _top_commas(leaves: list[Leaf]) -> int:
    depth, n = 0, 0
    for leaf in leaves:
        depth += (leaf.bracket == "open") - (leaf.bracket == "close")
        n += depth == 0 and leaf.value == ","
    return n


def _split_before(leaf: Leaf, prev: Leaf | None, nxt: Leaf | None, seen_for: bool) -> int:
    v = leaf.value
    if leaf.kind == "op":
        if v == "." and prev is not None and prev.bracket == "close":
            return DOT
        if v in MATH and _operand(prev):  # not unary, not *args / **kwargs
            return MATH[v]
        return COMPARATOR if v in COMPARATORS else 0
    if leaf.kind == "string":
        return STRING if prev is not None and prev.kind == "string" else 0
    if leaf.kind != "name":
        return 0
    after_not = prev is not None and prev.value == "not"
    return {
        "for": COMPREHENSION, "if": COMPREHENSION if seen_for else TERNARY, "else": TERNARY,
        "is": COMPARATOR, "in": 0 if after_not else COMPARATOR, "and": LOGIC, "or": LOGIC,
        "not": COMPARATOR if nxt is not None and nxt.value == "in" and not (prev is not None and prev.value == "is") else 0,
    }.get(v, 0)


# --------------------------------------------------------------------------- black's splits


def _transform(line: Line, limit: int, force: bool = False) -> list[Line]:
    if not line.explode and not line.magic_comma() and line.fits(limit):
        return [line]
    for split in ((_delimiter_split, _rhs) if line.inside else (_rhs,)):
        try:
            return _run(split, line, limit, force)
        except CannotSplit:
            continue
    return [line]


def _run(split, line: Line, limit: int, force: bool) -> list[Line]:
    text = line.text()
    invisible = [x for x in line.leaves if x.bracket and not x.value]
    result: list[Line] = []
    for part in split(line, limit, force):
        if part.text() == text:
            raise CannotSplit("unchanged")
        result.extend(_transform(part, limit, force))
    if force or split is not _rhs or not invisible or any(x.value for x in invisible) or result[0].fits(limit):
        return result
    # the optional parentheses were left out and the first line is still too long: try with them
    second = _run(split, _clone(line), limit, True)
    return second if all(part.fits(limit) for part in second) else result


def _clone(line: Line) -> Line:
    copies: dict[int, Leaf] = {}
    leaves = []
    for leaf in line.leaves:
        new = Leaf(leaf.kind, leaf.value, leaf.space)
        new.bracket, new.comment = leaf.bracket, leaf.comment
        new.opening = copies.get(id(leaf.opening)) if leaf.opening is not None else None
        copies[id(leaf)] = new
        leaves.append(new)
    return Line(leaves, line.base, line.depth, line.inside, line.unit)


def _delimiter_split(line: Line, limit: int, force: bool) -> list[Line]:
    leaves = line.leaves
    if not leaves:
        raise CannotSplit("empty")
    delims = line.delimiters()
    top = max((p for k, p in delims.items() if k != id(leaves[-1])), default=0)
    if not top or (top == DOT and list(delims.values()).count(DOT) == 1):
        raise CannotSplit("no delimiters")
    out, cur = [], []
    for leaf in leaves:
        cur.append(leaf)
        if delims.get(id(leaf)) == top:
            out.append(Line(cur, line.base, line.depth, line.inside, line.unit))
            cur = []
    if cur:
        if top == COMMA and cur[-1].value != ",":
            cur.append(Leaf("op", ","))
        out.append(Line(cur, line.base, line.depth, line.inside, line.unit))
    return out


def _rhs(line: Line, limit: int, force: bool) -> list[Line]:
    for omit in _trailers_to_omit(line, limit):
        lines = _right_hand_split(line, limit, omit, force)
        if lines[0].fits(limit):
            return lines
    return _right_hand_split(line, limit, frozenset(), force)


def _trailers_to_omit(line: Line, limit: int):
    """Sets of closing brackets to pass over, so the split lands on an earlier trailer."""
    omit: set[int] = set()
    if not line.magic_comma():
        yield frozenset(omit)
    length = line.width()
    opening = closing = None
    inner: set[int] = set()
    leaves = line.leaves
    for index, leaf, size in reversed(list(line.lengths())):
        length += size
        if length > limit or leaf.comment:
            break
        prev = leaves[index - 1] if index else None
        if opening is not None:
            if leaf is opening:
                opening = None
            elif leaf.bracket == "close":
                if prev is not None and prev.value == "," and not _one_sequence(leaves, leaf):
                    break
                inner.add(id(leaf))
        elif leaf.bracket == "close":
            if prev is not None and prev.bracket == "open":
                inner.add(id(leaf))
                continue
            if closing is not None:
                omit.add(id(closing))
                omit |= inner
                inner.clear()
                yield frozenset(omit)
            if prev is not None and prev.value == "," and not _one_sequence(leaves, leaf):
                break
            if leaf.value:
                opening, closing = leaf.opening, leaf


def _first_rhs(line: Line, omit) -> tuple[Line, Line, Line, Leaf, Leaf]:
    head: list[Leaf] = []
    body: list[Leaf] = []
    tail: list[Leaf] = []
    cur = tail
    opening = closing = None
    for leaf in reversed(line.leaves):
        if cur is body and leaf is opening:
            cur = head if body else tail
        cur.append(leaf)
        if cur is tail and leaf.bracket == "close" and id(leaf) not in omit:
            opening, closing, cur = leaf.opening, leaf, body
    if opening is None or closing is None or not head:
        raise CannotSplit("no brackets")
    head.reverse(), body.reverse(), tail.reverse()
    h = Line(head, line.base, line.depth, unit=line.unit)
    b = Line(body, line.base, line.depth + 1, inside=True, unit=line.unit)
    t = Line(tail, line.base, line.depth, unit=line.unit)
    if not body and len(t.text().strip()) < 3:
        raise CannotSplit("empty body")
    if body:
        trailing = body[-1].value == ","
        delims = b.delimiters()
        top = max((p for k, p in delims.items() if not (trailing and k == id(body[-1]))), default=0)
        atom = not opening.value or not _operand(head[-2] if len(head) > 1 else None)
        b.explode = top == COMMA and (trailing or atom)
    return h, b, t, opening, closing


def _right_hand_split(line: Line, limit: int, omit, force: bool) -> list[Line]:
    return _omitting_optional_parens(_first_rhs(line, omit), line, limit, omit, force)


def _omitting_optional_parens(rhs, line: Line, limit: int, omit, force: bool) -> list[Line]:
    head, body, tail, opening, closing = rhs
    if not force and not opening.value and not closing.value and _can_omit(rhs, limit):
        omit = frozenset({id(closing), *omit})
        try:
            oop = _first_rhs(line, omit)
            if _prefer_oop(oop, rhs, limit):
                return _omitting_optional_parens(oop, line, limit, omit, force)
        except CannotSplit:
            if not _can_be_split(body) and not body.fits(limit):
                raise
    if not opening.value and len(body.leaves) == 1:
        # one name or string in parentheses: only where that fits (ruff), the comment inside
        if closing.comment:
            body.leaves[0].comment, closing.comment = closing.comment, ""
        opening.value, closing.value = "(", ")"
        if not all(part.fits(limit) for part in (head, body, tail) if part.leaves):
            opening.value = closing.value = ""
            closing.comment, body.leaves[0].comment = closing.comment or body.leaves[0].comment, ""
            raise CannotSplit("parentheses would not help")
    opening.value, closing.value = opening.value or "(", closing.value or ")"  # black's ensure_visible
    return [part for part in (head, body, tail) if part.leaves]


def _can_omit(rhs, limit: int) -> bool:
    """black's can_omit_invisible_parens, except that a tuple keeps its parentheses (ruff)."""
    head, body, _tail, _o, _c = rhs
    delims = body.delimiters()
    if not delims:
        return True
    top = max(delims.values())
    # ruff parenthesises a tuple, except one that is returned (black: a tuple of two alike)
    returned = top == COMMA and head.leaves[0].value == "return"
    if (top == COMMA and not returned) or list(delims.values()).count(top) > 1:
        return False
    if top == DOT:
        return True
    leaves = body.leaves
    first, second = leaves[0], leaves[1]
    if first.bracket == "open" and second.bracket != "close" and _can_omit_opening(body, first, limit):
        return True
    last = leaves[-1]
    subscript = last.value == "]" and _operand(_before(leaves, last.opening))
    if last.value in (")", "}") or (last.value == "]" and (returned or not subscript)):
        if leaves[-2].bracket == "open":
            return False
        length, seen_other = body.width(), False
        for _i, leaf, size in body.lengths():
            length += size
            if leaf is last.opening:
                if seen_other or length <= limit:
                    return True
            elif leaf.bracket == "open":
                seen_other = True
    return False


def _before(leaves: list[Leaf], leaf: Leaf | None) -> Leaf | None:
    i = leaves.index(leaf) if leaf in leaves else 0
    return leaves[i - 1] if i else None


def _can_omit_opening(line: Line, first: Leaf, limit: int) -> bool:
    remainder, length, index = False, line.width(), -1
    for index, leaf, size in line.lengths():
        if leaf.bracket == "close" and leaf.opening is first:
            remainder = True
        if remainder:
            length += size
            if length > limit:
                return False
            if leaf.bracket == "open":
                remainder = False
    return len(line.leaves) == index + 1


def _prefer_oop(oop, rhs, limit: int) -> bool:
    """black's _prefer_split_rhs_oop_over_rhs: split at the value's own last bracket pair."""
    head = rhs[0].leaves
    if not (len(head) >= 2 and head[-2].value == "="):
        return True
    if not any(x.bracket for x in head[:-1]) or len(rhs[0].text()) > limit - 1 or rhs[0].magic_comma():
        return True
    equals = [x.value for x in head].count("=")
    if equals > 1 and equals > [x.value for x in oop[0].leaves].count("="):
        return False
    for leaf in reversed(oop[0].leaves):
        if leaf.value == "=":
            break
        if leaf.bracket == "close":
            return True
    return any(x.value == "=" for x in oop[0].leaves) and oop[0].fits(limit)


def _can_be_split(line: Line) -> bool:
    leaves = line.leaves
    if len(leaves) < 2:
        return False
    if leaves[0].kind == "string" and leaves[1].value == ".":
        calls = dots = 0
        nxt = leaves[-1]
        for leaf in leaves[-2::-1]:
            if leaf.bracket == "open":
                if nxt.bracket != "close":
                    return False
                calls += 1
            elif leaf.value == ".":
                dots += 1
            elif leaf.kind == "name":
                if not (nxt.value == "." or nxt.bracket == "open"):
                    return False
            elif leaf.bracket != "close":
                return False
            if dots > 1 and calls > 1:
                return False
    return True


# --------------------------------------------------------------------------- statements


def _statement(tokens: list[tokenize.TokenInfo], lines: list[str]) -> Line | None:
    """The leaves of one logical line, or None where it is left as written."""
    leaves: list[Leaf] = []
    stack: list[Leaf] = []
    prev_end = None
    comment = ""
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.type == tokenize.COMMENT:
            if any(t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT) for t in tokens[i + 1:]) or not leaves:
                return None  # a comment inside the statement
            comment = tok.string
            if comment.replace(" ", "").startswith(("#fmt:skip", "#fmt:off")):
                return None
            i += 1
            continue
        end = tok.end
        if tok.type in _STRING_START:  # f-string parts (3.12+): one string
            depth = 0
            for j in range(i, len(tokens)):
                depth += (tokens[j].type in _STRING_START) - (tokens[j].type in _STRING_END)
                if depth == 0:
                    break
            end = tokens[j].end
            if end[0] != tok.start[0]:
                return None
            value = lines[tok.start[0] - 1][tok.start[1]:end[1]]
            kind = "string"
            i = j
        else:
            value = tok.string
            kind = {tokenize.NAME: "name", tokenize.NUMBER: "number", tokenize.STRING: "string"}.get(tok.type, "op")
            if "\n" in value:
                return None  # a multi-line string
        if value == ";" and not stack:
            return None
        if prev_end is None:
            space = ""
        elif prev_end[0] == tok.start[0]:
            space = lines[tok.start[0] - 1][prev_end[1]:tok.start[1]]
        elif not stack:
            return None  # a backslash continuation
        else:
            prev = leaves[-1].value
            space = "" if (prev and prev in OPEN) or value in CLOSE or value in (",", ".") or prev == "." else " "
        leaf = Leaf(kind, value, space)
        if leaf.bracket == "open":
            stack.append(leaf)
        elif leaf.bracket == "close":
            if not stack:
                return None
            leaf.opening = stack.pop()
        leaves.append(leaf)
        prev_end = end
        i += 1
    if not leaves or stack or leaves[0].value in ("def", "class", "@", "import", "from", "async"):
        return None
    line = _with_optional_parens(leaves)
    if line is not None:
        line.leaves[-1].comment = comment  # after the last leaf, optional parenthesis included (ruff)
    return line


def _with_optional_parens(leaves: list[Leaf]) -> Line | None:
    """black's invisible parentheses around a value: after `=` and `return`, in `if`/`while`
    conditions and a `for` loop's iterable; where the value is already in parentheses of its
    own (not a tuple's, nor a generator's), those become the optional ones."""
    first = leaves[0].value
    depth, top = 0, []
    for i, leaf in enumerate(leaves):
        if leaf.bracket == "close":
            depth -= 1
        if depth == 0:
            top.append(i)
        if leaf.bracket == "open":
            depth += 1
    colon_last = leaves[-1].value == ":"
    if first in ("if", "elif", "while", "for", "with", "else", "try", "except", "finally"):
        if not colon_last or any(leaves[i].value == ":" for i in top[:-1] if leaves[i].kind == "op"):
            return None  # a one-line compound statement, or a lambda in the header
        if first in ("if", "elif", "while"):
            return Line(_wrap(leaves, 1, len(leaves) - 1), "")
        if first == "with" and not any(leaves[i].value in (",", "as") for i in top):
            return Line(_wrap(leaves, 1, len(leaves) - 1), "")  # one item: parentheses (ruff)
        if first == "for":
            ins = [i for i in top if leaves[i].value == "in"]
            return Line(_wrap(leaves, ins[0] + 1, len(leaves) - 1), "") if ins else None
        return Line(leaves, "")
    if first in ("return", "del", "yield") and len(leaves) > 1:
        return Line(_wrap(leaves, 1, len(leaves)), "")
    if first == "assert":
        comma = next((i for i in top if leaves[i].value == ","), len(leaves))
        return Line(_wrap(_wrap(leaves, comma + 1, len(leaves)), 1, comma), "")
    lam = next((i for i in top if leaves[i].value == "lambda"), len(leaves))
    equals = [i for i in top if i < lam and (leaves[i].value == "=" or leaves[i].value in AUGMENTED)]
    if equals and equals[-1] + 1 < len(leaves):
        return Line(_wrap(leaves, equals[-1] + 1, len(leaves)), "")
    return Line(leaves, "")


def _wrap(leaves: list[Leaf], start: int, stop: int) -> list[Leaf]:
    if start >= stop:
        return leaves
    first, last = leaves[start], leaves[stop - 1]
    if first.bracket == "open" and last.opening is first and first.value == "(":
        inner = Line(leaves[start + 1:stop - 1], "")
        delims = inner.delimiters()
        if inner.leaves and max(delims.values(), default=0) < COMMA and not any(x.value in ("yield", "await") for x in inner.leaves[:1]):
            first.value = last.value = ""  # redundant: optional again
        return leaves
    lpar, rpar = Leaf("op", "", first.space), Leaf("op", "")
    lpar.bracket, rpar.bracket, rpar.opening = "open", "close", lpar
    first.space = ""
    return [*leaves[:start], lpar, *leaves[start:stop], rpar, *leaves[stop:]]


def _logical_lines(text: str, lines: list[str]):
    """(first row, last row, tokens) per statement, and (row, None, comment) per comment line;
    nothing from a `# fmt: off` ... `# fmt: on` region."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return
    stmt: list[tokenize.TokenInfo] = []
    fmt_off = False
    for tok in tokens:
        if tok.type in _SKIP and not stmt or tok.type == tokenize.ENDMARKER:
            continue
        if tok.type == tokenize.COMMENT and not stmt:
            fmt_off = {"# fmt: off": True, "# fmt: on": False}.get(tok.string.strip(), fmt_off)
            if not fmt_off and lines[tok.start[0] - 1].strip() == tok.string:
                yield tok.start[0], None, tok.string
            continue
        if tok.type != tokenize.NEWLINE:
            stmt.append(tok)
            continue
        stmt, found = [], stmt
        if not fmt_off:
            yield found[0].start[0], tok.start[0], [t for t in found if t.type not in _SKIP]


def _render(rows: list[str], tokens, lines: list[str], limit: int) -> list[str] | None:
    line = _statement(tokens, lines)
    if line is None:
        return None
    line.base = rows[0][:len(rows[0]) - len(rows[0].lstrip())]
    line.unit = _unit(lines)
    return [part.text() for part in _transform(line, limit)]


def _unit(lines: list[str]) -> str:
    """The file's indentation step: a tab where it indents with tabs."""
    for row in lines:
        if row[:1] in (" ", "\t") and row.strip():
            return "\t" if row[0] == "\t" else INDENT
    return INDENT


def _black_style(text: str, limit: int) -> bool:
    """Whether every statement the input splits over lines (or leaves too long) is laid out as
    black lays it out: then an edited statement is laid out anew, joined where it now fits."""
    lines = text.split("\n")
    for first, last, tokens in _logical_lines(text, lines):
        if last is None:
            continue
        rows = lines[first - 1:last]
        if len(rows) > 1 or _width(rows[0]) > limit:
            new = _render(rows, tokens, lines, limit)
            if new is not None and new != rows:
                return False
    return True


def fit_lines(before: str, after: str, limit: int = DEFAULT) -> str:
    """`after`, its statements not in `before` wrapped as black would where they are too long
    (and, in a file black formats, laid out as black would)."""
    if not limit:
        return after
    known = set(before.split("\n"))
    lines = after.split("\n")
    black: bool | None = None  # found out when first needed
    replaced: dict[int, tuple[int, list[str]]] = {}  # first row -> (last row, new lines)
    for first, last, tokens in _logical_lines(after, lines):
        if last is None:  # a comment line
            if _too_long(lines[first - 1], known, limit):
                replaced[first] = (first, _wrap_comment(lines[first - 1], limit))
            continue
        rows = lines[first - 1:last]
        if all(row in known for row in rows):
            continue
        if not any(_width(row) > limit for row in rows):
            if len(rows) == 1:
                continue
            if black is None:
                black = _black_style(before, limit)
            if not black:
                continue  # the script's own layout is kept
        new = _render(rows, tokens, lines, limit)
        if new is not None and new != rows:
            replaced[first] = (last, new)
    out, row = [], 1
    while row <= len(lines):
        if row in replaced:
            last, new = replaced[row]
            out += new
            row = last + 1
        else:
            out.append(lines[row - 1])
            row += 1
    if any(row not in known and ((row and not row.strip()) or row.startswith(("def ", "class ", "async def ", "@"))) for row in out):
        out = _blank_lines(out, known, _string_rows("\n".join(out)))
    if out == lines:
        return after
    text = "\n".join(out)
    try:
        same = ast.dump(ast.parse(text)) == ast.dump(ast.parse(after))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        same = False
    return text if same else after


def _string_rows(text: str) -> set[int]:
    """Rows inside a multi-line string (after its first): their whitespace is the string's."""
    rows: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.start[0] != tok.end[0] and tok.type != tokenize.NL:
                rows.update(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        pass
    return rows


def _blank_lines(out: list[str], known: set[str], strings: set[int]) -> list[str]:
    """No whitespace on a new empty line; two blank lines after a top-level def or class the
    conversion wrote, before the next top-level statement (or its comment)."""
    out = ["" if not row.strip() and row and row not in known and i not in strings else row
           for i, row in enumerate(out, start=1)]
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
    indent = row[:len(row) - len(row.lstrip())]
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
    for name, table in (("ruff.toml", ()), (".ruff.toml", ()), ("pyproject.toml", ("tool", "ruff")), ("pyproject.toml", ("tool", "black"))):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        doc = read_toml(path)
        for key in table:
            doc = doc.get(key) if isinstance(doc, dict) else None
        value = doc.get("line-length", doc.get("line_length")) if isinstance(doc, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    parent = os.path.dirname(directory)
    return DEFAULT if parent == directory else _length_in(parent)


def line_length_for(path: str | None) -> int:
    """The line length of the project a file (None: the working directory) belongs to."""
    start = os.getcwd() if path is None else os.path.dirname(os.path.abspath(path))
    return _length_in(start)
