"""Names: what a dotted name means through the imports and bindings in scope (`F.relu` ->
torch.nn.functional.relu), which function-like scopes enclose a node, whether a call calls a
given API, whether a name is a local of a function, and the name a value is assigned to.
"""

from __future__ import annotations

import libcst as cst
from ddpify.analysis.tree import _SCOPE_TYPES, SCOPES, _leaf_types, dotted

_MODULE_ONLY = {None}
_MODULE_CHAIN: list[int | None] = [None]


class NamesMixin:
    def qualified(self, node: cst.CSTNode) -> set[str]:
        """Full dotted name of a name or attribute chain, through the imports in scope:
        `F.relu` -> torch.nn.functional.relu after `import torch.nn.functional as F`."""
        cached = self._qcache.get(id(node))
        if cached is not None:
            return cached
        names: set[str] = set()
        d = dotted(node)
        if d is not None:
            head, _, rest = d.partition(".")
            binders = (
                self._binders.get(head)
                if self._binders is not None
                else self._index_binders().get(head)
            )
            # a name no scope binds is itself; one only the module binds needs no scope walk
            chain = (
                ()
                if binders is None
                else (None,)
                if binders == _MODULE_ONLY
                else self._scope_chain(node)
            )
            for scope in chain:
                bound = self.bindings.get(scope, {}).get(head)
                if bound:
                    names = {
                        f"{b}.{rest}" if rest else b for b in bound if b != "<value>"
                    } or {d}
                    break
            else:
                names = {d}
        self._qcache[id(node)] = names
        return names

    def _index_binders(self) -> dict[str, set[int | None]]:
        binders: dict[str, set[int | None]] = {}
        for scope, names in self.bindings.items():
            for name in names:
                binders.setdefault(name, set()).add(scope)
        self._binders = binders
        return binders

    def _scope_chain(self, node: cst.CSTNode) -> list[int | None]:
        """Enclosing function-like scopes, innermost first, then the module (class bodies are
        not visible from their methods, as in Python). Shared by the nodes of a scope."""
        parent = self.parent
        cur = parent.get(node)
        if _leaf_types(
            SCOPES + (cst.ClassDef,)
        ):  # exact types: no isinstance on LibCST's ABCs
            while cur is not None and type(cur) not in _SCOPE_TYPES:
                cur = parent.get(cur)
        else:
            while cur is not None and not isinstance(cur, (*SCOPES, cst.ClassDef)):
                cur = parent.get(cur)
        if cur is None:
            return _MODULE_CHAIN
        chain = self._chains.get(id(cur))
        if chain is None:
            chain = self._chains[id(cur)] = []
            inner, first = cur, True
            while inner is not None:
                if isinstance(inner, SCOPES) or (
                    first and isinstance(inner, cst.ClassDef)
                ):
                    chain.append(id(inner))
                    if isinstance(inner, cst.FunctionDef | cst.Lambda):
                        first = False
                inner = parent.get(inner)
            chain.append(None)
        return chain

    def is_call(self, call: cst.CSTNode, *names: str) -> bool:
        if type(call) is not cst.Call and not isinstance(call, cst.Call):
            return False
        qs = self._qcache.get(id(call.func))  # hot: the transforms ask it of every call
        if qs is None:
            qs = self.qualified(call.func)  # type: ignore[attr-defined]
        return not qs.isdisjoint(names)

    def call_qualname(self, call: cst.Call) -> str:
        qs = sorted(self.qualified(call.func))
        return qs[0] if qs else (dotted(call.func) or "")

    def _is_local(self, fn: cst.FunctionDef, name: str) -> bool:
        return name in self.bindings.get(id(fn), {})

    def _assign_target(self, node: cst.CSTNode) -> str | None:
        par = self.parent.get(node)
        if isinstance(par, (cst.Assign,)) and len(par.targets) == 1:
            return dotted(par.targets[0].target)
        if isinstance(par, cst.AnnAssign):
            return dotted(par.target)
        return None
