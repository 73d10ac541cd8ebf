"""An IterableDataset that every rank iterates whole: a DataLoader takes no sampler for it, so
it must split the stream by rank itself."""

from __future__ import annotations

import re

import libcst as cst

import ddpify.match as m
from ddpify.lint.rules.common import dataset_class, is_iterable_dataset, torch_ddp
from ddpify.rules import declare

declare(
    "DDP202",
    "iterable-dataset-ignores-rank",
    "an IterableDataset used for training never reads the rank: every rank yields the same stream",
    severity="blocking",
    tool="lint",
)

RANK_AWARE = re.compile(
    r"rank|world_size|get_worker_info|split_dataset_by_node|num_replicas|num_shards|shard_id",
    re.I,
)


def check(ctx) -> None:
    if not torch_ddp(ctx):
        return
    f = ctx.facts
    for ld in ctx.a.loaders:
        if ld.role != "train":
            continue
        dataset = f.loader_args(ld.call).get("dataset")
        if dataset is None or not is_iterable_dataset(ctx, dataset):
            continue
        cls = dataset_class(ctx, dataset)
        if (
            cls is None
            or _rank_aware(ctx, cls)
            or any(f.ranks.reads_rank(v) for v in f.sources(dataset))
        ):
            continue
        ctx.report(
            ld.call,
            "DDP202",
            f"{cls.name.value} is an IterableDataset that never reads the rank: a DataLoader takes no sampler for it, so every rank yields the same stream and trains on the same batches; split it in __iter__ (e.g. itertools.islice(stream, rank, None, world_size))",
        )


def _rank_aware(ctx, cls: cst.ClassDef) -> bool:
    """The class (or a method of the script it calls) reads the rank, the world size or the worker."""
    for node in ctx.a.findall(cls, m.Name() | m.Attribute()):
        text = node.value if isinstance(node, cst.Name) else node.attr.value
        if RANK_AWARE.search(text):
            return True
    return False
