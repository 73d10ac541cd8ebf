"""The last check of every conversion: the output must not read a name where it is not defined.

A planner that places code in another scope than the one it read a name in (a loader's
`set_epoch` in a method that cannot see the function-local loader, say) would write a script that
dies with NameError on the first epoch. Python's own symbol tables (`symtable`, the compiler's
scoping rules) list every name each scope reads from the module or builtins; a name the output
reads that way, that the module never binds and the input did not already read so, is such a
mistake, and the conversion is refused rather than written (DDP005).
"""

from __future__ import annotations

import builtins
import re
import symtable

_STAR = re.compile(r"^[ \t]*from[ \t]+[\w.]+[ \t]+import[ \t]+\*", re.M)
_BUILTINS = frozenset(dir(builtins)) | {
    "__file__",
    "__name__",
    "__doc__",
    "__spec__",
    "__builtins__",
    "__loader__",
    "__package__",
    "__path__",
    "__annotations__",
}


def _module_bound(top: symtable.SymbolTable) -> set[str]:
    bound = {
        s.get_name()
        for s in top.get_symbols()
        if s.is_assigned() or s.is_imported() or s.is_namespace()
    }
    todo = list(top.get_children())
    while todo:  # `global x` then `x = ...` in a function binds a module name too
        t = todo.pop()
        todo.extend(t.get_children())
        bound |= {
            s.get_name()
            for s in t.get_symbols()
            if s.is_declared_global() and s.is_assigned()
        }
    return bound


def unbound_reads(source: str) -> tuple[set[tuple[str, str]], dict[str, int]] | None:
    """({(scope path, name)} for every name a scope reads that nothing binds, {scope path: its
    line}); None when that cannot be known (a star import, a syntax symtable rejects)."""
    try:
        top = symtable.symtable(source, "<ddpify>", "exec")
    except (SyntaxError, ValueError):
        return None
    if _STAR.search(source):  # any name may come from it
        return None
    bound = _module_bound(top) | _BUILTINS
    out: set[tuple[str, str]] = set()
    lines: dict[str, int] = {}
    todo: list[tuple[symtable.SymbolTable, str]] = [(top, "")]
    while todo:
        table, path = todo.pop()
        here = (
            f"{path}.{table.get_name()}"
            if path
            else ("" if table.get_type() == "module" else table.get_name())
        )
        lines.setdefault(here, table.get_lineno())
        for s in table.get_symbols():
            if not s.is_referenced() or s.get_name() in bound:
                continue
            if table.get_type() == "module" or s.is_global():
                out.add((here, s.get_name()))
        todo.extend((child, here) for child in table.get_children())
    return out, lines


def new_unbound_reads(before: str, after: str) -> list[tuple[str, str, int]]:
    """(scope, name, line of that scope in the input where it exists there, else 0) for every
    name the output reads unbound that the input did not."""
    old_, new_ = unbound_reads(before), unbound_reads(after)
    if old_ is None or new_ is None:
        return []
    (old, lines), (new, _) = old_, new_
    found = []
    for scope, name in sorted(new - old):
        if name in {n for (_, n) in old}:
            continue  # the input already read it unbound elsewhere: a script's own global set at run time
        found.append((scope or "<module>", name, lines.get(scope, 0)))
    return found
