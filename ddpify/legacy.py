"""Scripts distributed the legacy way (apex amp / apex DDP / --local_rank-only launch)."""

from __future__ import annotations


def convert_legacy(source, analysis, ctx):
    from ddpify.pipeline import Result

    ctx.finding(analysis.legacy_api, "DDP091", "distributed the legacy way (apex / torch.distributed.launch): not converted yet", False)
    return Result(source, False, "legacy", sorted(ctx.findings))
