"""Abstract values of lint's rank evaluator (ddpify/lint/ranks.py): a value is a triple, one
entry a process of SCENARIOS (global rank 0; global rank 1 on the same node; global rank 4, local
rank 0 of a second node; 8 processes, 4 a node), UNK where it is not known statically, and a
truth value is a triple of True/False/UNK. The operations follow Python's, entry by entry."""

from __future__ import annotations

import libcst as cst


class _Unknown:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNK"


UNK = _Unknown()


class Sym(tuple):
    """An unknown value computed from a known one (`args.seed + rank`): unknown, but different
    where the known part differs."""

    __slots__ = ()


# (global rank, local rank, node rank) of the three processes each value is computed for
SCENARIOS = ((0, 0, 0), (1, 1, 0), (4, 0, 1))
WORLD, LOCAL_WORLD = 8, 4
N = len(SCENARIOS)
ALL_UNK = (UNK,) * N


def _leaf(kind: str) -> tuple:
    if kind == "g":
        return tuple(s[0] for s in SCENARIOS)
    if kind == "l":
        return tuple(s[1] for s in SCENARIOS)
    if kind == "n":
        return tuple(s[2] for s in SCENARIOS)
    if kind == "W":
        return (WORLD,) * N
    if kind == "LW":
        return (LOCAL_WORLD,) * N
    if kind == "main":
        return tuple(s[0] == 0 for s in SCENARIOS)
    if kind == "local_main":
        return tuple(s[1] == 0 for s in SCENARIOS)
    if kind == "true":
        return (True,) * N
    return ALL_UNK


def const(value) -> tuple:
    return (value,) * N


def depends(values: tuple) -> bool:
    """The entries differ (an unknown entry beside a known one counts as different)."""
    first = values[0]
    return any(
        v is not first and (v is UNK or first is UNK or v != first) for v in values[1:]
    )


def truth(values: tuple) -> tuple:
    out = []
    for v in values:
        if v is UNK or isinstance(v, Sym):
            out.append(UNK)
        else:
            try:
                out.append(bool(v))
            except Exception:
                out.append(UNK)
    return tuple(out)


def t_not(t: tuple) -> tuple:
    return tuple(UNK if v is UNK else not v for v in t)


def t_and(x: tuple, y: tuple) -> tuple:
    return tuple(
        False if (a is False or b is False) else UNK if (a is UNK or b is UNK) else True
        for a, b in zip(x, y)
    )


def t_or(x: tuple, y: tuple) -> tuple:
    return tuple(
        True if (a is True or b is True) else UNK if (a is UNK or b is UNK) else False
        for a, b in zip(x, y)
    )


TRUE = const(True)


def _literal(node: cst.BaseExpression):
    try:
        if isinstance(node, cst.Integer):
            return int(node.value.replace("_", ""), 0)
        if isinstance(node, cst.Float):
            return float(node.value.replace("_", ""))
        if isinstance(node, cst.SimpleString):
            return node.evaluated_value
    except (ValueError, SyntaxError):
        return UNK
    return UNK


def _binop(op: cst.BaseBinaryOp, x, y):
    if (
        isinstance(op, cst.Modulo)
        and x == 0
        and x is not UNK
        and not isinstance(x, str)
    ):
        return 0  # 0 % n
    if isinstance(op, cst.Multiply) and (
        (x == 0 and x is not UNK) or (y == 0 and y is not UNK)
    ):
        return 0
    if x is UNK or y is UNK or isinstance(x, Sym) or isinstance(y, Sym):
        known = y if x is UNK or isinstance(x, Sym) else x
        if known is UNK:
            return UNK
        return Sym(
            (
                type(op).__name__,
                x if isinstance(x, Sym) else None,
                y if isinstance(y, Sym) else None,
                known if not isinstance(known, Sym) else None,
            )
        )
    try:
        if isinstance(op, cst.Add):
            return x + y
        if isinstance(op, cst.Subtract):
            return x - y
        if isinstance(op, cst.Multiply):
            return x * y
        if isinstance(op, cst.Modulo):
            return x % y
        if isinstance(op, cst.FloorDivide):
            return x // y
        if isinstance(op, cst.Divide):
            return x / y
    except Exception:
        return UNK
    return UNK


def _compare(op: cst.BaseCompOp, x, y):
    if x is UNK or y is UNK or isinstance(x, Sym) or isinstance(y, Sym):
        return UNK
    try:
        if isinstance(op, cst.Equal):
            return x == y
        if isinstance(op, cst.NotEqual):
            return x != y
        if isinstance(op, cst.LessThan):
            return x < y
        if isinstance(op, cst.LessThanEqual):
            return x <= y
        if isinstance(op, cst.GreaterThan):
            return x > y
        if isinstance(op, cst.GreaterThanEqual):
            return x >= y
        if isinstance(op, cst.In):
            return x in y
        if isinstance(op, cst.NotIn):
            return x not in y
        if isinstance(op, cst.Is):
            return x is y
        if isinstance(op, cst.IsNot):
            return x is not y
    except Exception:
        return UNK
    return UNK


def _combine(options: list[tuple]) -> tuple:
    """Several values a name may hold: the rank-dependent one (the distributed path: `rank =
    dist.get_rank() if dist.is_initialized() else 0`), else the one they agree on."""
    for v in options:
        if depends(v) and any(x is not UNK for x in v):
            return v
    known = [v for v in options if all(x is not UNK for x in v)]
    if options and len(known) == len(options) and all(v == known[0] for v in known):
        return known[0]
    return ALL_UNK
