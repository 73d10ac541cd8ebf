"""Training data on every rank: a training DataLoader with no DistributedSampler (every rank
trains on the whole data set, in the same order), and shuffle=True beside a sampler."""

from __future__ import annotations

import ddpify.match as m
from ddpify.analysis.tree import dotted
from ddpify.lint.rules.common import is_iterable_dataset, sampler_kind, torch_ddp
from ddpify.rules import declare

declare(
    "DDP200",
    "train-loader-not-sharded",
    "a training DataLoader without a DistributedSampler: every rank trains on the whole data set (each epoch costs world-size times more, and the ranks see the same batches)",
    severity="blocking",
    tool="lint",
)
declare(
    "DDP201",
    "sampler-with-shuffle",
    "shuffle=True beside a sampler: DataLoader raises ValueError (sampler option is mutually exclusive with shuffle); the sampler shuffles",
    severity="blocking",
    tool="lint",
)


def check(ctx) -> None:
    f = ctx.facts
    if not torch_ddp(ctx):
        return
    for ld in ctx.a.loaders:
        args = f.loader_args(ld.call)
        sampler = (
            args.get("sampler")
            if args.get("sampler") is not None
            and not m.matches(args.get("sampler"), m.Name("None"))
            else None
        )
        batch_sampler = args.get("batch_sampler")
        shuffle = args.get("shuffle")
        if (
            sampler is not None
            and shuffle is not None
            and any(m.matches(v, m.Name("True")) for v in f.sources(shuffle))
        ):
            if sampler_kind(ctx, sampler) != "none":
                direct = any(
                    x.keyword is not None
                    and x.keyword.value == "shuffle"
                    and x.value is shuffle
                    for x in ld.call.args
                )
                ctx.report(
                    shuffle if direct else ld.call,
                    "DDP201",
                    f'shuffle=True beside sampler={dotted(sampler) or "a sampler"}: DataLoader raises "sampler option is mutually exclusive with shuffle"; drop shuffle (DistributedSampler shuffles, shuffle=True by default)',
                )
        if ld.role != "train":
            continue
        dataset = args.get("dataset")
        if dataset is not None and (
            is_iterable_dataset(ctx, dataset)
            or any(f.ranks.reads_rank(v) for v in f.sources(dataset))
            or f.rank_derived(dataset)
        ):
            continue  # an IterableDataset (DDP202) or a data set split by rank by hand
        kinds = {
            sampler_kind(ctx, s)
            for s in ([sampler] if sampler is not None else [])
            + ([batch_sampler] if batch_sampler is not None else [])
        }
        if "distributed" in kinds or "unknown" in kinds:
            continue
        what = (
            "no sampler"
            if not kinds or kinds == {"none"}
            else "a sampler that does not split the data by rank"
        )
        ctx.report(
            ld.call,
            "DDP200",
            f"training DataLoader with {what}: every rank iterates the whole data set, so an epoch costs world-size times more and the ranks see the same samples; pass sampler=DistributedSampler(dataset) (and call sampler.set_epoch(epoch) each epoch)",
        )
