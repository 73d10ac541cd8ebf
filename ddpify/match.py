"""The small part of libcst.matchers that ddpify uses, without its 190 ms import (the
generated matcher module defines a dataclass for every node type; a pre-commit hook pays
that on every run). Same spelling: m.Call(func=m.Attribute(attr=m.Name("step"))), `|`,
m.matches, m.findall."""

from __future__ import annotations

from typing import Any

import libcst as cst

# positional arguments, in LibCST's field order, for the patterns ddpify writes that way
_POSITIONAL = {
    "Name": ("value",),
    "SimpleString": ("value",),
    "ComparisonTarget": ("operator", "comparator"),
}


class Pattern:
    def __init__(self, cls: type, *args: Any, **fields: Any) -> None:
        if (
            args
        ):  # (the concerns build patterns in their loops: keep the usual case short)
            names = _POSITIONAL.get(cls.__name__, ())
            if len(args) > len(names):
                raise TypeError(
                    f"{cls.__name__}() takes at most {len(names)} positional patterns"
                )
            fields = {**dict(zip(names, args)), **fields}
        self.cls = cls
        self.fields = fields

    def __or__(self, other: "Pattern | OneOf") -> "OneOf":
        return OneOf(self, other)

    def __repr__(self) -> str:
        return f"{self.cls.__name__}({', '.join(f'{k}={v!r}' for k, v in self.fields.items())})"


class OneOf:
    def __init__(self, *options: "Pattern | OneOf") -> None:
        flat: list[Pattern] = []
        for o in options:
            flat.extend(o.options if isinstance(o, OneOf) else (o,))
        self.options = tuple(flat)

    def __or__(self, other: "Pattern | OneOf") -> "OneOf":
        return OneOf(self, other)


def _factory(name: str):
    cls = getattr(cst, name)

    def make(*args: Any, **fields: Any) -> Pattern:
        return Pattern(cls, *args, **fields)

    make.__name__ = name
    return make


Name = _factory("Name")
Call = _factory("Call")
Attribute = _factory("Attribute")
SimpleString = _factory("SimpleString")
SimpleStatementLine = _factory("SimpleStatementLine")
With = _factory("With")
WithItem = _factory("WithItem")
While = _factory("While")
For = _factory("For")
Return = _factory("Return")
Dict = _factory("Dict")
Break = _factory("Break")
Assign = _factory("Assign")
AugAssign = _factory("AugAssign")
AnnAssign = _factory("AnnAssign")
Comparison = _factory("Comparison")
ComparisonTarget = _factory("ComparisonTarget")
Equal = _factory("Equal")
FormattedStringText = _factory("FormattedStringText")
If = _factory("If")
IfExp = _factory("IfExp")
Try = _factory("Try")
Continue = _factory("Continue")
CompIf = _factory("CompIf")
CompFor = _factory("CompFor")
Subscript = _factory("Subscript")
AssignTarget = _factory("AssignTarget")
NamedExpr = _factory("NamedExpr")
Global = _factory("Global")
Arg = _factory("Arg")
Nonlocal = _factory("Nonlocal")
Import = _factory("Import")
ImportFrom = _factory("ImportFrom")
FunctionDef = _factory("FunctionDef")
Yield = _factory("Yield")


def matches(node: Any, pattern: "Pattern | OneOf | Any") -> bool:
    if isinstance(pattern, OneOf):
        return any(matches(node, o) for o in pattern.options)
    if isinstance(pattern, Pattern):
        cls = pattern.cls
        # the exact type first: isinstance on LibCST's node classes goes through ABCMeta
        if type(node) is not cls and not isinstance(node, cls):
            return False
        for k, v in pattern.fields.items():
            if not matches(getattr(node, k, None), v):
                return False
        return True
    if isinstance(
        pattern, (list, tuple)
    ):  # a sequence pattern matches element by element
        seq = list(node) if isinstance(node, (list, tuple)) else None
        return (
            seq is not None
            and len(seq) == len(pattern)
            and all(matches(n, p) for n, p in zip(seq, pattern))
        )
    return node == pattern


def findall(tree: cst.CSTNode, pattern: "Pattern | OneOf") -> list[cst.CSTNode]:
    """Pre-order, like libcst.matchers.findall (used on nodes built by transforms; the
    analysed tree goes through Analysis.findall's index)."""
    out: list[cst.CSTNode] = []
    stack: list[cst.CSTNode] = [tree]
    while stack:
        n = stack.pop()
        if matches(n, pattern):
            out.append(n)
        stack.extend(reversed(n.children))
    return out


def bare(pattern: Pattern) -> bool:
    """m.Call() with no constraints: the type alone decides."""
    return not pattern.fields
