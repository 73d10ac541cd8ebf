"""Small questions several lint rules ask."""

from __future__ import annotations

import re

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import code, dotted

LOCAL_SAMPLERS = (
    "torch.utils.data.RandomSampler",
    "torch.utils.data.SequentialSampler",
    "torch.utils.data.SubsetRandomSampler",
    "torch.utils.data.WeightedRandomSampler",
    "torch.utils.data.sampler.RandomSampler",
    "torch.utils.data.sampler.SequentialSampler",
    "torch.utils.data.sampler.SubsetRandomSampler",
    "torch.utils.data.sampler.WeightedRandomSampler",
    "torch.utils.data.BatchSampler",
    "torch.utils.data.sampler.BatchSampler",
)
SHARDING_NAME = re.compile(r"Distributed|Shard|Rank|Elastic|Partition", re.I)
ITERABLE = (
    "torch.utils.data.IterableDataset",
    "torch.utils.data.dataset.IterableDataset",
    "torch.utils.data.IterDataPipe",
    "datasets.IterableDataset",
)


def torch_ddp(ctx) -> bool:
    """The script distributes itself with torch.distributed (no framework does it for it)."""
    return ctx.facts.distributed and ctx.facts.framework is None


def sampler_kind(ctx, expr: cst.BaseExpression) -> str:
    """ "distributed" (splits by rank), "local" (a plain sampler), "none" or "unknown"."""
    f = ctx.facts
    kinds = set()
    for v in f.sources(expr):
        if m.matches(v, m.Name("None")):
            kinds.add("none")
            continue
        if isinstance(v, cst.Call):
            name = dotted(v.func) or ""
            qs = ctx.a.qualified(v.func)
            if (
                any(v is s for s in f.samplers)
                or SHARDING_NAME.search(name.rsplit(".", 1)[-1])
                or any(f.ranks.reads_rank(x.value) for x in v.args)
            ):
                kinds.add("distributed")
            elif qs & set(LOCAL_SAMPLERS):
                # BatchSampler(DistributedSampler(...), ...): the inner sampler decides
                inner = v.args[0].value if v.args and "BatchSampler" in name else None
                kinds.add(sampler_kind(ctx, inner) if inner is not None else "local")
            elif _own_unsharded_sampler(ctx, v):
                kinds.add("local")
            else:
                kinds.add("unknown")
        else:
            kinds.add("unknown")
    if "distributed" in kinds:
        return "distributed"
    if "unknown" in kinds:
        return "unknown"
    if "local" in kinds:
        return "local"
    return "none"


SHARDING_TEXT = re.compile(r"rank|world|replica|shard|distributed|split", re.I)


def _own_unsharded_sampler(ctx, call: cst.Call) -> bool:
    """A sampler class of the script (it subclasses Sampler) whose code never reads a rank, a
    world size or a shard, built with no argument that does: every rank draws from all of it."""
    a = ctx.a
    cls = a.classes.get((dotted(call.func) or "").rsplit(".", 1)[-1])
    if cls is None or not subclasses(ctx, cls, SAMPLERS):
        return False
    if SHARDING_TEXT.search(code(cls)):
        return False
    return not any(
        SHARDING_TEXT.search(code(x.value)) or ctx.facts.ranks.reads_rank(x.value)
        for x in call.args
    )


SAMPLERS = ("torch.utils.data.Sampler", "torch.utils.data.sampler.Sampler")


def dataset_class(ctx, expr: cst.BaseExpression) -> cst.ClassDef | None:
    for v in ctx.facts.sources(expr):
        if isinstance(v, cst.Call):
            cls = ctx.a.classes.get((dotted(v.func) or "").rsplit(".", 1)[-1])
            if cls is not None:
                return cls
    return None


def subclasses(ctx, cls: cst.ClassDef, names: tuple[str, ...], depth: int = 0) -> bool:
    for base in cls.bases:
        qs = ctx.a.qualified(base.value)
        if qs & set(names) or (dotted(base.value) or "").rsplit(".", 1)[-1] in {
            n.rsplit(".", 1)[-1] for n in names
        }:
            return True
        inner = ctx.a.classes.get((dotted(base.value) or "").rsplit(".", 1)[-1])
        if (
            inner is not None
            and inner is not cls
            and depth < 4
            and subclasses(ctx, inner, names, depth + 1)
        ):
            return True
    return False


def is_iterable_dataset(ctx, expr: cst.BaseExpression) -> bool:
    cls = dataset_class(ctx, expr)
    return cls is not None and subclasses(ctx, cls, ITERABLE)


def call_name(call: cst.Call) -> str:
    return (dotted(call.func) or "").rsplit(".", 1)[-1]
