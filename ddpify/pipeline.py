"""convert_source: parse once, analyse once, let each concern plan its edits, apply them in one pass."""

from __future__ import annotations

import gc

import libcst as cst

from ddpify.analysis import Analysis, codegen
from ddpify.edits import Applier
from ddpify.findings import Finding
from ddpify.options import Options
from ddpify.result import ConversionError, Result
from ddpify.transforms import PIPELINE
from ddpify.transforms.base import Context
from ddpify.transforms.legacy import convert_legacy  # the apex / torch.distributed.launch path

__all__ = ["ConversionError", "Result", "convert_source", "parse"]


def parse(source: str) -> cst.Module:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else "syntax error"
        raise ConversionError(f"cannot parse: {msg}", e.raw_line, e.raw_column + 1) from None
    except RecursionError:
        raise ConversionError("cannot parse: nesting too deep") from None


def convert_source(source: str, options: Options | None = None, path: str = "<stdin>") -> Result:
    # Reference counting frees every tree here (the plan's closures, the one cycle, are dropped
    # below): the cycle collector, which a parse sets off every 700 new nodes, would only walk
    # the young nodes to find nothing (~5% of the time).
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _convert_source(source, options or Options())
    finally:
        if enabled:
            gc.enable()


def _convert_source(source: str, options: Options) -> Result:
    module = parse(source)
    if not any(word in source for word in ("backward", "distributed", "apex", "local_rank", "local-rank")):
        # no backward() and nothing distributed: not a training script, and the analysis
        # (most of the time of a pre-commit run over ordinary files) is not needed to say so
        finding = Finding(1, 1, "DDP099", "no backward() call: not a training script, nothing to convert", False)
        return Result(source, False, "not-training", [finding])
    analysis = Analysis(module, source)
    ctx = Context(analysis, options)
    ctx.edits.parent = analysis.parent  # lets the Applier skip subtrees without edits
    try:
        return _convert(source, analysis, ctx)
    finally:
        ctx.edits.clear()  # the tree goes with the last reference, not at the next full GC


def _convert(source: str, analysis: Analysis, ctx: Context) -> Result:
    if analysis.legacy_api is not None:
        return convert_legacy(source, analysis, ctx)
    if analysis.distributed_api is not None:
        what = analysis.call_qualname(analysis.distributed_api) if isinstance(analysis.distributed_api, cst.Call) else "a distributed API"
        ctx.finding(analysis.distributed_api, "DDP090", f"already distributed ({what}): left unchanged", False)
        return Result(source, False, "already-distributed", sorted(ctx.findings))
    if not analysis.steps:
        ctx.finding(None, "DDP099", "no backward() call: not a training script, nothing to convert", False)
        return Result(source, False, "not-training", sorted(ctx.findings))
    for transform in PIPELINE:
        transform().plan(ctx)
    if ctx.edits.is_empty():
        return Result(source, False, "converted", sorted(ctx.findings))
    converted = Applier(ctx.edits).apply(analysis.module)
    new = codegen(converted, converted)
    return Result(new, new != source, "converted", sorted(set(ctx.findings)))
