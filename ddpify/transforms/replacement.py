"""A training DataLoader drawing with RandomSampler(replacement=True): draws with replacement
are independent, so each rank drawing its own num_samples // WORLD_SIZE with a generator of its
own (seeded from a draw with RANK added) is together one draw of num_samples, and every rank gets as many
batches. Without replacement (a permutation) there is no such equivalent: DistributedSampler."""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import call_args, code
from ddpify.transforms.base import Context, append_kwarg
from ddpify.transforms.batch_scale import batch_note
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP113",
    "replacement-sampler",
    "RandomSampler drawing with replacement: each rank draws num_samples // WORLD_SIZE with a generator of its own",
    fix=True,
    check="data-sharding",
)

RANDOM = ("torch.utils.data.RandomSampler", "torch.utils.data.sampler.RandomSampler")


def replacement_sampler_call(a, value: cst.BaseExpression, scope) -> cst.Call | None:
    """The RandomSampler(..., replacement=True, ...) call the loader's sampler= is, or is bound to."""
    if isinstance(value, cst.Name):
        values = a._local_values(scope, value.value)
        if len(values) != 1:
            return None
        value = values[0]
    if not (isinstance(value, cst.Call) and a.is_call(value, *RANDOM)):
        return None
    pos, kw = call_args(value)
    flag = (
        kw["replacement"].value
        if "replacement" in kw
        else pos[1].value
        if len(pos) > 1
        else None
    )
    if (
        not m.matches(flag, m.Name("True"))
        or "generator" in kw
        or len(pos) > 2
        or any(x.star for x in value.args)
    ):
        return None
    return value


def distribute_replacement(ctx: Context, ld, sampler: cst.BaseExpression) -> bool:
    a = ctx.a
    call = replacement_sampler_call(a, sampler, a.function_of(ld.stmt))
    if call is None or not ctx.editable(call):
        return False
    torch = ctx.name("torch")
    pos, kw = call_args(call)
    data = code(kw["data_source"].value if "data_source" in kw else pos[0].value)
    total = code(kw["num_samples"].value) if "num_samples" in kw else f"len({data})"

    def fn(node: cst.Call) -> cst.Call:
        args = [
            x for x, o in zip(node.args, call.args) if o is not kw.get("num_samples")
        ]
        if args:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        node = node.with_changes(args=args)
        node = append_kwarg(node, "num_samples", ctx.expr(f"{total} // WORLD_SIZE"))
        return append_kwarg(
            node,
            "generator",
            ctx.expr(
                f"{torch}.Generator().manual_seed(int({torch}.randint(2**62, ())) + RANK)"
            ),
        )

    ctx.edits.replace(call, fn)
    ctx.finding(
        call,
        "DDP113",
        "RandomSampler draws with replacement: each rank draws num_samples // WORLD_SIZE with a generator of its own (seeded from a draw with RANK added: a loader built again draws anew), together one draw of num_samples; every rank gets as many batches",
        True,
    )
    ctx.finding(ld.call, "DDP026", batch_note(ctx, ld.call), False)
    return True
