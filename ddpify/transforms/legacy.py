"""Scripts distributed the legacy way: apex amp / apex DDP / convert_syncbn_model / apex
optimizers, and a `--local_rank` flag that only torch.distributed.launch before torch 2.0 fills.

Default target: modernised to torch-native (torch.amp autocast + GradScaler, torch DDP,
torch.nn.SyncBatchNorm, torch.optim fused Adam/AdamW/SGD), with helpers that still load
checkpoints written by apex. With --amp apex the script keeps apex and only its launch is fixed.
Both: the rank flag accepts both spellings and defaults to torchrun's LOCAL_RANK.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import Analysis, call_args, code
from ddpify.edits import Applier
from ddpify.result import Result
from ddpify.transforms.base import Context
from ddpify.transforms.legacy_apex import Modernise, _eq, _last_import, _module_name
from ddpify.transforms.legacy_devices import plan_device_aware
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare("DDP002", "legacy-local-rank-flag", "--local-rank/--local_rank accepted for the legacy launcher, read from LOCAL_RANK", fix=True, check="ranks")
declare("DDP097", "apex-extension-kept", "apex part kept that needs apex's CUDA extensions (--amp apex)")

def convert_legacy(source, analysis, ctx):
    a = analysis
    what = _describe(a)
    _fix_launch(ctx)
    if ctx.opts.amp != "apex":
        Modernise(ctx).plan()
        plan_device_aware(ctx, _module_name, _last_import)  # runs on CPU too, as a fresh conversion does
    if ctx.edits.is_empty() and a.distributed_api is not None:
        # already modern (a ddpify output included): the --local_rank flag alone is not legacy
        api = a.call_qualname(a.distributed_api) if isinstance(a.distributed_api, cst.Call) else "a distributed API"
        ctx.finding(a.distributed_api, "DDP090", f"already distributed ({api}): left unchanged", False)
        return Result(source, False, "already-distributed", sorted(set(ctx.findings)))
    ctx.finding(a.legacy_api, "DDP091", f"distributed the legacy way ({what})", False)
    if ctx.opts.amp == "apex":
        _kept_extensions(a, ctx)
    if ctx.edits.is_empty():
        return Result(source, False, "legacy", sorted(set(ctx.findings)))
    new = a.module.visit(Applier(ctx.edits)).code
    return Result(new, new != source, "converted", sorted(set(ctx.findings)))


# apex parts that import its compiled CUDA extensions (amp_C, fused_layer_norm_cuda, ...):
# a Python-only install of apex has amp and apex.parallel, not these.
NEEDS_CUDA_EXT = ("apex.optimizers.", "apex.normalization.", "apex.mlp.", "apex.fused_dense.", "apex.contrib.")


def _kept_extensions(a: Analysis, ctx) -> None:
    seen: set[str] = set()
    for c in a.calls:
        for q in a.qualified(c.func):
            if q.startswith(NEEDS_CUDA_EXT) and q not in seen:
                seen.add(q)
                ctx.finding(c, "DDP097", f"{q} kept (--amp apex): it needs apex built with its CUDA extensions; a Python-only install lacks them", False)


def _describe(a: Analysis) -> str:
    found = []
    for c in a.calls:
        for q in a.qualified(c.func):
            if q.startswith("apex.") and q not in found:
                found.append(q)
    if a._local_rank_flag() is not None:
        found.append("--local_rank flag")
    return ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")


# -- launch ---------------------------------------------------------------------------
def _fix_launch(ctx: Context) -> None:
    """`--local_rank` only: torch>=2.0's launcher passes --local-rank and torchrun passes
    nothing. Accept both spellings; the default comes from LOCAL_RANK."""
    a = ctx.a
    for call in a.calls:
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument") or not ctx.editable(call):
            continue
        pos, kw = call_args(call)
        flags = [x.value.evaluated_value for x in pos if isinstance(x.value, cst.SimpleString)]
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

        def fn(n: cst.Call, call=call, pos=pos, default=default, new_default=new_default) -> cst.Call:
            args = []
            flag_done = False
            for orig, upd in zip(call.args, n.args):
                if orig in pos and isinstance(orig.value, cst.SimpleString) and orig.value.evaluated_value in ("--local_rank", "--local-rank"):
                    if flag_done:
                        continue
                    flag_done = True
                    q = orig.value.value[0]
                    comma = upd.comma if isinstance(upd.comma, cst.Comma) else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                    args.append(upd.with_changes(value=cst.SimpleString(f"{q}--local-rank{q}"), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))))
                    args.append(upd.with_changes(value=cst.SimpleString(f"{q}--local_rank{q}"), comma=comma))
                elif orig.keyword is not None and orig.keyword.value == "default":
                    args.append(upd.with_changes(value=new_default))
                else:
                    args.append(upd)
            if default is None:
                last = args[-1]
                args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                args.append(cst.Arg(keyword=cst.Name("default"), value=new_default, equal=_eq(), comma=last.comma))
            return n.with_changes(args=args)

        ctx.edits.replace(call, fn)
        ctx.finding(call, "DDP002", "--local-rank and --local_rank both accepted (torch>=2.0's launcher passes --local-rank), default from torchrun's LOCAL_RANK", True)


