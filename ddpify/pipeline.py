"""convert_source: parse once, analyse once, let each concern plan its edits, apply them in one pass."""

from __future__ import annotations

import gc

import libcst as cst

from ddpify import gate, names
from ddpify.analysis import Analysis, codegen
from ddpify.edits import Applier
from ddpify.directives import ignored_codes, unknown_directives
from ddpify.findings import Finding
from ddpify.formatting import fit_lines
from ddpify.options import Options
from ddpify.partial import mark_unresolved
from ddpify.result import ConversionError, Result
from ddpify.transforms import LEGACY, OPTIMIZE, PIPELINE, LaunchTransform
from ddpify.transforms.base import Concern
from ddpify.transforms.base import Context
from ddpify.undefined import new_unbound_reads
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP004",
    "generated-name-clash",
    "a name ddpify generates is the script's own: ddpify's gets a free name (DDP_RANK, ...)",
    fix=True,
    check="ranks",
)
declare(
    "DDP005",
    "undefined-name",
    "the conversion would read a name where it is not defined (a ddpify limitation): convert that part by hand",
    severity="blocking",
)
declare("DDP090", "already-distributed", "already distributed: left unchanged")
declare(
    "DDP091",
    "legacy-distributed",
    "distributed the legacy way (apex / torch.distributed.launch)",
)
declare("DDP099", "not-training", "not a training script: nothing to convert")

__all__ = ["ConversionError", "Result", "convert_source", "parse"]
# words that may name a framework that distributes (analysis/apis.py), for the quick text test
FRAMEWORKS = ("accelerate", "lightning", "Fabric", "deepspeed", "horovod")


def parse(source: str) -> cst.Module:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else "syntax error"
        raise ConversionError(
            f"cannot parse: {msg}", e.raw_line, e.raw_column + 1
        ) from None
    except RecursionError:
        raise ConversionError("cannot parse: nesting too deep") from None


def convert_source(
    source: str, options: Options | None = None, path: str = "<stdin>"
) -> Result:
    # Reference counting frees every tree here (the plan's closures, the one cycle, are dropped
    # below): the cycle collector, which a parse sets off every 700 new nodes, would only walk
    # the young nodes to find nothing (~5% of the time).
    enabled = gc.isenabled()
    gc.disable()
    options = options or Options()
    try:
        result = _convert_source(source, options, path)
    finally:
        if enabled:
            gc.enable()
    result = _apply_policy(source, result, options)
    if (
        "ddpify:" in source
    ):  # a typo in a directive, reported whatever became of the file
        result.findings = sorted(
            result.findings
            + [f for f in unknown_directives(source) if f.code not in options.ignore]
        )
    if (
        result.changed
        and options.partial
        and options.mark_unresolved
        and result.blocking
    ):
        result.source = mark_unresolved(
            source, result.source, result.blocking
        )  # the draft raises there
    if result.changed and options.line_length:
        result.source = fit_lines(source, result.source, options.line_length)
    return result


def _apply_policy(source: str, result: Result, options: Options) -> Result:
    """Drop suppressed findings; refuse (keep the source as it was) while a blocking one remains."""
    marks = ignored_codes(source)
    if marks or options.ignore:

        def kept(f: Finding) -> bool:
            if f.code in options.ignore:
                return False
            codes = marks.get(f.line, frozenset())
            return not (codes is None or f.code in codes)

        result.findings = [f for f in result.findings if kept(f)]
    if result.blocking and not options.partial:
        # A wrong script is worse than none: nothing is written while a blocking finding remains.
        # The notes describe a conversion that did not happen: only what blocks it is reported.
        return Result(source, False, "refused", result.blocking)
    return result


def _convert_source(source: str, options: Options, path: str = "<stdin>") -> Result:
    module = parse(source)
    if not any(
        word in source
        for word in (
            "backward",
            "distributed",
            "apex",
            "local_rank",
            "local-rank",
            *FRAMEWORKS,
        )
    ):
        # no backward() and nothing distributed: not a training script, and the analysis
        # (most of the time of a pre-commit run over ordinary files) is not needed to say so
        finding = Finding(
            1,
            1,
            "DDP099",
            "no backward() call: not a training script, nothing to convert",
            False,
        )
        return Result(source, False, "not-training", [finding])
    analysis = Analysis(module, source)
    clash = names.clashes(analysis, source)
    if clash:
        return _convert_renamed(source, analysis, clash, options, path)
    return _convert_module(source, analysis, options, path)


def _convert_renamed(
    source: str,
    original: Analysis,
    clash: dict[str, cst.Name],
    options: Options,
    path: str,
) -> Result:
    """The script uses names ddpify generates: convert it with its names set aside, then give
    ddpify's names free spellings and the script its own back (see ddpify/names.py)."""
    hidden = names.placeholders(list(clash), source)
    renamed = names.rename(original.module, hidden)
    text = codegen(renamed, renamed)
    res = _convert_module(text, Analysis(parse(text), text), options, path)
    back = {p: n for n, p in hidden.items()}
    findings = [
        Finding(f.line, f.col, f.code, names.unplace(f.message, back), f.fixed)
        for f in res.findings
    ]
    if not res.changed:
        return Result(source, False, res.status, findings)
    free = names.free_names(list(clash), source)
    restored = names.rename(parse(res.source), {**free, **back})
    out = codegen(restored, restored)
    for name, node in clash.items():
        line, col = original.line_col(node)
        findings.append(
            Finding(
                line,
                col,
                "DDP004",
                f"the script uses the name {name}: ddpify's own {name} is named {free[name]} here",
                True,
            )
        )
    return Result(out, out != source, res.status, sorted(set(findings)))


def _convert_module(
    source: str, analysis: Analysis, options: Options, path: str = "<stdin>"
) -> Result:
    ctx = Context(analysis, options)
    ctx.path = path  # --optimize reads model classes from modules beside the script
    ctx.edits.parent = analysis.parent  # lets the Applier skip subtrees without edits
    try:
        return _convert(source, analysis, ctx)
    finally:
        ctx.edits.clear()  # the tree goes with the last reference, not at the next full GC


def _convert(source: str, analysis: Analysis, ctx: Context) -> Result:
    a = analysis
    if a.distributed_api is not None:
        # A --local_rank flag alone does not make a script legacy when it is distributed with
        # today's APIs and its process group is set up elsewhere (DINO: DDP here,
        # init_process_group in a helper module; in project mode, in another file): it is left
        # as it is. apex, or a torch.distributed.launch script that sets up its group here, is
        # modernised by the legacy planners and goes through the same last checks.
        group = a._find_api(("torch.distributed.init_process_group",))
        flag_only = (
            a.apex_api is None
            and a.local_rank_flag is not None
            and (
                group is None
                or (
                    a.several_files()
                    and a.region_of(group) != a.region_of(a.local_rank_flag)
                )
            )
        )
        if a.legacy_api is not None and not flag_only:
            result = _run(source, a, ctx, LEGACY)
            if result.changed:
                return result
        what = (
            a.call_qualname(a.distributed_api)
            if isinstance(a.distributed_api, cst.Call)
            else "a distributed API"
        )
        # nothing was changed: only what stays (apex parts that need its extensions) or blocks is said
        ctx.findings = [f for f in ctx.findings if f.code == "DDP097" or f.blocking]
        ctx.finding(
            a.distributed_api,
            "DDP090",
            f"already distributed ({what}): left unchanged",
            False,
        )
        # ddpify's own flag reads LOCAL_RANK; DeepSpeed's launcher fills --local_rank itself
        if (
            flag_only
            and "LOCAL_RANK" not in codegen(a.local_rank_flag)
            and what.startswith("torch.")
        ):
            ctx.finding(
                a.local_rank_flag,
                "DDP091",
                '--local_rank is filled only by the deprecated torch.distributed.launch (as --local-rank since torch 2.0): under torchrun read os.environ["LOCAL_RANK"]',
                False,
            )
        return Result(source, False, "already-distributed", sorted(set(ctx.findings)))
    if not a.steps:
        ctx.finding(
            None,
            "DDP099",
            "no backward() call: not a training script, nothing to convert",
            False,
        )
        return Result(source, False, "not-training", sorted(ctx.findings))
    return _run(source, a, ctx, PIPELINE)


def _run(source: str, analysis: Analysis, ctx: Context, planners) -> Result:
    """Every path: the planners record edits on the one analysed tree, one pass applies them,
    and every output gets the same last check (DDP005)."""
    ctx.legacy = planners is LEGACY
    order: list = []
    for transform in planners:
        if transform is LaunchTransform and ctx.opts.optimize:
            order += (
                OPTIMIZE  # opt-in speed-ups, after the wrap and before launch's imports
            )
        order.append(transform)
    concerns = [t() for t in order]
    # every two-step concern decides first, so each emit can read any plan
    for concern in concerns:
        if isinstance(concern, Concern):
            concern.run_decide(ctx)
    for concern in concerns:
        concern.plan(ctx)
    if ctx.edits.is_empty():
        return Result(source, False, "converted", sorted(set(ctx.findings)))
    converted = Applier(ctx.edits).apply(analysis.module)
    new = codegen(converted, converted)
    findings = sorted(set(ctx.findings)) + undefined_findings(source, new)
    # the invariant gate reads the converted program itself, not the planners' reasons
    # a refusal already says what blocks it; a legacy script keeps its own group and guards
    if not ctx.legacy and not any(f.blocking for f in findings):
        findings += gate.check(source, new, ctx.path, {f.code for f in findings})
    return Result(new, new != source, "converted", findings)


def undefined_findings(source: str, new: str) -> list[Finding]:
    """DDP005 for each name the output reads where it is not defined (and the input did not)."""
    out = []
    for scope, name, line in new_unbound_reads(source, new):
        # a planner placed code where a name it reads is not visible: NameError when it runs
        where = "at module level" if scope == "<module>" else f"in {scope}"
        text = (
            source.splitlines()[line - 1] if 0 < line <= source.count("\n") + 1 else ""
        )
        col = len(text) - len(text.lstrip()) + 1
        out.append(
            Finding(
                line or 1,
                col,
                "DDP005",
                f"the conversion would read {name} {where}, where it is not defined "
                f"(a ddpify limitation): convert this part by hand",
                False,
            )
        )
    return out
