"""What the apex planners share: apex names and their torch-native replacements, and small
helpers to name a module and place module-level code in a script."""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import Analysis
from ddpify.transforms.base import IMPORTS, Context

# apex name -> torch-native replacement
NATIVE = {
    "apex.amp": "torch.amp",
    "apex.parallel.DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "apex.parallel.distributed.DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "apex.parallel.convert_syncbn_model": "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
    "apex.parallel.SyncBatchNorm": "torch.nn.SyncBatchNorm",
    "apex.optimizers.FusedAdam": "torch.optim.AdamW",
    "apex.optimizers.fused_adam.FusedAdam": "torch.optim.AdamW",
    "apex.optimizers.FusedSGD": "torch.optim.SGD",
    "apex.optimizers.fused_sgd.FusedSGD": "torch.optim.SGD",
}
# apex parts torch has no equivalent of: kept with torch.amp (they need apex's CUDA extensions)
NO_TORCH_EQUIVALENT = {
    "FusedLAMB": "torch has no LAMB optimizer",
    "FusedMixedPrecisionLamb": "torch has no LAMB optimizer",
    "FusedNovoGrad": "torch has no NovoGrad optimizer",
    "FusedAdagrad": "kept beside torch.amp",
}


def apex_q(a: Analysis, node: cst.CSTNode) -> str | None:
    for q in a.qualified(node):
        if q == "apex" or q.startswith("apex."):
            return q
    return None


def also_bound(a: Analysis, node: cst.CSTNode) -> bool:
    """The name (head of a dotted name) is also bound to a value somewhere in its scopes: an
    import fallback (`except ImportError: AdamImpl = torch.optim.Adam`), or a conditional one."""
    from ddpify.analysis import dotted

    d = dotted(node)
    if d is None:
        return False
    head = d.split(".")[0]
    for scope in a._scope_chain(node):
        bound = a.bindings.get(scope, {}).get(head)
        if bound:
            return "<value>" in bound
    return False


def eq() -> cst.AssignEqual:
    return cst.AssignEqual(
        whitespace_before=cst.SimpleWhitespace(""),
        whitespace_after=cst.SimpleWhitespace(""),
    )


def module_name(ctx: Context, module: str) -> str:
    """The script's name for `module` (import os), importing it if needed: by the generated
    set-up where there is one (launch.py emits its imports), else at the top of the script."""
    for name, fulls in ctx._bound.items():
        if module in fulls:
            return name
    if not ctx.legacy and module in IMPORTS:
        return ctx.name(module)
    if module not in ctx.imports_needed:
        ctx.imports_needed.append(
            module
        )  # legacy.py imports them, before the script's first import
    return module


def first_import(a: Analysis) -> cst.BaseStatement | None:
    for s in a.module.body:
        if isinstance(s, cst.SimpleStatementLine) and any(
            isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body
        ):
            return s
    return None


def last_import(a: Analysis) -> cst.BaseStatement | None:
    last = None
    for s in a.module.body:
        if isinstance(s, (cst.FunctionDef, cst.ClassDef)) or s is a.main_guard:
            break
        if isinstance(s, cst.SimpleStatementLine) and any(
            isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body
        ):
            last = s
    return last


def module_block(text: str) -> list[cst.BaseStatement]:
    """Module-level statements from text, its leading comments and blank lines kept."""
    return list(cst.parse_module("pass\n" + text).body)[1:]


def commas(args: list[cst.Arg], original) -> list[cst.Arg]:
    """Commas between arguments; the last keeps the original call's trailing layout."""
    tail = original[-1].comma if original else cst.MaybeSentinel.DEFAULT
    out = []
    for i, x in enumerate(args):
        if i < len(args) - 1:
            out.append(
                x.with_changes(
                    comma=x.comma
                    if isinstance(x.comma, cst.Comma)
                    else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                )
            )
        else:
            out.append(x.with_changes(comma=tail))
    return out
