"""What the torchrun run does not show by itself: the converted script as a plain `python`
process, a world of one (`one-process`); the project's other entry scripts that import a module
the conversion changed (`other-scripts`); and, on a CPU run, what a GPU run executes that this
one replaced or skipped (`gpu-paths`: kernels a compiler such as triton builds only on a GPU,
CUDA-only imports and branches)."""

from __future__ import annotations

import ast
import os
import re

from ddpify.verify.checks.common import (
    FAIL,
    INFO,
    PASS,
    Check,
    Context,
    plural,
    user_line,
)


def _argv(ctx: Context) -> str:
    name = os.path.basename(ctx.sources.user_file(ctx.exec_path))
    args = " ".join(ctx.args)
    return f"python {name}" + (f" {args}" if args else "")


def check_one_process(ctx: Context) -> Check | None:
    run = ctx.single
    if run is None:
        return None
    rec = run.records.get(0) or {}
    status = rec.get("status")
    cmd = f"`{_argv(ctx)}`"
    steps = rec.get("steps") or 0
    if not run.hang and status in ("stopped", "finished"):
        end = "to its end" if status == "finished" else "until verify stopped it"
        return Check(
            "one-process",
            PASS,
            f"as {cmd}, a world of one with no launcher: {plural(steps, 'step')}, {end}",
        )
    cand_ok = (
        all(
            (ctx.candidate.records.get(r) or {}).get("status")
            in ("stopped", "finished")
            for r in range(ctx.nproc)
        )
        and not ctx.candidate.hang
    )
    only = (
        "the converted script runs under torchrun but not as a plain python process, which it must (a world of one)"
        if cand_ok
        else "the converted script fails as a plain python process too (see ranks for the torchrun run)"
    )
    if run.hang:
        stack = next(iter(run.hang.get("stacks", {}).values()), "")
        at = user_line(ctx, stack)
        figure = f"as {cmd}: no progress for {run.hang['timeout']:g} s after {plural(steps, 'step')}"
        cause = (
            f"{only}: it waits"
            + (f" at {at}" if at else "")
            + " (a collective with no other rank to meet)"
        )
        return Check("one-process", FAIL, figure, cause)
    tb = ctx.sources.rewrite(rec.get("traceback") or "")
    error = (
        rec.get("error") or "no record: it died before the probe could write one"
    ).splitlines()[0][:200]
    at = user_line(ctx, rec.get("traceback") or "")
    figure = f"as {cmd}: {error}" + (f" at {at}" if at else "")
    cause = f"{only}: {error}" + (f" at {at}" if at else "")
    details = [ln for ln in tb.strip().splitlines()[-8:]]
    return Check("one-process", FAIL, figure, cause, details=details)


# ------------------------------------------------------------------------ other scripts


def check_other_scripts(ctx: Context) -> Check | None:
    if not ctx.others:
        return None
    root = ctx.sources.user_root or ""

    def name(o: dict) -> str:
        rel = (
            os.path.relpath(o["script"], root)
            if root
            else os.path.basename(o["script"])
        )
        return f"`{rel} {o['flag']}`"

    broken = [
        o
        for o in ctx.others
        if o["after"]["exit"] != 0 and (o.get("before") or {}).get("exit") == 0
    ]
    before = [o for o in ctx.others if o["after"]["exit"] != 0 and o not in broken]
    data = {
        "scripts": [
            {k: o.get(k) for k in ("script", "flag", "imports")} for o in ctx.others
        ]
    }
    if not broken:
        ran = [name(o) for o in ctx.others if o["after"]["exit"] == 0]
        figure = (
            f"{plural(len(ctx.others), 'other script')} importing a changed module, as plain python: "
            + (", ".join(ran) + " ran as before" if ran else "none ran")
        )
        if before:
            figure += (
                "; "
                + ", ".join(name(o) for o in before)
                + " failed before the conversion too"
            )
        return Check("other-scripts", PASS, figure, data=data)
    o = broken[0]
    after = o["after"]
    at = user_line(ctx, after.get("output") or "")
    exit_ = "no exit" if after["exit"] is None else f"exit {after['exit']}"
    figure = f"{name(o)}: {exit_} after the conversion, exit 0 before" + (
        f" (+{plural(len(broken) - 1, 'more script')})" if len(broken) > 1 else ""
    )
    error = after.get("error") or "it failed"
    cause = (
        f"the conversion changed {', '.join(o['imports'])}, which {os.path.basename(o['script'])} imports, and a plain "
        f"`python {os.path.relpath(o['script'], root) if root else o['script']} {o['flag']}` now fails: {error}"
        + (f" at {at}" if at else "")
        + ". Code shared with scripts that run as one process must work without a process group "
        "(guard a collective with torch.distributed.is_initialized())"
    )
    details = ctx.sources.rewrite(after.get("output") or "").strip().splitlines()[-8:]
    return Check("other-scripts", FAIL, figure, cause, details=details, data=data)


# ------------------------------------------------------------------------ GPU paths

# packages that need CUDA (or build kernels for it): a CPU machine does not have them
CUDA_ONLY = {
    "triton", "apex", "flash_attn", "xformers", "bitsandbytes", "deepspeed", "cupy", "pycuda", "tensorrt",
    "transformer_engine", "mamba_ssm", "causal_conv1d", "liger_kernel", "fused_layer_norm", "amp_C", "nvidia",
}  # fmt: skip
_KERNEL_DECORATORS = ("jit", "autotune", "heuristics")


def _kernels(tree: ast.Module | None) -> dict[str, ast.AST]:
    """Functions compiled by triton (`@triton.jit`, `@triton.autotune(...)`, `@jit` imported
    from triton), by qualified name."""
    if tree is None:
        return {}
    from_triton = {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").split(".")[0] == "triton"
        for a in node.names
    }
    out: dict[str, ast.AST] = {}

    def visit(body, prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for dec in node.decorator_list:
                    target = dec.func if isinstance(dec, ast.Call) else dec
                    text = ast.unparse(target)
                    last = text.split(".")[-1]
                    if last in _KERNEL_DECORATORS and (
                        text.startswith("triton.") or text in from_triton
                    ):
                        out[f"{prefix}{node.name}"] = node
                        break
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(node, field, [])
                    for x in inner:
                        visit(
                            x.body if isinstance(x, ast.ExceptHandler) else [x], prefix
                        )

    visit(tree.body, "")
    return out


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _cuda_branches(tree: ast.Module | None) -> list[tuple[int, str]]:
    """`if` statements whose test reads whether CUDA is there, and whose GPU side does something."""
    out = []
    for node in ast.walk(tree) if tree is not None else ():
        if not isinstance(node, ast.If):
            continue
        test = ast.unparse(node.test)
        if (
            not re.search(r"cuda|is_available\(\)|\bgpu\b", test, re.I)
            or "is_initialized" in test
        ):
            continue
        negated = test.startswith("not ") or "== 'cpu'" in test or '== "cpu"' in test
        if (negated and node.orelse) or (not negated and node.body):
            out.append((node.lineno, test[:60]))
    return out


def check_gpu_paths(ctx: Context) -> Check | None:
    if not ctx.on_cpu:
        return None
    src = ctx.sources
    files = [
        ctx.exec_path,
        *[
            c
            for c in src.copies
            if os.path.realpath(c) != os.path.realpath(ctx.exec_path)
        ],
    ]
    changed, kernels, branches = [], [], []
    for path in files:
        tree = src.tree(path)
        mine = _kernels(tree)
        original = None
        if src.is_copy(path) and os.path.realpath(path) in src.copies:
            try:
                original = ast.parse(src.copies[os.path.realpath(path)][1])
            except (SyntaxError, ValueError):
                original = None
        theirs = _kernels(original) if original is not None else {}
        for qual, node in mine.items():
            kernels.append(f"`{qual}` ({src.where(path, node.lineno)})")
            before = theirs.get(qual)
            if before is not None and ast.dump(before) != ast.dump(node):
                added = sorted(_names(node) - _names(before))
                changed.append((qual, src.where(path, node.lineno), added))
        user_tree = original if original is not None else tree
        user_path = src.user_file(path)
        for line, test in _cuda_branches(user_tree):
            branches.append(f"`if {test}:` ({src.name(user_path)}:{line})")
    rec = ctx.candidate.records.get(0) or {}
    failed = [
        x
        for x in rec.get("failed_imports") or []
        if x["module"].split(".")[0] in CUDA_ONLY
    ]
    imports = [
        f"`import {x['module']}` ({ctx.where(x['where'])}: {x['error'][:60]})"
        for x in failed
    ]
    data = {"kernels": kernels, "imports": imports, "branches": branches}
    if changed:
        qual, where, added = changed[0]
        reads = f": it now reads {', '.join(f'`{a}`' for a in added)}" if added else ""
        figure = f"the conversion changed the triton kernel `{qual}` ({where}){reads}"
        cause = (
            f"code inside a compiled kernel runs on the GPU, where Python globals such as RANK do not exist: triton "
            f"refuses a kernel that reads a global it cannot make a constant, so `{qual}` no longer compiles on a GPU"
            f"{reads}. This CPU run never compiled it"
            + (
                f" ({'; '.join(imports[:2])}, and the script took its other path)"
                if imports
                else ""
            )
            + ": a kernel must be left as it was"
        )
        return Check("gpu-paths", FAIL, figure, cause, data=data)
    if not (kernels or imports):
        if not branches:
            return None
    parts = []
    if kernels:
        parts.append(
            f"{plural(len(kernels), 'triton kernel')} never compiled ({', '.join(kernels[:3])})"
        )
    if imports:
        parts.append(
            f"{plural(len(imports), 'CUDA-only import')} failed and the script went on ({', '.join(imports[:3])})"
        )
    if branches:
        more = f" and {len(branches) - 3} more" if len(branches) > 3 else ""
        parts.append(
            f"{plural(len(branches), 'branch', 'branches')} on CUDA not taken ({', '.join(branches[:3])}{more})"
        )
    figure = (
        "this CPU run skipped what a GPU run executes: "
        + "; ".join(parts)
        + ": a run on GPUs proves them"
    )
    return Check("gpu-paths", INFO, figure, data=data)
