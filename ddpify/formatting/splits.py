"""black's splits of a statement too long for its line (as black's linegen does them): the
right-hand split at the last bracket pair, passing over trailers and optional parentheses where
black would, and the delimiter split of a bracket's contents at its highest-priority delimiter."""

from __future__ import annotations

from ddpify.formatting.leaves import (
    COMMA,
    DOT,
    CannotSplit,
    Leaf,
    Line,
    _operand,
    _one_sequence,
)


def _transform(line: Line, limit: int, force: bool = False) -> list[Line]:
    if not line.explode and not line.magic_comma() and line.fits(limit):
        return [line]
    for split in (_delimiter_split, _rhs) if line.inside else (_rhs,):
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
    if (
        force
        or split is not _rhs
        or not invisible
        or any(x.value for x in invisible)
        or result[0].fits(limit)
    ):
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
                if (
                    prev is not None
                    and prev.value == ","
                    and not _one_sequence(leaves, leaf)
                ):
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
            if (
                prev is not None
                and prev.value == ","
                and not _one_sequence(leaves, leaf)
            ):
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
        top = max(
            (p for k, p in delims.items() if not (trailing and k == id(body[-1]))),
            default=0,
        )
        atom = not opening.value or not _operand(head[-2] if len(head) > 1 else None)
        b.explode = top == COMMA and (trailing or atom)
    return h, b, t, opening, closing


def _right_hand_split(line: Line, limit: int, omit, force: bool) -> list[Line]:
    return _omitting_optional_parens(_first_rhs(line, omit), line, limit, omit, force)


def _omitting_optional_parens(
    rhs, line: Line, limit: int, omit, force: bool
) -> list[Line]:
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
            closing.comment, body.leaves[0].comment = (
                closing.comment or body.leaves[0].comment,
                "",
            )
            raise CannotSplit("parentheses would not help")
    opening.value, closing.value = (
        opening.value or "(",
        closing.value or ")",
    )  # black's ensure_visible
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
    if (
        first.bracket == "open"
        and second.bracket != "close"
        and _can_omit_opening(body, first, limit)
    ):
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
    if (
        not any(x.bracket for x in head[:-1])
        or len(rhs[0].text()) > limit - 1
        or rhs[0].magic_comma()
    ):
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
