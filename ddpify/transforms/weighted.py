"""A training DataLoader drawing with a WeightedRandomSampler (class rebalancing) gets the
distributed equivalent, DistributedWeightedSampler (a generated helper with the same arguments):
every rank draws its share of the weighted samples from its own indices, reshuffled each epoch
by set_epoch. Other samplers of the script's own have no general equivalent (DDP022, blocking)."""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import code
from ddpify.transforms.batch_scale import batch_note
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP018",
    "weighted-sampler",
    "WeightedRandomSampler replaced by DistributedWeightedSampler (per-rank weighted draws, set_epoch)",
    fix=True,
    check="data-sharding",
)

WEIGHTED = (
    "torch.utils.data.WeightedRandomSampler",
    "torch.utils.data.sampler.WeightedRandomSampler",
)


def weighted_sampler_call(a, value: cst.BaseExpression, scope) -> cst.Call | None:
    """The WeightedRandomSampler(...) call the loader's sampler= argument is, or is bound to."""
    if isinstance(value, cst.Name):
        values = a._local_values(scope, value.value)
        if len(values) != 1:
            return None  # rebound: not one sampler to replace
        value = values[0]
    if isinstance(value, cst.Call) and a.is_call(value, *WEIGHTED):
        return value
    return None


def distribute_weighted(ctx, ld, sampler: cst.BaseExpression) -> bool:
    a = ctx.a
    call = weighted_sampler_call(a, sampler, a.function_of(ld.stmt))
    if call is None or not ctx.editable(call):
        return False
    ctx.edits.replace(
        call, lambda n: n.with_changes(func=cst.Name("DistributedWeightedSampler"))
    )
    ctx.helpers.add("weighted_sampler")
    ctx.require("torch")
    ctx.finding(
        call,
        "DDP018",
        f"{code(call.func)} replaced by DistributedWeightedSampler: each rank draws num_samples // WORLD_SIZE by weight from its own share of the indices, reshuffled every epoch",
        True,
    )
    ctx.finding(ld.call, "DDP026", batch_note(ctx, ld.call), False)
    return True
