"""Notes: what works, but worse than it could (speed, warnings, deprecated launch)."""

from __future__ import annotations

import re

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import call_args, code, dotted
from ddpify.lint.wrappers import BN_MODELS
from ddpify.lint.rules.common import torch_ddp
from ddpify.rules import declare

declare(
    "DDP280",
    "batchnorm-without-syncbn",
    "the DDP model has BatchNorm layers and no SyncBatchNorm: each rank normalises with its own batch's statistics (small per-GPU batches make them noisy)",
    tool="lint",
)
declare(
    "DDP281",
    "accumulation-without-no-sync",
    "gradient accumulation under DDP without model.no_sync(): every micro-step all-reduces the gradients, not only the last",
    tool="lint",
)
declare(
    "DDP283",
    "init-without-device-id",
    'init_process_group without device_id=: barriers and NCCL guess the device (warnings, memory on GPU 0); pass device_id=torch.device("cuda", local_rank)',
    tool="lint",
)
declare(
    "DDP284",
    "no-destroy-process-group",
    "the process group is never destroyed: call dist.destroy_process_group() when training ends (torch >= 2.4 warns)",
    tool="lint",
)

BN = re.compile(r"^BatchNorm[123]d$")


def check(ctx) -> None:
    a = ctx.a
    if not torch_ddp(ctx):
        return
    _syncbn(ctx)
    _no_sync(ctx)
    inits = [c for c in a.calls if a.is_call(c, "torch.distributed.init_process_group")]
    for c in inits:
        pos, kw = call_args(c)
        backend = (
            pos[0].value if pos else kw["backend"].value if "backend" in kw else None
        )
        if "device_id" not in kw and not (
            isinstance(backend, cst.SimpleString) and backend.evaluated_value == "gloo"
        ):
            ctx.report(
                c,
                "DDP283",
                'init_process_group without device_id=: barriers and NCCL guess which GPU this rank uses (warnings, a context on GPU 0); pass device_id=torch.device("cuda", local_rank) (torch >= 2.3)',
            )
    if inits and not any(
        a.is_call(c, "torch.distributed.destroy_process_group") for c in a.calls
    ):
        ctx.report(
            inits[0],
            "DDP284",
            "the process group is never destroyed: call dist.destroy_process_group() when training ends (torch >= 2.4 warns, and a rank may abort at exit)",
        )


def _syncbn(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if "SyncBatchNorm" in f.text or "convert_syncbn_model" in f.text:
        return
    for w in f.ddp_wraps:
        call = f.wrapped_call(w)
        cls = f.model_class(w.inner, w.stmt, call)
        has_bn = False
        if isinstance(cls, str):
            has_bn = bool(BN_MODELS.match(cls.rsplit(".", 1)[-1]))
        elif cls is not None:
            has_bn = any(
                BN.match((dotted(c.func) or "").rsplit(".", 1)[-1])
                for c in a.findall(cls, m.Call())
            )
        if call is not None:  # nn.Sequential(..., nn.BatchNorm1d(8), ...)
            has_bn = has_bn or any(
                BN.match((dotted(c.func) or "").rsplit(".", 1)[-1])
                for c in a.findall(call, m.Call())
            )
        if has_bn:
            name = w.inner or "the model"
            ctx.report(
                w.call,
                "DDP280",
                f"{name} has BatchNorm layers and no SyncBatchNorm: each rank normalises with the statistics of its own batch; convert it before the wrap if the per-GPU batch is small: torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)",
            )
            return


def _no_sync(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if not f.ddp_wraps or "no_sync" in f.text or "require_backward_grad_sync" in f.text:
        return
    for step in a.steps:
        test = (
            code(step.accumulation_test) if step.accumulation_test is not None else ""
        )
        if "%" in test or " - 1" in test or re.search(r"accum|micro", test, re.I):
            ctx.report(
                step.backward,
                "DDP281",
                f"gradient accumulation (the optimizer steps only when `{code(step.accumulation_test)}`) without model.no_sync(): every micro-step all-reduces the gradients; run the micro-steps before the last under `with model.no_sync():`",
            )
            return
