"""Source positions: node -> CodeRange, as LibCST's PositionProvider gives it, computed on demand
(a statement's codegen found in the source by its text); line numbers of findings; and the lines
a `# ddpify: skip` / `# ddpify: off ... on` comment exempts.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from itertools import accumulate

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst._position import CodePosition, CodeRange


# -- positions ------------------------------------------------------------------------------
class _Stop(Exception):
    """Ends a partial codegen."""


class _Recorder(CodegenState):
    """Codegen that notes, per node, the token indices where LibCST's PositionProvider puts its
    start and end (the syntactic range where the node records one, else the whitespace-inclusive
    one). It can stop early: at the first indented block (a statement's header gives its start),
    or once a given node is complete. Keyed by id(): a node's __hash__ is a Python call."""

    __slots__ = (
        "ws_start",
        "done",
        "syn_start",
        "syn_end",
        "open",
        "header_only",
        "stop_after",
        "stopped",
    )

    def __init__(
        self,
        module: cst.Module,
        indents: list[str],
        header_only: bool = False,
        stop_after: cst.CSTNode | None = None,
    ) -> None:
        super().__init__(
            default_indent=module.default_indent,
            default_newline=module.default_newline,
            indent_tokens=indents,
        )
        self.ws_start: dict[int, int] = {}
        self.done: dict[int, int] = {}  # complete nodes: whitespace-inclusive end
        self.syn_start: dict[int, int] = {}
        self.syn_end: dict[int, int] = {}
        self.open: list[
            tuple[int, cst.CSTNode | None, cst.CSTNode | None]
        ] = []  # entered syntactic records
        self.header_only = header_only
        self.stop_after = stop_after
        self.stopped = False

    def before_codegen(self, node: cst.CSTNode) -> None:
        if self.stopped:
            return
        if self.header_only and type(node) is cst.IndentedBlock:
            self.stopped = True
            raise _Stop
        self.ws_start[id(node)] = len(self.tokens)

    def after_codegen(self, node: cst.CSTNode) -> None:
        if self.stopped:
            return
        self.done[id(node)] = len(self.tokens)
        if node is self.stop_after:
            self.stopped = True
            raise _Stop

    def record_syntactic_position(self, node, *, start_node=None, end_node=None):  # type: ignore[override]
        # the recorder is its own context (cheaper than a contextlib generator per node)
        if start_node is None and not self.stopped:
            self.syn_start[id(node)] = len(self.tokens)
        self.open.append((id(node), start_node, end_node))
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> None:
        key, start_node, end_node = self.open.pop()
        if (
            exc_type is None and not self.stopped
        ):  # (a stop unwinding through here records nothing)
            if start_node is not None:
                self.syn_start[key] = self.start_of(id(start_node))  # type: ignore[assignment]
            self.syn_end[key] = (
                self.end_of(id(end_node)) if end_node is not None else len(self.tokens)
            )  # type: ignore[assignment]

    def pop_trailing_newline(self) -> None:
        pass  # PositionProvider counts it: recorded indices stay valid

    def start_of(self, key: int) -> int | None:
        k = self.syn_start.get(key)
        return self.ws_start[key] if k is None and key in self.done else k

    def end_of(self, key: int) -> int | None:
        k = self.syn_end.get(key)
        return self.done.get(key) if k is None else k


_NEWLINE_RE = re.compile(r"\r\n?|\n")
# what LibCST's codegen may not give back as it was parsed: a form feed or a lone "\" at a line
# start, a BOM; and "\r", where positions are counted token by token
_NOT_ROUND_TRIP = re.compile(r"[\r\x0c\ufeff]|^[ \t]*\\", re.M)


class _Positions:
    """node -> CodeRange, the same as LibCST's PositionProvider gives, computed on demand (a
    file needs a few dozen, not a second codegen of everything): the statement that holds the
    node is generated alone (its header alone where a start will do) and found in the source by
    its text; where that text is not unique, the statement around it is; the whole module as the
    last resort (and where the source has "\r": LibCST counts lines token by token)."""

    def __init__(
        self, module: cst.Module, source: str, parent: dict[cst.CSTNode, cst.CSTNode]
    ) -> None:
        self.module = module
        self.source = source
        self.parent = parent
        self.starts: dict[int, int] = {}  # id(node) -> offset into the source
        self.ends: dict[int, int] = {}
        self.whole = False
        self.newlines: list[int] | None = None
        self.exact: dict[int, tuple[int, int]] | None = (
            None  # offset -> (line, column), "\r" files
        )

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        key = id(node)
        if key not in self.ends or key not in self.starts:
            self._find(node, need_end=True)
        return CodeRange(self._at(self.starts[key]), self._at(self.ends[key]))

    def start(self, node: cst.CSTNode) -> CodePosition:
        key = id(node)
        if key not in self.starts:
            self._find(node, need_end=False)
        return self._at(self.starts[key])

    def _find(self, node: cst.CSTNode, need_end: bool) -> None:
        if self.whole:
            return
        stmt = self._statement(node)
        key = id(node)
        if stmt is not None and "\r" not in self.source:
            if (
                not need_end
                and self._run(stmt, header_only=True)
                and key in self.starts
            ):
                return
            if (
                self._run(stmt)
                and key in self.starts
                and (not need_end or key in self.ends)
            ):
                return
        self._run_whole()

    def _statement(self, node: cst.CSTNode | None) -> cst.BaseStatement | None:
        """The statement of a block (or of the module) that holds node."""
        parent = self.parent
        cur = node
        while cur is not None:
            par = parent.get(cur)
            if par is None:
                return None
            if type(par) is cst.IndentedBlock or type(par) is cst.Module:
                return cur if isinstance(cur, cst.BaseStatement) else None
            cur = par
        return None

    def _indents(self, stmt: cst.CSTNode) -> list[str]:
        """The indentation codegen has reached at stmt: one entry per block (and match) around it."""
        out: list[str] = []
        default = self.module.default_indent
        child, cur = stmt, self.parent.get(stmt)
        while cur is not None:
            if type(cur) is cst.IndentedBlock or (
                type(cur) is cst.Match and type(child) is cst.MatchCase
            ):
                out.append(default if cur.indent is None else cur.indent)  # type: ignore[union-attr]
            child, cur = cur, self.parent.get(cur)
        out.reverse()
        return out

    def _run(self, stmt: cst.BaseStatement, header_only: bool = False) -> bool:
        """Generate stmt alone and find it in the source; climb to the enclosing statement (up to
        the end of stmt) while its text is not unique there. False: not found below the module."""
        target: cst.BaseStatement | None = stmt
        stop_after = None
        while target is not None:
            rec = _Recorder(
                self.module,
                self._indents(target),
                header_only and stop_after is None,
                stop_after,
            )
            try:
                target._codegen(rec)
            except _Stop:
                pass
            at = self._place(self.source, "".join(rec.tokens))
            if at >= 0:
                self._commit(rec, list(accumulate(map(len, rec.tokens), initial=at)))
                return True
            target, stop_after = self._statement(self.parent.get(target)), stmt
        return False

    @staticmethod
    def _place(source: str, text: str) -> int:
        """Where text occurs in source at the start of a line (a statement of a block starts
        one), if there alone; else -1: it is there, so a single place is its place."""
        found = -1
        at = source.find(text)
        while at >= 0:
            if at == 0 or source[at - 1] == "\n":
                if found >= 0:
                    return -1
                found = at
            at = source.find(text, at + 1)
        return found

    def _commit(self, rec: _Recorder, offsets: list[int]) -> None:
        # what _Recorder.start_of / end_of give, for every node at once
        done = rec.done
        starts, ends = self.starts, self.ends
        starts.update(
            {key: offsets[k] for key, k in rec.ws_start.items() if key in done}
        )
        starts.update({key: offsets[k] for key, k in rec.syn_start.items()})
        ends.update({key: offsets[k] for key, k in done.items()})
        ends.update({key: offsets[k] for key, k in rec.syn_end.items()})

    def _run_whole(self) -> None:
        rec = _Recorder(self.module, [])
        self.module._codegen(rec)
        offsets = list(accumulate(map(len, rec.tokens), initial=0))
        self._commit(rec, offsets)
        text = "".join(rec.tokens)
        if "\r" in text:
            line, col, exact = 1, 0, {0: (1, 0)}
            for tok, off in zip(rec.tokens, offsets[1:]):
                parts = _NEWLINE_RE.split(tok)
                if len(parts) == 1:
                    col += len(tok)
                else:
                    line, col = line + len(parts) - 1, len(parts[-1])
                exact[off] = (line, col)
            self.exact = exact
        else:
            self.newlines = [
                mt.start() for mt in re.finditer("\n", text)
            ]  # the source's, and a final one it may lack
        self.whole = True

    def _at(self, off: int) -> CodePosition:
        if self.exact is not None:
            return CodePosition(*self.exact[off])
        nl = self.newlines
        if nl is None:
            nl = self.newlines = [mt.start() for mt in re.finditer("\n", self.source)]
        before = bisect_left(nl, off)  # newlines before off
        return CodePosition(before + 1, off - (nl[before - 1] + 1 if before else 0))


class PositionsMixin:
    """Analysis's positions (self.pos, a _Positions) and skip comments."""

    def skipped(self, node: cst.CSTNode) -> bool:
        if not self._skipped_lines:
            return False
        p = self.pos[node]
        return any(
            ln in self._skipped_lines for ln in range(p.start.line, p.end.line + 1)
        )

    def line_col(self, node: cst.CSTNode) -> tuple[int, int]:
        p = self.pos.start(node)
        return p.line, p.column + 1
