"""every caller: code the conversion changes inside a helper stays right for each call of that
helper. A `set_epoch` call reaches the sampler of whatever each caller hands in: a shared
`cycle(loader)` or `run_epoch(loader)` that both the training and the evaluation loader go
through must not call `loader.sampler.set_epoch` on a loader without a distributed sampler
(AttributeError on the first evaluation), unless the call checks the sampler's type when it runs."""

from __future__ import annotations

import ast

from ddpify.gate.program import Program
from ddpify.gate.common import Violation
from ddpify.gate.shards import is_loader, sharded
from ddpify.rules import declare

declare(
    "DDP154",
    "invariant-every-caller",
    "a helper the conversion changes would fail for one of its callers: not converted",
    severity="blocking",
    tool="gate",
)


def _checked(p: Program, call: ast.Call) -> bool:
    """The set_epoch runs only where the sampler has it (isinstance/hasattr/getattr tests)."""
    for anc in p.ancestors(call):
        if isinstance(anc, (ast.If, ast.IfExp)):
            test = ast.unparse(anc.test)
            if ("isinstance" in test and "Sampler" in test) or "set_epoch" in test:
                return True
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
            break
    return False


def check(p: Program) -> list[Violation]:
    out: list[Violation] = []
    for call in p.calls:
        if p.last(call) != "set_epoch" or not isinstance(call.func, ast.Attribute):
            continue
        holder = call.func.value
        if isinstance(holder, ast.Attribute) and holder.attr == "sampler":
            holder = holder.value
        elif isinstance(holder, ast.Attribute) and holder.attr == "batch_sampler":
            holder = holder.value
        else:
            continue
        if _checked(p, call):
            continue
        for o in p.origins(holder):
            if (
                o.path
                or not isinstance(o.node, ast.Call)
                or not is_loader(p, o.node)
                or sharded(p, o.node)
            ):
                continue
            out.append(
                Violation(
                    call,
                    "DDP154",
                    f"every caller: `{ast.unparse(call.func)}(...)` would also run on the "
                    f"loader built at line {o.node.lineno}, which has no distributed sampler "
                    "(AttributeError when that call runs)",
                )
            )
            break
    return out
