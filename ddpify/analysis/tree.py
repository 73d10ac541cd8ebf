"""The tree itself: a node's child fields in LibCST's visiting order, source text of a node
(codegen without position bookkeeping), dotted names and call arguments, and the climb from a
node to what holds it (its statement, block, function, class, nearest ancestor of a type).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import fields
from typing import get_args

import libcst as cst
from libcst._nodes.internal import CodegenState

import ddpify.match as m

# nodes that open a scope of their own (class bodies are handled apart: not seen from methods)
SCOPES = (
    cst.FunctionDef,
    cst.Lambda,
    cst.ListComp,
    cst.SetComp,
    cst.DictComp,
    cst.GeneratorExp,
)
_SCOPE_TYPES = frozenset((*SCOPES, cst.ClassDef))

# -- walking the tree without LibCST's visit ----------------------------------------------
# node type -> (fields LibCST's visit walks, in its order; fields it may skip by value)
_FIELDS: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}


class _FieldProbe(cst.CSTVisitor):
    """Names the fields a node's _visit_and_replace_children walks, without descending."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        return False

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        self.names.append(attribute)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave(self, original_node: cst.CSTNode) -> None:
        pass


def _holds_nodes(v: object) -> bool:
    return isinstance(v, cst.CSTNode) or (
        isinstance(v, (list, tuple)) and any(isinstance(x, cst.CSTNode) for x in v)
    )


def child_fields(node: cst.CSTNode) -> tuple[str, ...]:
    """The child fields of node in LibCST's visiting (= source) order; dataclass field order is
    not it (a FunctionDef's decorators come last there). Probed on the first node of a type;
    again on a node whose value in a field the probe did not see holds nodes (LibCST skips an
    f-string's format_spec when it is None)."""
    t = type(node)
    entry = _FIELDS.get(t)
    if entry is not None and (
        not entry[1] or not any(_holds_nodes(getattr(node, f)) for f in entry[1])
    ):
        return entry[0]
    probe = _FieldProbe()
    node._visit_and_replace_children(probe)
    names = tuple(probe.names)
    if entry is None:
        # fields typed to hold nodes (not str, bool, ...) that this node's visit skipped
        unseen = tuple(
            f.name
            for f in fields(t)
            if f.name not in names
            and (
                isinstance(f.type, str)
                or "libcst" in repr(f.type).replace("libcst._maybe_sentinel", "")
            )
        )
        _FIELDS[t] = (names, unseen)
    return names


# whitespace and comments: half the nodes of a tree, and nothing the analysis looks at
_WHITESPACE = (
    cst.BaseParenthesizableWhitespace,
    cst.TrailingWhitespace,
    cst.Newline,
    cst.EmptyLine,
    cst.Comment,
)
_WALK: dict[
    tuple[type, tuple[str, ...]], tuple[str, ...]
] = {}  # (type, child fields) -> those to walk


def _whitespace_only(tp: object) -> bool:
    """A field annotation that admits whitespace (or no node) only."""
    args = get_args(tp)
    if args:
        return all(_whitespace_only(a) for a in args)
    return (
        tp is type(None)
        or tp is cst.MaybeSentinel
        or (isinstance(tp, type) and issubclass(tp, _WHITESPACE))
    )


def _walk_fields(node: cst.CSTNode) -> tuple[str, ...]:
    """child_fields(node) less those typed to hold whitespace only."""
    t = type(node)
    names = child_fields(node)
    walk = _WALK.get((t, names))
    if walk is None:
        ws = frozenset(f.name for f in fields(t) if _whitespace_only(f.type))
        walk = _WALK[(t, names)] = tuple(name for name in names if name not in ws)
    return walk


_LEAF: dict[tuple[type, ...], bool] = {}


def _leaf_types(types: tuple[type, ...]) -> bool:
    """True when no type has subclasses: isinstance is then type(x) in types."""
    leaf = _LEAF.get(types)
    if leaf is None:
        leaf = _LEAF[types] = not any(t.__subclasses__() for t in types)
    return leaf


class _Plain(CodegenState):
    """CodegenState without the contextlib generator LibCST enters for most nodes to record
    positions nobody asks for here (the text is the same)."""

    __slots__ = ()

    def record_syntactic_position(self, node, *, start_node=None, end_node=None):  # type: ignore[override]
        return _NO_RECORD


_NO_RECORD = nullcontext()


def codegen(node: cst.CSTNode, module: cst.Module | None = None) -> str:
    """module.code_for_node(node), by default cst.Module(body=[])'s; codegen(m, m) is m.code."""
    if module is None:
        st = _Plain(default_indent="    ", default_newline="\n")
    else:
        st = _Plain(
            default_indent=module.default_indent, default_newline=module.default_newline
        )
    node._codegen(st)
    return "".join(st.tokens)


def dotted(node: cst.CSTNode | None) -> str | None:
    """`self.model` -> "self.model"; None for anything but Name/Attribute chains."""
    t = type(
        node
    )  # exact types first: isinstance on LibCST's ABCs is slow, and this is hot
    if t is cst.Name or (t is not cst.Attribute and isinstance(node, cst.Name)):
        return node.value  # type: ignore[union-attr]
    if t is cst.Attribute or isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def code(node: cst.CSTNode) -> str:
    return codegen(node)


def text_of(node: cst.CSTNode | None) -> str | None:
    """The value of a string literal; None for anything else, a bytes literal included
    (`txn.put(b"key", ...)`: no path, no mode, no device)."""
    if not isinstance(node, cst.SimpleString):
        return None
    try:
        value = node.evaluated_value
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) else None


def reads_name(node: cst.CSTNode, name: str) -> bool:
    """node (or a part of it) is the variable or dotted path `name`; the `x` of `obj.x` is an
    attribute's name, not the variable x."""
    attrs = {id(n.attr) for n in m.findall(node, m.Attribute())}
    return dotted(node) == name or any(
        dotted(n) == name and id(n) not in attrs
        for n in m.findall(node, m.Name() | m.Attribute())
    )


def call_args(call: cst.Call) -> tuple[list[cst.Arg], dict[str, cst.Arg]]:
    pos = [a for a in call.args if a.keyword is None and not a.star]
    kw = {a.keyword.value: a for a in call.args if a.keyword is not None}
    return pos, kw


def _flatten_targets(t: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(t, (cst.Tuple, cst.List)):
        out: list[cst.BaseExpression] = []
        for el in t.elements:
            out.extend(_flatten_targets(el.value))
        return out
    return [t]


def _inside(a: TreeMixin, node: cst.CSTNode, container: cst.CSTNode) -> bool:
    cur = a.parent.get(node)
    while cur is not None:
        if cur is container:
            return True
        cur = a.parent.get(cur)
    return False


def _in_orelse(a: TreeMixin, node: cst.CSTNode, loop: cst.CSTNode) -> bool:
    orelse = getattr(loop, "orelse", None)
    return orelse is not None and _inside(a, node, orelse)


class TreeMixin:
    """Analysis's climbs through the parent map its walk (walk.py) builds."""

    def ancestor(self, node: cst.CSTNode, *types: type) -> cst.CSTNode | None:
        parent = self.parent
        cur = parent.get(node)
        if _leaf_types(types):  # a set lookup instead of isinstance on LibCST's ABCs
            while cur is not None and type(cur) not in types:
                cur = parent.get(cur)
            return cur
        while cur is not None and not isinstance(cur, types):
            cur = parent.get(cur)
        return cur

    def statement(self, node: cst.CSTNode) -> cst.BaseStatement:
        """The statement (a member of a block's body) that holds node."""
        cur = node
        while True:
            par = self.parent.get(cur)
            if par is None or isinstance(par, (cst.IndentedBlock, cst.Module)):
                return cur  # type: ignore[return-value]
            if isinstance(par, cst.SimpleStatementSuite):
                # one-line compound statement: the compound statement is the unit
                return self.statement(self.parent[par])
            cur = par

    def block(self, stmt: cst.CSTNode) -> cst.CSTNode:
        return self.parent[stmt]

    def function_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        return self.ancestor(node, cst.FunctionDef)  # type: ignore[return-value]

    def class_of(self, node: cst.CSTNode) -> cst.ClassDef | None:
        return self.ancestor(node, cst.ClassDef)  # type: ignore[return-value]

    def scope_key(self, node: cst.CSTNode) -> cst.CSTNode:
        return self.function_of(node) or self.module


def _path(node: cst.CSTNode | None) -> str | None:
    """dotted() that also goes through subscripts: `model.blocks[0].attn` -> "model.blocks.[].attn"."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _path(node.value)
        return f"{base}.{node.attr.value}" if base else None
    if isinstance(node, cst.Subscript):
        base = _path(node.value)
        return f"{base}.[]" if base else None
    return None
