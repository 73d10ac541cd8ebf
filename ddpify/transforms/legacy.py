"""Scripts distributed the legacy way: apex amp / apex DDP / convert_syncbn_model / apex
optimizers, and a `--local_rank` flag that only torch.distributed.launch before torch 2.0 fills.

They go through the pipeline like every script, with these planners (transforms.LEGACY) in place
of a fresh conversion's: the script keeps its own process group. Default target: modernised to
torch-native (legacy_apex.py: torch.amp autocast + GradScaler, torch DDP, SyncBatchNorm on GPUs,
torch.optim), device-aware (legacy_devices.py). With --amp apex it keeps apex. Both: the rank
flag accepts both spellings and defaults to torchrun's LOCAL_RANK, and the script's own process
group gets the generated set-up's teardown (a pause at exit for gloo's threads; the group
destroyed at the end where the script never does it).
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import Analysis, call_args, code, dotted
from ddpify.transforms.base import Context, Transform
from ddpify.transforms.apex_common import (
    eq as _eq,
    first_import,
    last_import as _last_import,
    module_block,
    module_name as _module_name,
)
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP002",
    "legacy-local-rank-flag",
    "--local-rank/--local_rank accepted for the legacy launcher, read from LOCAL_RANK",
    fix=True,
    check="ranks",
)
declare(
    "DDP097",
    "apex-extension-kept",
    "apex part kept that needs apex's CUDA extensions (a Python-only install of apex lacks them)",
)

# apex parts that import its compiled CUDA extensions (amp_C, fused_layer_norm_cuda, ...):
# a Python-only install of apex has amp and apex.parallel, not these.
NEEDS_CUDA_EXT = (
    "apex.optimizers.",
    "apex.normalization.",
    "apex.mlp.",
    "apex.fused_dense.",
    "apex.contrib.",
)
# what the generated set-up does at exit (launch.SETUP): gloo's worker threads may still free
# finished work, which needs the GIL, as Python exits; a pause before finalization lets them
PAUSE = (
    "# ddpify: gloo's threads may still free finished work (which needs the GIL) as Python exits:\n"
    "# a pause at exit, before finalization, lets them, or a rank can abort (SIGABRT)\n"
    "{atexit}.register({time}.sleep, 0.2)\n"
)


class LegacyTorchTransform(Transform):
    """torch.cuda.amp and nn.DataParallel in a legacy script, as a fresh conversion treats them."""

    name = "legacy-torch"

    def plan(self, ctx: Context) -> None:
        if ctx.opts.amp == "apex":
            return
        from ddpify.transforms.precision import PrecisionTransform
        from ddpify.transforms.wrapping import WrappingTransform

        PrecisionTransform()._modernise(ctx)  # torch.cuda.amp -> torch.amp
        # DDP already does the parallelism
        calls = [c for c in ctx.a.dataparallel_calls if ctx.editable(c)]
        WrappingTransform._replace_dataparallel(ctx, calls)


class LegacyLaunchTransform(Transform):
    """Last of the legacy planners: the rank flag, the teardown of the script's own group, what
    stays of apex (--amp apex), and the module-level code the others generated."""

    name = "legacy-launch"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        fix_launch(ctx)
        _teardown(ctx)
        if ctx.opts.amp == "apex":  # with torch.amp, legacy_apex.py says what stays
            kept_extensions(a, ctx)
        if ctx.edits.is_empty():
            return
        ctx.finding(
            a.legacy_api,
            "DDP091",
            f"distributed the legacy way ({_describe(a)})",
            False,
        )
        imports = [ctx.stmt(f"import {name}\n") for name in sorted(ctx.imports_needed)]
        if imports:
            first = first_import(a) or a.module.body[0]
            ctx.edits.before[first].extend(imports)
        block = [*ctx.preamble, *ctx.setup_extra]
        if block:
            block[0] = block[0].with_changes(
                leading_lines=[
                    cst.EmptyLine(),
                    *[ln for ln in block[0].leading_lines if ln.comment],
                ]
            )
            if (
                ctx.preamble
                and ctx.setup_extra
                and not isinstance(ctx.setup_extra[0], cst.FunctionDef)
            ):
                i = len(ctx.preamble)  # one blank line between two blocks of settings
                block[i] = block[i].with_changes(
                    leading_lines=[
                        cst.EmptyLine(),
                        *[ln for ln in block[i].leading_lines if ln.comment],
                    ]
                )
            anchor = _last_import(a)
            if anchor is None:
                ctx.edits.before[a.module.body[0]].extend(block)
                return
            ctx.edits.after[anchor].extend(block)
            body = list(a.module.body)
            nxt = (
                body[body.index(anchor) + 1]
                if body.index(anchor) + 1 < len(body)
                else None
            )
            if (
                isinstance(block[-1], cst.FunctionDef)
                and nxt is not None
                and not isinstance(nxt, (cst.FunctionDef, cst.ClassDef))
                and nxt not in ctx.edits.expr
            ):
                # two blank lines after the helper functions
                comments = [ln for ln in nxt.leading_lines if ln.comment is not None]
                ctx.edits.replace(
                    nxt,
                    lambda n: n.with_changes(
                        leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *comments]
                    ),
                )


def kept_extensions(a: Analysis, ctx: Context) -> None:
    """DDP097 for each apex part that stays and needs apex's CUDA extensions: all of them with
    --amp apex; with torch.amp, the ones torch has no equivalent of (FusedLAMB, ...)."""
    seen: set[str] = set()
    for c in a.calls:
        for q in a.qualified(c.func):
            if not q.startswith(NEEDS_CUDA_EXT) or q in seen:
                continue
            if ctx.opts.amp != "apex" and not ctx.apex_kept.get(q):
                continue
            seen.add(q)
            why = "(--amp apex)" if ctx.opts.amp == "apex" else f"({ctx.apex_kept[q]})"
            ctx.finding(
                c,
                "DDP097",
                f"{q} kept {why}: it needs apex built with its CUDA extensions; a Python-only install lacks them",
                False,
            )


def _describe(a: Analysis) -> str:
    found = []
    for c in a.calls:
        for q in a.qualified(c.func):
            if q.startswith("apex.") and q not in found:
                found.append(q)
    if a.local_rank_flag is not None:
        found.append("--local_rank flag")
    return ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")


# -- launch ---------------------------------------------------------------------------
def fix_launch(ctx: Context) -> None:
    """`--local_rank` only: torch>=2.0's launcher passes --local-rank and torchrun passes
    nothing. Accept both spellings; the default comes from LOCAL_RANK."""
    a = ctx.a
    for call in a.calls:
        if not (
            isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "add_argument"
        ) or not ctx.editable(call):
            continue
        pos, kw = call_args(call)
        flags = [
            x.value.evaluated_value
            for x in pos
            if isinstance(x.value, cst.SimpleString)
        ]
        if not {"--local_rank", "--local-rank"} & set(flags):
            continue
        default = kw.get("default")
        both = "--local_rank" in flags and "--local-rank" in flags
        env_default = default is not None and "LOCAL_RANK" in code(default.value)
        if both and env_default:
            continue
        osname = _module_name(ctx, "os")
        old = code(default.value) if default is not None else "None"
        new_default = ctx.expr(f'{osname}.environ.get("LOCAL_RANK", {old})')

        def fn(
            n: cst.Call, call=call, pos=pos, default=default, new_default=new_default
        ) -> cst.Call:
            args = []
            flag_done = False
            for orig, upd in zip(call.args, n.args):
                if (
                    orig in pos
                    and isinstance(orig.value, cst.SimpleString)
                    and orig.value.evaluated_value in ("--local_rank", "--local-rank")
                ):
                    if flag_done:
                        continue
                    flag_done = True
                    q = orig.value.value[0]
                    comma = (
                        upd.comma
                        if isinstance(upd.comma, cst.Comma)
                        else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                    )
                    args.append(
                        upd.with_changes(
                            value=cst.SimpleString(f"{q}--local-rank{q}"),
                            comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
                        )
                    )
                    args.append(
                        upd.with_changes(
                            value=cst.SimpleString(f"{q}--local_rank{q}"), comma=comma
                        )
                    )
                elif orig.keyword is not None and orig.keyword.value == "default":
                    args.append(upd.with_changes(value=new_default))
                else:
                    args.append(upd)
            if default is None:
                last = args[-1]
                args[-1] = last.with_changes(
                    comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                )
                args.append(
                    cst.Arg(
                        keyword=cst.Name("default"),
                        value=new_default,
                        equal=_eq(),
                        comma=last.comma,
                    )
                )
            return n.with_changes(args=args)

        ctx.edits.replace(call, fn)
        ctx.finding(
            call,
            "DDP002",
            "--local-rank and --local_rank both accepted (torch>=2.0's launcher passes --local-rank), default from torchrun's LOCAL_RANK",
            True,
        )


# -- teardown -------------------------------------------------------------------------
def _teardown(ctx: Context) -> None:
    """The script's own init_process_group gets the generated set-up's pause at exit (under gloo
    a rank aborted at exit without it: "terminate called without an active exception"), and
    the group is destroyed at the end where the script never destroys it."""
    a = ctx.a
    inits = [
        c
        for c in a.calls
        if a.is_call(c, "torch.distributed.init_process_group") and ctx.editable(c)
    ]
    if not inits or _pauses_at_exit(a):
        return
    for init in inits:
        stmt = a.statement(init)
        if not (
            isinstance(stmt, cst.SimpleStatementLine)
            and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)
            and stmt.body[0].value is init
            and isinstance(a.block(stmt), (cst.IndentedBlock, cst.Module))
        ):
            continue
        text = PAUSE.format(
            atexit=_module_name(ctx, "atexit"), time=_module_name(ctx, "time")
        )
        ctx.edits.after[stmt].extend(module_block(text))
        ctx.finding(
            init,
            "DDP003",
            "a pause at exit after the script's own init_process_group (the generated set-up's teardown): gloo's threads free their work before Python exits, or a rank can abort",
            True,
        )
    if any(a.is_call(c, "torch.distributed.destroy_process_group") for c in a.calls):
        return
    init = inits[0]
    mod = (
        code(init.func.value)
        if isinstance(init.func, cst.Attribute)
        else f"{_module_name(ctx, 'torch')}.distributed"
    )
    destroy = ctx.stmt(
        f"if {mod}.is_initialized():\n    {mod}.destroy_process_group()\n"
    )
    guard = a.main_guard
    if guard is not None and isinstance(guard.body, cst.IndentedBlock):
        ctx.edits.append[guard].append(destroy)
        where = guard
    else:
        where = a.module.body[-1]
        ctx.edits.after[where].append(
            destroy.with_changes(leading_lines=[cst.EmptyLine()])
        )
    ctx.finding(
        where,
        "DDP003",
        "process group destroyed when training ends (the script never destroyed it)",
        True,
    )


def _pauses_at_exit(a: Analysis) -> bool:
    """The script (a ddpify output among them) already registers a sleep at exit."""
    for c in a.calls:
        if (
            a.is_call(c, "atexit.register")
            and c.args
            and dotted(c.args[0].value) in ("time.sleep", "sleep")
        ):
            return True
    return False
