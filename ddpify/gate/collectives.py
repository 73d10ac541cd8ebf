"""no collective on one rank: nothing that every rank must reach together runs under a test that
holds on rank 0 alone. A collective is a call of torch.distributed that communicates, a forward
through a DDP wrapper, a backward (DDP all-reduces the gradients there) and an optimizer step
(each optimizer's first step compares gradients across ranks), itself or through the program's
functions. Rank 0 would wait in it for the others until the timeout: a print whose argument
trains, `if RANK == 0: evaluate(ddp_model)`, a barrier under the guard."""

from __future__ import annotations

import ast

from ddpify.gate.common import Violation, _test_rank0, rank_names
from ddpify.gate.program import Program
from ddpify.gate.sync import is_ddp
from ddpify.rules import declare

declare(
    "DDP157",
    "invariant-no-collective-on-rank0",
    "the output would run a collective (a DDP forward, a backward, "
    "a step, a torch.distributed call) on rank 0 alone, where it waits for the other ranks forever: not converted",
    severity="blocking",
    tool="gate",
)

COMMUNICATES = frozenset(
    {
        "all_reduce",
        "broadcast",
        "barrier",
        "all_gather",
        "all_gather_into_tensor",
        "reduce",
        "gather",
        "scatter",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "all_to_all",
        "broadcast_object_list",
        "all_gather_object",
        "gather_object",
        "scatter_object_list",
        "monitored_barrier",
        "send",
        "recv",
    }
)


class _Collectives:
    def __init__(self, p: Program) -> None:
        self.p = p
        self.cache: dict[int, ast.Call | None] = {}
        self.wrappers = {
            p.unparse(t)
            for c in p.calls
            if is_ddp(p, c)
            for t in getattr(p.parent.get(c), "targets", [])
        }

    def direct(self, call: ast.Call) -> bool:
        p = self.p
        name = p.call_name(call)
        last = p.last(call)
        if name.startswith("torch.distributed.") and last in COMMUNICATES:
            return True
        if (
            isinstance(call.func, ast.Attribute)
            and last in ("backward", "step")
            and not call.args
        ):
            return True
        return p.unparse(call.func) in self.wrappers

    def first(self, node: ast.AST, depth: int = 0) -> ast.Call | None:
        """The first call in node that is, or leads to, a collective."""
        key = id(node)
        if key in self.cache:
            return self.cache[key]
        self.cache[key] = None
        found = None
        for sub in self.p.calls_in(node):
            if self.direct(sub):
                found = sub
                break
            if depth < 6 and any(
                self.first(f, depth + 1) is not None
                for f in self.p.callees(sub)
                if f is not node
            ):
                found = sub
                break
        self.cache[key] = found
        return found


def _branches(node: ast.If, ranks: set[str]) -> list[tuple[bool, list[ast.stmt]]]:
    """(runs on rank 0 alone?, statements) for each branch of a rank test."""
    verdict = _test_rank0(node.test, ranks)
    if verdict is None:
        return []
    return [(verdict, node.body), (not verdict, node.orelse)]


def _paired(
    p: Program, guard: ast.If, zero: bool, hit: ast.Call, ranks: set[str]
) -> bool:
    """The other ranks reach the same collective in the opposite branch, or under the opposite
    test in the same block (rank 0 prepares data between `if RANK != 0: dist.barrier()` and
    `if RANK == 0: dist.barrier()`): every rank calls it once."""
    par = p.parent.get(guard)
    what = ast.unparse(hit.func)
    siblings = [guard]
    for field in ("body", "orelse", "finalbody"):
        block = getattr(par, field, None)
        if isinstance(block, list) and guard in block:
            siblings = [s for s in block if isinstance(s, ast.If)]
    for other in siblings:
        for theirs, stmts in _branches(other, ranks):
            if theirs != zero and any(
                p.unparse(c.func) == what for s in stmts for c in p.calls_in(s)
            ):
                return True
    return False


def check(p: Program) -> list[Violation]:
    ranks = rank_names(p)
    coll = _Collectives(p)
    out: list[Violation] = []
    for node in p.walk(p.tree):
        if not isinstance(node, ast.If):
            continue
        fn = p.function_of(node)
        if fn is not None and fn.name in (
            "ddp_setup",
            "rank0_value",
            "rank0_seed",
            "rank0_decides",
            "rank_batches",
        ):
            continue
        for zero, stmts in _branches(node, ranks):
            hit = next(
                (h for h in (coll.first(s) for s in stmts) if h is not None), None
            )
            if hit is not None and not _paired(p, node, zero, hit, ranks):
                out.append(
                    Violation(
                        hit,
                        "DDP157",
                        f"no collective on one rank: `{ast.unparse(hit.func)}(...)` runs "
                        "under a test that holds on some ranks only, and the others never reach it, so "
                        "those ranks would wait for them until the timeout",
                    )
                )
                break
    return out
