"""A training DataLoader drawing from a subset with SubsetRandomSampler (a train/valid split by
index, often inside a DataLoader subclass) gets DistributedSubsetSampler, a generated helper: the
subset's indices shuffled alike on every rank (seed + epoch) and shared out as DistributedSampler
shares a data set, reshuffled by set_epoch. The sampler is followed to where it is made (a name, an
attribute set in the class's methods, a value returned by a method); where it may also be None
(no split), the loader gets a DistributedSampler over its data set in that case."""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import call_args, code, dotted
from ddpify.transforms.base import Context
from ddpify.transforms.batch_scale import batch_note
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP017",
    "subset-sampler",
    "SubsetRandomSampler of the training DataLoader replaced by DistributedSubsetSampler (each rank its share of the subset, set_epoch)",
    fix=True,
    check="data-sharding",
)

SUBSET = (
    "torch.utils.data.SubsetRandomSampler",
    "torch.utils.data.sampler.SubsetRandomSampler",
)


def distribute_subset(ctx: Context, ld, arg: cst.Arg, loaders) -> bool:
    """sampler= of a training loader is a SubsetRandomSampler (or None): shard it. False where
    one of its values is anything else, or is shared with another loader."""
    a = ctx.a
    values = a.values_of(arg.value)
    subsets = [v for v in values if isinstance(v, cst.Call) and a.is_call(v, *SUBSET)]
    nones = [v for v in values if isinstance(v, cst.Name) and v.value == "None"]
    if (
        not subsets
        or len(subsets) + len(nones) != len(values)
        or not all(ctx.editable(c) for c in subsets)
    ):
        return False
    for other in loaders:
        _, okw = call_args(other.call)
        if (
            other is not ld
            and "sampler" in okw
            and any(v is c for v in a.values_of(okw["sampler"].value) for c in subsets)
        ):
            return False  # the same sampler feeds an evaluation loader too
    if nones and dotted(arg.value) is None:
        return False  # the expression would be read twice
    pos, kw = call_args(ld.call)
    star = [x for x in ld.call.args if x.star == "**"]
    if nones:
        dataset = (
            code(ld.dataset)
            if ld.dataset is not None
            else (f'{code(star[0].value)}["dataset"]' if star else None)
        )
        if dataset is None:
            return False
        if "shuffle" in kw:
            shuffle = code(kw["shuffle"].value)
        elif star:
            shuffle = f'{code(star[0].value)}.get("shuffle", False)'
        else:
            shuffle = "False"
        ds = ctx.name("DistributedSampler")
        fallback = ctx.expr(
            f"{code(arg.value)} if {code(arg.value)} is not None else {ds}({dataset}, shuffle={shuffle})"
        )
        ctx.edits.replace(arg.value, fallback)
        if "shuffle" in kw:
            ctx.edits.replace(kw["shuffle"].value, cst.Name("False"))
        elif star:
            ctx.edits.replace(
                star[0].value,
                ctx.expr(f'{{**{code(star[0].value)}, "shuffle": False}}'),
            )
    for c in subsets:
        ctx.edits.replace(
            c, lambda n: n.with_changes(func=cst.Name("DistributedSubsetSampler"))
        )
        ctx.finding(
            c,
            "DDP017",
            "SubsetRandomSampler of the training DataLoader replaced by DistributedSubsetSampler: the subset's indices are "
            "shuffled alike on every rank (seed + epoch) and each rank draws its share, as many as the others; set_epoch reshuffles",
            True,
        )
    if nones:
        ctx.finding(
            ld.call,
            "DDP017",
            f"where {code(arg.value)} is None (no split), a DistributedSampler over the whole data set instead",
            True,
        )
    ctx.helpers.add("subset_sampler")
    ctx.require("torch")
    ctx.finding(ld.call, "DDP026", batch_note(ctx, ld.call), False)
    return True
