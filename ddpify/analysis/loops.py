"""Control structure around a statement: the nearest loop within its function, the if/try/with
whose branch holds it, the calls of a function, and the `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import libcst as cst
import ddpify.match as m
from ddpify.analysis.tree import _in_orelse, dotted


class LoopsMixin:
    def enclosing_loop(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """Nearest loop around node within its own function."""
        cur = self.parent.get(node)
        while cur is not None and not isinstance(cur, (cst.FunctionDef, cst.ClassDef)):
            if isinstance(cur, (cst.For, cst.While)) and not _in_orelse(self, node, cur):
                return cur
            cur = self.parent.get(cur)
        return None

    def branch_owner(self, stmt: cst.CSTNode) -> cst.CSTNode | None:
        """The if (whole elif chain), try or with whose branch holds stmt; None elsewhere,
        and for the `if __name__ == "__main__":` guard."""
        block = self.block(stmt)
        if not isinstance(block, cst.IndentedBlock):
            return None
        owner = self.parent.get(block)
        if isinstance(owner, (cst.Else, cst.Finally, cst.ExceptHandler)):
            owner = self.parent.get(owner)
        while isinstance(owner, cst.If) and isinstance(self.parent.get(owner), cst.If):  # elif
            owner = self.parent.get(owner)
        if not isinstance(owner, (cst.If, cst.Try, cst.With)) or owner is self.main_guard:
            return None
        return owner

    def callers(self, fn: cst.FunctionDef) -> list[cst.Call]:
        out = []
        for call in self.calls:
            name = dotted(call.func)
            if name and name.rsplit(".", 1)[-1] == fn.name.value:
                if "." in name and not name.startswith(("self.", "cls.")) and self.class_of(fn) is None and not self._local_module(name):
                    continue
                out.append(call)
        return out

    def _find_main_guard(self) -> cst.If | None:
        for stmt in self.module.body:
            if isinstance(stmt, cst.If) and m.matches(
                stmt.test,
                m.Comparison(left=m.Name("__name__"), comparisons=[m.ComparisonTarget(m.Equal(), m.SimpleString())])
            ):
                return stmt
        return None
