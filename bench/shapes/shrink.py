"""Shrinking: a failing combination is reduced to the simplest one that still fails the same way
(same verdict, same first failing check), by sending dimensions to their simplest variant: first
several at once (halves, quarters, ...), then one at a time, until nothing more can be simplified
(a fixed point). Names and noise stay those of the failing case (its name seed)."""

from __future__ import annotations

from typing import Callable

from grammar import DIMENSIONS, _repair, legal, simplest


def _simplify(d: dict[str, str], dims: list[str]) -> dict[str, str] | None:
    cand = dict(d)
    for k in dims:
        cand[k] = DIMENSIONS[k][0]
    if legal(cand):
        return cand
    # keep the simplified ones; send others the constraints name to their simplest
    fixed = _repair(cand, keep=dims[0]) if len(dims) == 1 else None
    if fixed is not None and all(fixed[k] == DIMENSIONS[k][0] for k in dims):
        return fixed
    # else: the simplest legal variant earlier in the list, one dimension at a time
    for k in dims:
        order = DIMENSIONS[k]
        for v in order[: order.index(d[k])]:
            c2 = dict(d, **{k: v})
            if legal(c2):
                return c2
    return None


def shrink(
    dims: dict[str, str],
    fails: Callable[[dict[str, str]], bool],
    log: Callable[[str], None] = lambda s: None,
    budget: int = 40,
) -> tuple[dict[str, str], int]:
    """(the smallest failing combination found, runs used); `fails(d)` runs one combination."""
    cur = dict(dims)
    runs = 0
    tried: set[tuple] = set()

    def attempt(cand: dict[str, str] | None) -> bool:
        nonlocal cur, runs
        if cand is None or cand == cur:
            return False
        key = tuple(sorted(cand.items()))
        if key in tried or runs >= budget:
            return False
        tried.add(key)
        runs += 1
        ok = fails(cand)
        log(
            f"  shrink {runs}: {'still fails' if ok else 'passes'} with {_diff(cur, cand)}"
        )
        if ok:
            cur = cand
        return ok

    base = simplest()
    progress = True
    while progress and runs < budget:
        progress = False
        rest = [k for k in DIMENSIONS if cur[k] != base[k]]
        size = max(1, len(rest) // 2)
        while size >= 1 and runs < budget:
            rest = [k for k in DIMENSIONS if cur[k] != base[k]]
            for i in range(0, len(rest), size):
                if attempt(_simplify(cur, rest[i : i + size])):
                    progress = True
            if size == 1:
                break
            size //= 2
    return cur, runs


def _diff(a: dict[str, str], b: dict[str, str]) -> str:
    return ", ".join(f"{k}={b[k]}" for k in DIMENSIONS if a[k] != b[k])
