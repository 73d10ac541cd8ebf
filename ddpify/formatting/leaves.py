"""One statement as black sees it: its leaves (tokens, with the whitespace before each and the
optional parentheses black puts around a value), bracket pairs, magic trailing commas, and the
delimiters a line may be split at, by priority. ddpify/formatting/splits.py splits it."""

from __future__ import annotations

import keyword
import tokenize

DEFAULT = 88
INDENT = "    "
OPEN, CLOSE = "([{", ")]}"
# black's delimiter priorities: a line splits at the highest one outside its brackets
COMPREHENSION, COMMA, TERNARY, LOGIC, STRING, COMPARATOR, DOT = (
    20,
    18,
    16,
    14,
    12,
    10,
    1,
)
MATH = {
    "|": 9,
    "^": 8,
    "&": 7,
    "<<": 6,
    ">>": 6,
    "+": 5,
    "-": 5,
    "*": 4,
    "/": 4,
    "//": 4,
    "%": 4,
    "@": 4,
    "**": 2,
}
COMPARATORS = {"<", ">", "==", "!=", "<=", ">="}
AUGMENTED = {
    "+=",
    "-=",
    "*=",
    "/=",
    "//=",
    "%=",
    "@=",
    "&=",
    "|=",
    "^=",
    ">>=",
    "<<=",
    "**=",
}
_STRING_START = {
    getattr(tokenize, n)
    for n in ("FSTRING_START", "TSTRING_START")
    if hasattr(tokenize, n)
}
_STRING_END = {
    getattr(tokenize, n) for n in ("FSTRING_END", "TSTRING_END") if hasattr(tokenize, n)
}
_SKIP = {tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}


class CannotSplit(Exception):
    pass


class Leaf:
    __slots__ = ("kind", "value", "space", "bracket", "opening", "comment")

    def __init__(self, kind: str, value: str, space: str = "") -> None:
        self.kind = kind  # name | number | string | op
        self.value = value  # "" while an optional parenthesis is invisible
        self.space = space  # whitespace before it, unless it starts a line
        self.bracket = (
            "open"
            if value and value in OPEN
            else "close"
            if value and value in CLOSE
            else ""
        )
        self.opening: Leaf | None = None  # a closing bracket's opening one
        self.comment = ""  # a trailing comment that follows this leaf


def _operand(leaf: Leaf | None) -> bool:
    """Ends an operand: a bracket after it is a call or subscript, an operator after it binary."""
    return leaf is not None and (
        leaf.bracket == "close"
        or leaf.kind in ("string", "number")
        or (
            leaf.kind == "name"
            and (
                not keyword.iskeyword(leaf.value)
                or leaf.value in ("None", "True", "False")
            )
        )
    )


class Line:
    def __init__(
        self,
        leaves: list[Leaf],
        base: str,
        depth: int = 0,
        inside: bool = False,
        unit: str = INDENT,
    ) -> None:
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
        drop = sum(
            len(x.comment) + 2 for x in self.leaves if x.comment and _pragma(x.comment)
        )
        return _width(self.text()) - drop <= limit

    def lengths(self):
        """(index, leaf, its length) as black counts them (comments included)."""
        for i, leaf in enumerate(self.leaves):
            yield (
                i,
                leaf,
                len(leaf.value if i == 0 else leaf.space + leaf.value)
                + len(leaf.comment),
            )

    def width(self) -> int:
        return _width(self.base) + len(INDENT) * self.depth

    def magic_comma(self) -> bool:
        """A comma before a closing bracket keeps the pair exploded (not a one-element tuple or subscript)."""
        leaves = self.leaves
        for i, leaf in enumerate(leaves):
            if (
                i
                and leaf.bracket == "close"
                and leaf.value
                and leaves[i - 1].value == ","
                and leaf.opening in leaves
            ):
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
            ends_extra = (
                bool(extra)
                and extra[-1][0] == depth
                and (
                    (extra[-1][1] == "for" and leaf.value == "in")
                    or (extra[-1][1] == "lambda" and leaf.value == ":")
                )
            )
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
            if (
                leaf.kind == "name"
                and leaf.value in ("for", "lambda")
                and not leaf.bracket
            ):
                depth += 1
                extra.append((depth, leaf.value))
        return out


def _width(text: str) -> int:
    return len(text.expandtabs(4)) if "\t" in text else len(text)


def _pragma(comment: str) -> bool:
    body = comment[1:].strip()
    return body.startswith(
        ("type:", "noqa", "pyright:", "pylint:", "nosec", "isort:", "mypy:", "ruff:")
    )


def _one_sequence(leaves: list[Leaf], closing: Leaf) -> bool:
    """(a,) or x[a,]: one item and its comma, where the comma is not magic. A call's is."""
    start = leaves.index(closing.opening)
    if (
        _top_commas(leaves[start + 1 : leaves.index(closing)]) != 1
        or closing.value == "}"
    ):
        return False
    call = _operand(leaves[start - 1] if start else None)
    return (closing.value == ")" and not call) or (closing.value == "]" and call)


def _top_commas(leaves: list[Leaf]) -> int:
    depth, n = 0, 0
    for leaf in leaves:
        depth += (leaf.bracket == "open") - (leaf.bracket == "close")
        n += depth == 0 and leaf.value == ","
    return n


def _split_before(
    leaf: Leaf, prev: Leaf | None, nxt: Leaf | None, seen_for: bool
) -> int:
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
        "for": COMPREHENSION,
        "if": COMPREHENSION if seen_for else TERNARY,
        "else": TERNARY,
        "is": COMPARATOR,
        "in": 0 if after_not else COMPARATOR,
        "and": LOGIC,
        "or": LOGIC,
        "not": COMPARATOR
        if nxt is not None
        and nxt.value == "in"
        and not (prev is not None and prev.value == "is")
        else 0,
    }.get(v, 0)


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
            if (
                any(
                    t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)
                    for t in tokens[i + 1 :]
                )
                or not leaves
            ):
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
                depth += (tokens[j].type in _STRING_START) - (
                    tokens[j].type in _STRING_END
                )
                if depth == 0:
                    break
            end = tokens[j].end
            if end[0] != tok.start[0]:
                return None
            value = lines[tok.start[0] - 1][tok.start[1] : end[1]]
            kind = "string"
            i = j
        else:
            value = tok.string
            kind = {
                tokenize.NAME: "name",
                tokenize.NUMBER: "number",
                tokenize.STRING: "string",
            }.get(tok.type, "op")
            if "\n" in value:
                return None  # a multi-line string
        if value == ";" and not stack:
            return None
        if prev_end is None:
            space = ""
        elif prev_end[0] == tok.start[0]:
            space = lines[tok.start[0] - 1][prev_end[1] : tok.start[1]]
        elif not stack:
            return None  # a backslash continuation
        else:
            prev = leaves[-1].value
            space = (
                ""
                if (prev and prev in OPEN)
                or value in CLOSE
                or value in (",", ".")
                or prev == "."
                else " "
            )
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
    if (
        not leaves
        or stack
        or leaves[0].value in ("def", "class", "@", "import", "from", "async")
    ):
        return None
    line = _with_optional_parens(leaves)
    if line is not None:
        line.leaves[
            -1
        ].comment = comment  # after the last leaf, optional parenthesis included (ruff)
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
    if first in (
        "if",
        "elif",
        "while",
        "for",
        "with",
        "else",
        "try",
        "except",
        "finally",
    ):
        if not colon_last or any(
            leaves[i].value == ":" for i in top[:-1] if leaves[i].kind == "op"
        ):
            return None  # a one-line compound statement, or a lambda in the header
        if first in ("if", "elif", "while"):
            return Line(_wrap(leaves, 1, len(leaves) - 1), "")
        if first == "with" and not any(leaves[i].value in (",", "as") for i in top):
            return Line(
                _wrap(leaves, 1, len(leaves) - 1), ""
            )  # one item: parentheses (ruff)
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
    equals = [
        i
        for i in top
        if i < lam and (leaves[i].value == "=" or leaves[i].value in AUGMENTED)
    ]
    if equals and equals[-1] + 1 < len(leaves):
        return Line(_wrap(leaves, equals[-1] + 1, len(leaves)), "")
    return Line(leaves, "")


def _wrap(leaves: list[Leaf], start: int, stop: int) -> list[Leaf]:
    if start >= stop:
        return leaves
    first, last = leaves[start], leaves[stop - 1]
    if first.bracket == "open" and last.opening is first and first.value == "(":
        inner = Line(leaves[start + 1 : stop - 1], "")
        delims = inner.delimiters()
        if (
            inner.leaves
            and max(delims.values(), default=0) < COMMA
            and not any(x.value in ("yield", "await") for x in inner.leaves[:1])
        ):
            first.value = last.value = ""  # redundant: optional again
        return leaves
    lpar, rpar = Leaf("op", "", first.space), Leaf("op", "")
    lpar.bracket, rpar.bracket, rpar.opening = "open", "close", lpar
    first.space = ""
    return [*leaves[:start], lpar, *leaves[start:stop], rpar, *leaves[stop:]]
