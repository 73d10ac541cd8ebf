"""On which ranks a line runs: the `if`s around it (and the early `return`s before it) whose test
depends on the rank, within its function and through the calls of that function.

Truth values are triples, one entry a process of ranks.SCENARIOS: True (runs), False (does not),
UNK (not known statically).
"""

from __future__ import annotations

import libcst as cst

from ddpify.lint.values import TRUE, UNK, depends, t_and, t_not, t_or

_EXITS = (cst.Return, cst.Raise, cst.Continue, cst.Break)


def _ends_in_exit(block: cst.BaseSuite) -> bool:
    body = block.body
    if not body:
        return False
    last = body[-1]
    if isinstance(last, cst.SimpleStatementLine):
        return isinstance(last.body[-1], _EXITS)
    if isinstance(last, cst.BaseSmallStatement):
        return isinstance(last, _EXITS)
    return False


class Reach:
    def __init__(self, a, ranks, facts=None) -> None:
        self.a = a
        self.ranks = ranks
        self.facts = facts
        self._blocks: dict[int, list] = {}
        self._fn: dict[int, tuple | None] = {}

    def conditions(self, node: cst.CSTNode) -> list[tuple[cst.BaseExpression, bool]]:
        """(test, taken) of every condition around node within its function: the if/else
        branches, `x if c else y`, `c and x`, and the early exits (`if c: return`) before it.
        Innermost first."""
        a = self.a
        out: list[tuple[cst.BaseExpression, bool]] = []
        child, cur = node, a.parent.get(node)
        while cur is not None and not isinstance(
            cur, (cst.FunctionDef, cst.ClassDef, cst.Lambda)
        ):
            if isinstance(cur, (cst.IndentedBlock, cst.Module)):
                return out + self._exits_before(cur, child) + self._block(cur)
            self._step(cur, child, out)
            child, cur = cur, a.parent.get(cur)
        return out

    def _step(self, cur: cst.CSTNode, child: cst.CSTNode, out: list) -> None:
        if isinstance(cur, (cst.If, cst.IfExp)):
            if child is cur.body:
                out.append((cur.test, True))
            elif child is cur.orelse:
                out.append((cur.test, False))
        elif isinstance(cur, cst.BooleanOperation) and child is cur.right:
            out.append((cur.left, isinstance(cur.operator, cst.And)))

    @staticmethod
    def _exits_before(
        block: cst.CSTNode, stmt: cst.CSTNode
    ) -> list[tuple[cst.BaseExpression, bool]]:
        out = []
        for s in block.body:  # type: ignore[attr-defined]
            if s is stmt:
                break
            if isinstance(s, cst.If) and s.orelse is None and _ends_in_exit(s.body):
                out.append((s.test, False))
        return out

    def _block(self, block: cst.CSTNode) -> list[tuple[cst.BaseExpression, bool]]:
        """The conditions around a block (every statement of it shares them)."""
        key = id(block)
        got = self._blocks.get(key)
        if got is not None:
            return got
        a = self.a
        out: list[tuple[cst.BaseExpression, bool]] = []
        child, cur = block, a.parent.get(block)
        while cur is not None and not isinstance(
            cur, (cst.FunctionDef, cst.ClassDef, cst.Lambda)
        ):
            if isinstance(cur, (cst.IndentedBlock, cst.Module)):
                out += self._exits_before(cur, child) + self._block(cur)
                break
            self._step(cur, child, out)
            child, cur = cur, a.parent.get(cur)
        self._blocks[key] = out
        return out

    def local(self, node: cst.CSTNode) -> tuple:
        """Whether node runs on each process, from the conditions within its function."""
        result = TRUE
        for test, taken in self.conditions(node):
            t = self.ranks.test(test)
            result = t_and(result, t if taken else t_not(t))
        return result

    def rank_conditions(
        self, node: cst.CSTNode
    ) -> list[tuple[cst.BaseExpression, bool]]:
        """The conditions around node (within its function) whose test depends on the rank."""
        return [
            (test, taken)
            for test, taken in self.conditions(node)
            if self.ranks.depends(test)
        ]

    def divergent(self, node: cst.CSTNode) -> bool:
        """node runs on some ranks and not on others, by a condition within its function."""
        return bool(self.rank_conditions(node)) and depends(self.local(node))

    def runs(self, node: cst.CSTNode) -> tuple | None:
        """Whether node runs on each process, through the calls of its function too; None where
        its function is never called here (a method nothing calls, a callback)."""
        fn = self.a.function_of(node)
        here = self.local(node)
        if fn is None:
            # with mp.spawn, the script's own code runs once, in the parent: only the spawned
            # function runs on every rank
            return None if self.facts is not None and self.facts.spawned else here
        outer = self.function_runs(fn)
        return None if outer is None else t_and(here, outer)

    def function_runs(self, fn: cst.FunctionDef, depth: int = 0) -> tuple | None:
        key = id(fn)
        if key in self._fn:
            return self._fn[key]
        self._fn[key] = TRUE  # a recursive call does not narrow it
        a = self.a
        calls = [c for c in a.callers(fn) if a.function_of(c) is not fn]
        if (
            not calls and a.class_of(fn) is not None
        ):  # Trainer(...).fit(): a method called on any receiver
            calls = [
                c
                for c in a.calls
                if isinstance(c.func, cst.Attribute)
                and c.func.attr.value == fn.name.value
                and a.function_of(c) is not fn
            ]
        if self.facts is not None and self.facts.spawned:
            if id(fn) in self.facts.spawned:
                self._fn[key] = TRUE
                return TRUE
            calls = [
                c for c in calls if a.function_of(c) is not None
            ]  # the parent's module-level code is one process
        if not calls:
            if self.facts is not None and self.facts.spawned:
                got: tuple | None = None
            elif a._passed_as_value(fn):
                got = TRUE  # a callback: every rank
            elif a.class_of(fn) is None and a.region_of(fn) == 0:
                got = TRUE  # an entry point called from elsewhere
            else:
                got = None
        else:
            got = None
            for c in calls[:12]:
                r = self.runs(c) if depth < 6 else TRUE
                if r is None:
                    continue
                got = r if got is None else t_or(got, r)
        self._fn[key] = got
        return got

    def every_rank(self, node: cst.CSTNode) -> bool | None:
        """True when every rank may run node (rank 1 is not excluded), False when a rank test
        keeps some rank out, None when node's function is never called here."""
        r = self.runs(node)
        if r is None:
            return None
        return r[1] is True or (r[1] is UNK and not depends(r))

    def guard_kind(self, node: cst.CSTNode) -> str | None:
        """How a rank test narrows where node runs: "global" (global rank 0 alone, or some
        ranks but not one a node), "local" (local rank 0: one process a node), None (every rank)."""
        r = self.runs(node)
        if r is None or r[1] is True or (r[1] is UNK and not depends(r)):
            return None
        if r[0] is not False and r[2] is not False:
            return "local"
        return "global"
