"""A model trained with a process group and sharded data but never wrapped in DDP (nor its
gradients all-reduced by hand): each rank trains its own model on its own shard."""

from __future__ import annotations

import re

import libcst as cst

from ddpify.analysis.tree import code, dotted
from ddpify.lint.rules.common import torch_ddp
from ddpify.rules import declare

declare(
    "DDP240",
    "model-not-wrapped",
    "the model is trained on sharded data but never wrapped in DistributedDataParallel (nor are its gradients all-reduced): each rank trains a model of its own",
    severity="blocking",
    tool="lint",
)

WRAPPING = re.compile(
    r"ddp|distributed|parallel|wrap|shard|prepare|fsdp|accelerat|average_grad|allreduce|all_reduce|sync_grad",
    re.I,
)


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if not torch_ddp(ctx) or f.wraps or f.in_place or not a.steps:
        return
    if not (
        f.samplers or a._find_api(("torch.distributed.init_process_group",)) is not None
    ):
        return
    # gradients all-reduced by hand: dist.all_reduce(p.grad) / a helper that averages them
    for c in a.calls:
        what = f.collective(c)
        if what is not None and (
            "grad" in code(c)
            or a.ancestor(c, cst.For) is not None
            and "param" in code(a.ancestor(c, cst.For).iter)
        ):
            return
        name = dotted(c.func) or ""
        if WRAPPING.search(name.rsplit(".", 1)[-1]) and any(
            dotted(x.value) in a.models for x in c.args
        ):
            return  # handed to a wrapper this file does not show
    step = a.steps[0]
    dp = (
        " (DataParallel is not DDP: under torchrun each process would drive every GPU)"
        if a.dataparallel_calls
        else ""
    )
    models = ", ".join(step.models) or (a.models[0] if a.models else "the model")
    ctx.report(
        step.backward,
        "DDP240",
        f"{models} is trained on sharded data but never wrapped in DistributedDataParallel{dp}: backward() all-reduces nothing, so each rank trains a model of its own; wrap it after it reaches its device: model = DDP(model, device_ids=[local_rank])",
    )
