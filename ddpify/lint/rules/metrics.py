"""Figures of one rank's shard reported as the whole: an evaluation metric, a logged loss, a
"best" value computed from the batches of a sharded loader (or of data split by the rank) and
printed, logged or saved by rank 0 without an all_reduce; and evaluation over a
DistributedSampler, which pads the last batch with duplicates that the reduced counts include."""

from __future__ import annotations

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import call_args, code, dotted
from ddpify.lint.rules.divergent_exit import _Local
from ddpify.rules import declare

declare(
    "DDP225",
    "metric-from-one-shard",
    "a figure computed from one rank's shard of the data (an evaluation metric, a loss) is printed, logged or saved by rank 0 as the whole run's, without an all_reduce",
    severity="blocking",
    tool="lint",
)
declare(
    "DDP226",
    "eval-sampler-padding",
    "evaluation over a DistributedSampler: it pads the ranks' shards with repeated samples when the data set does not divide evenly, so reduced counts include duplicates",
    tool="lint",
)

SINKS = {
    "print",
    "write",
    "writelines",
    "info",
    "warning",
    "log",
    "add_scalar",
    "add_scalars",
    "log_metrics",
    "dump",
    "save",
    "set_postfix",
}
SAMPLERS = (
    "torch.utils.data.distributed.DistributedSampler",
    "torch.utils.data.DistributedSampler",
)


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if not f.distributed or f.framework is not None:
        return
    local = None
    reported: set[int] = set()
    for c in a.calls:
        name = (dotted(c.func) or "").rsplit(".", 1)[-1]
        if name not in SINKS or f.reach.guard_kind(c) is None:
            continue
        if name == "save" and not a.is_call(c, "torch.save"):
            continue
        local = local or _Local(ctx)
        for x in c.args:
            if x.keyword is not None and x.keyword.value in ("file", "f", "flush"):
                continue
            if f.ranks.reads_rank(x.value):
                continue  # the rank itself (`print(f"rank {rank} ...")`)
            why = local.source(x.value)
            if not why:
                continue
            fn = id(a.function_of(c))
            if fn in reported:
                break
            reported.add(fn)
            evaluation = _evaluation(ctx, why)
            what = "an evaluation figure" if evaluation else "a figure"
            ctx.report(
                c,
                "DDP225",
                f"{code(c.func)}(...) reports {what} computed from {why} on one rank only, as if it were the whole run's: the other ranks' shards are left out; all_reduce its sums and counts (or gather the values) first",
                "" if evaluation else "note",
            )
            break
    for s in f.samplers:
        _, kw = call_args(s)
        if "drop_last" in kw and m.matches(kw["drop_last"].value, m.Name("True")):
            continue
        loader = next(
            (
                ld
                for ld in a.loaders
                if any(
                    v is s
                    for v in f.sources(
                        f.loader_args(ld.call).get("sampler") or cst.Name("None")
                    )
                )
            ),
            None,
        )
        if loader is None or loader.role == "train":
            continue
        if not _reduced_in_evaluation(ctx, loader):
            continue
        ctx.report(
            s,
            "DDP226",
            f"evaluation over DistributedSampler({code(s.args[0].value) if s.args else ''}...): when the data set does not divide by the world size it repeats samples to give every rank as many, so the all-reduced counts include duplicates; evaluate the remainder separately, or shard without padding",
        )


def _evaluation(ctx, why: str) -> bool:
    """The sharded source is an evaluation loader (not the training data)."""
    for ld in ctx.a.loaders:
        if ld.role != "train" and ld.target and f"batches of {ld.target}," in why:
            return True
    return False


def _reduced_in_evaluation(ctx, loader) -> bool:
    """The evaluation over this loader all-reduces (or gathers) what it counts: the counts span every rank."""
    a, f = ctx.a, ctx.facts
    if not loader.target:
        return False
    for site, _ in a.loader_iteration_sites(loader.target, a.function_of(loader.call)):
        fn = a.function_of(site)
        scope = fn if fn is not None else a.module
        for c in a.findall(scope, m.Call()):
            what = f.collective(c)
            if (
                what is not None
                and not what.startswith(
                    (
                        "the forward",
                        "dist.init_process_group",
                        "torch.distributed.init_process_group",
                    )
                )
                and "backward" not in what
                and "init_process_group" not in what
            ):
                return True
    return False
