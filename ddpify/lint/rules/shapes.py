"""A tensor gathered across ranks whose length comes from the rank's own data: all_gather needs
the same shape on every rank, so the ranks hang (NCCL) or fail (gloo) when a boolean mask or a
length read from the batch cuts each rank's tensor to a size of its own."""

from __future__ import annotations

import re

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import call_args, code
from ddpify.lint.rules.common import torch_ddp
from ddpify.rules import declare

declare(
    "DDP213",
    "gather-shape-per-rank",
    "a tensor gathered across ranks (all_gather) is cut to a length of the rank's own data: the shapes differ across ranks, so the collective hangs or fails",
    severity="blocking",
    tool="lint",
)

GATHERS = {
    "torch.distributed.all_gather": 1,
    "torch.distributed.all_gather_into_tensor": 1,
    "torch.distributed.gather": 0,
}
MASK_NAME = re.compile(r"mask|keep|valid|selected|nonpad|non_pad", re.I)
DATA_SIZE = re.compile(
    r"\.item\(\)|\bmax\(|\bmin\(|\.sum\(|\.max\(|\.nonzero\(|\blen\("
)
PADDED = re.compile(
    r"pad_across_processes|all_gather_object|pad_sequence|\bF\.pad\(|functional\.pad\("
)


def check(ctx) -> None:
    a = ctx.a
    if not torch_ddp(ctx):
        return
    for c in a.calls:
        which = next((i for q, i in GATHERS.items() if a.is_call(c, q)), None)
        if which is None:
            continue
        pos, _ = call_args(c)
        if len(pos) <= which:
            continue
        fn = a.function_of(c)
        if fn is not None and (
            PADDED.search(code(fn)) or _sizes_gathered_first(a, fn, c)
        ):
            continue  # the script evens the sizes out itself
        why = _own_size(ctx, pos[which].value)
        if why is not None:
            ctx.report(
                c,
                "DDP213",
                f"`{code(c).strip()}` gathers `{code(pos[which].value).strip()}`, cut to a size of this rank's own data ({why}): "
                "all_gather needs the same shape on every rank, so the ranks hang (NCCL) or fail (gloo); gather the sizes "
                "first and pad to the largest, or use all_gather_object",
            )


def _sizes_gathered_first(a, fn, call) -> bool:
    """Another gather or all_reduce in the function before this one (of the sizes, to pad)."""
    for c in a.findall(fn, m.Call()):
        if c is call or a._order.get(id(c), 0) > a._order.get(id(call), 0):
            continue
        if a.is_call(c, "torch.distributed.all_gather", "torch.distributed.all_reduce"):
            return True
    return False


def _own_size(ctx, expr: cst.BaseExpression, depth: int = 0) -> str | None:
    """Why the tensor's length is the rank's own: a boolean mask, or a slice bound read from
    the data; through the names and returns it comes from."""
    a, f = ctx.a, ctx.facts
    if depth > 3:
        return None
    for node in [expr, *a.findall(expr, m.Subscript())]:
        if isinstance(node, cst.Subscript):
            why = _cut(ctx, node)
            if why is not None:
                return why
    for v in f.sources(expr):
        if v is expr:
            continue
        why = _own_size(ctx, v, depth + 1)
        if why is not None:
            return why
    if isinstance(expr, cst.Call):
        callee = f.own_call(expr)
        for fn in a.functions.get(callee or "", [])[:2]:
            for r in a.findall(fn, m.Return()):
                if r.value is not None:
                    why = _own_size(ctx, r.value, depth + 1)
                    if why is not None:
                        return why
    return None


def _cut(ctx, sub: cst.Subscript) -> str | None:
    f = ctx.facts
    for el in sub.slice:
        s = el.slice
        if isinstance(s, cst.Index):
            idx = s.value
            if isinstance(idx, cst.Comparison) or (
                isinstance(idx, cst.Name) and MASK_NAME.search(idx.value)
            ):
                return f"`{code(sub).strip()}` keeps what a mask of its batch selects"
            for v in f.sources(idx):
                if isinstance(v, cst.Comparison):
                    return (
                        f"`{code(sub).strip()}` keeps what a mask of its batch selects"
                    )
        elif isinstance(s, cst.Slice):
            for bound in (s.lower, s.upper):
                if bound is None or isinstance(
                    bound, (cst.Integer, cst.UnaryOperation)
                ):
                    continue
                for v in f.sources(bound):
                    text = code(v)
                    if DATA_SIZE.search(text) and not text.startswith(
                        ("args.", "cfg.", "config.")
                    ):
                        return f"`{code(sub).strip()}` with `{code(bound).strip()} = {text.strip()}`"
    return None
