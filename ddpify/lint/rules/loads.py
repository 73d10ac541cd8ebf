"""A checkpoint loaded on every rank with no map_location: torch.load puts each tensor back on
the device it was saved from, GPU 0 for a checkpoint rank 0 wrote, so every process allocates
there (memory on GPU 0 a process, out of memory with a large model) before load_state_dict
copies it onto the rank's own device."""

from __future__ import annotations

import re

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import call_args, code, dotted
from ddpify.lint.rules.common import torch_ddp
from ddpify.rules import declare

declare(
    "DDP234",
    "load-without-map-location",
    "a checkpoint loaded on every rank with no map_location: each tensor goes back to the GPU it was saved from (GPU 0), in every process",
    severity="blocking",
    tool="lint",
)

CUDA = re.compile(r"\bcuda\b")


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if not torch_ddp(ctx) or not CUDA.search(ctx.text):
        return  # a CPU program: every tensor is on the CPU anyway
    for c in a.calls:
        if not a.is_call(c, "torch.load"):
            continue
        pos, kw = call_args(c)
        if len(pos) > 1 or "map_location" in kw or not pos:
            continue
        runs = f.reach.runs(c)
        if f.reach.rank_conditions(c) or (
            runs is not None and any(v is False for v in runs)
        ):
            continue  # some ranks never load it (rank 0 alone: its own GPU is GPU 0)
        into = _restores(a, c)
        if into is None:
            continue  # data, not a model's state: its device is whatever was saved
        ctx.report(
            c,
            "DDP234",
            f"`{code(c).strip()}` has no map_location and runs on every rank: each tensor of the checkpoint goes back to the GPU it was "
            f"saved from (GPU 0 when rank 0 saved it), so every process allocates on GPU 0 before {into} copies it to its own device "
            '(memory there for each rank, out of memory with a large model); pass map_location="cpu" or the rank\'s device',
        )


def _restores(a, load: cst.Call) -> str | None:
    """The load_state_dict the loaded object reaches (directly, or through the name it is bound
    to in its function, subscripts included); None when it reaches none."""
    fn = a.function_of(load)
    target = a._assign_target(load)
    for c in a.calls:
        if a.function_of(c) is not fn or not isinstance(c.func, cst.Attribute):
            continue
        if c.func.attr.value != "load_state_dict":
            continue
        for arg in c.args:
            if arg.value is load or (
                target is not None
                and (dotted(_root(arg.value)) or "").split(".")[0]
                == target.split(".")[0]
                and a._order.get(id(c), -1) > a._order.get(id(load), -1)
            ):
                return f"{code(c.func).strip()}()"
            if any(n is load for n in a.findall(arg.value, m.Call())):
                return f"{code(c.func).strip()}()"
    return None


def _root(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`ckpt["model"]["net"]` -> `ckpt`."""
    while isinstance(expr, cst.Subscript):
        expr = expr.value
    return expr
