"""Mixed precision: forward and loss under torch.autocast; fp16 backward through a GradScaler.
Left out where it would change the result (amp_safety: losses on probabilities, sparse tensors).
Scripts that already use AMP keep their precision, modernised to torch.amp."""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import code
from ddpify.transforms.amp_safety import (
    inplace_split,
    plan_float32,
    reachable,
    sparse_use,
    unsafe_calls,
)
from ddpify.transforms.base import Context, Transform
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP040",
    "autocast",
    "forward and loss run under torch.autocast",
    fix=True,
    check="loss",
)
declare(
    "DDP041",
    "grad-scaler",
    "backward and step go through the GradScaler",
    fix=True,
    check="loss",
)
declare(
    "DDP042",
    "torch-cuda-amp-modernised",
    "torch.cuda.amp modernised to torch.amp",
    fix=True,
    check="loss",
)
declare(
    "DDP043",
    "amp-step-not-found",
    "mixed precision not added: the training step was not found",
)
declare(
    "DDP045",
    "manual-update-amp",
    "parameters updated by hand (no optimizer): bf16 autocast only, no GradScaler; gradients averaged in backward()",
    fix=True,
    check="params-in-sync",
)
declare(
    "DDP046",
    "autocast-inplace",
    "tensor from the forward pass changed in place: autocast ends before it, the rest in float32",
    fix=True,
    check="loss",
)
declare("DDP121", "amp-cpu", "mixed precision not added: the script trains on the CPU")
declare(
    "DDP140",
    "amp-sparse",
    "mixed precision not added: the program uses sparse tensors, which autocast has no bf16/fp16 kernels for",
)

AUTOCAST = (
    "torch.autocast(LOCAL_DEVICE.type, dtype=AMP_DTYPE, enabled=AMP_DTYPE is not None)"
)
# a step that updates parameters by hand has no optimizer for SCALER.step(): bf16 or nothing
AUTOCAST_BF16 = "torch.autocast(LOCAL_DEVICE.type, dtype=torch.bfloat16, enabled=AMP_DTYPE == torch.bfloat16)"
CLIP = (
    "torch.nn.utils.clip_grad_norm_",
    "torch.nn.utils.clip_grad_value_",
    "torch.nn.utils.clip_grad.clip_grad_norm_",
    "torch.nn.utils.clip_grad.clip_grad_value_",
)


# What DDP040 says each --amp choice does at run time.
PRECISION_SAID = {
    "auto": "bf16 where the GPU has it, else fp16; off on CPU",
    "bf16": "bf16 on GPUs, chosen by --amp bf16; off on CPU",
    "fp16": "fp16 with loss scaling on GPUs, chosen by --amp fp16; off on CPU",
}


class PrecisionTransform(Transform):
    name = "precision"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        if a.existing_amp:
            self._modernise(ctx)
            return
        if (
            ctx.opts.amp in ("none", "apex") or a.apex_amp
        ):  # apex amp: its own switch decides (legacy_apex.py)
            return
        if ctx.cpu_only:
            # autocast and GradScaler are for GPUs: a CPU program keeps full precision
            for step in a.steps[:1]:
                ctx.finding(
                    step.forward_first or step.backward,
                    "DDP121",
                    "mixed precision not added: the script trains on the CPU (see DDP120); full precision",
                    False,
                )
            return
        sparse = (
            sparse_use(a, reachable(a, [step.block for step in a.steps]))
            if a.steps
            else None
        )
        if sparse is not None:
            call, what = sparse
            ctx.finding(
                call,
                "DDP140",
                f"mixed precision not added: {what} makes or multiplies a sparse tensor, and autocast would hand "
                "sparse kernels bf16/fp16 operands they lack on GPUs (\"addmm_sparse_cuda\" not implemented for 'BFloat16'); "
                "the script trains in full precision (for mixed precision by hand, run the sparse products in float32 with autocast disabled)",
                False,
            )
            return
        scaled = ctx.opts.amp in ("auto", "fp16")
        self._updates: dict[int, cst.BaseStatement] = {}
        self._update_stmt: dict[int, cst.BaseStatement] = {}
        done_blocks: set[int] = set()
        fp32_done: set[int] = set()
        for step in a.steps:
            if not ctx.editable(step.stmt):
                continue
            body = list(step.block.body)
            if (
                step.forward_first is None
                or step.forward_first is step.stmt
                or step.forward_first not in body
            ):
                ctx.finding(
                    step.backward,
                    "DDP043",
                    "mixed precision not added: put the forward pass and loss in their own statements before backward()",
                    False,
                )
                continue
            first = step.forward_first
            last = (
                step.loss_stmt
                if step.loss_stmt in body
                and body.index(step.loss_stmt) >= body.index(first)
                else first
            )
            region = body[body.index(first) : body.index(last) + 1]
            unsafe = unsafe_calls(ctx, region)
            if unsafe and ctx.opts.amp == "auto":
                call, what = unsafe[0]
                ctx.finding(
                    call,
                    "DDP044",
                    f"mixed precision not added to this step: {what} takes probabilities, which bf16/fp16 round "
                    "to exactly 0 or 1 near the ends (the log is clamped: the loss diverges), and no later cast restores them; "
                    "for mixed precision, have the model return logits and use nn.BCEWithLogitsLoss (or "
                    "F.binary_cross_entropy_with_logits), or take the risk with --amp bf16",
                    False,
                )
                continue
            manual = a.manual_update_in(step.tail)
            if manual is not None and ctx.opts.amp == "fp16":
                ctx.finding(
                    manual,
                    "DDP045",
                    "mixed precision not added: fp16 needs a GradScaler and this step updates the parameters by hand, with no optimizer to unscale (use --amp bf16, or unscale the gradients by hand)",
                    False,
                )
                continue
            split = inplace_split(a, region)
            if split is not None:
                k, op, names = split
                if k == 0:
                    ctx.finding(
                        op,
                        "DDP046",
                        f"mixed precision not added: `{code(op).strip()}` changes in place a tensor computed in the forward pass, which breaks autograd under autocast on GPUs; make it out of place to get mixed precision",
                        False,
                    )
                    continue
                if (id(first), id(last)) not in done_blocks:
                    if names:
                        cast = ", ".join(f"{n}.float()" for n in names)
                        ctx.edits.before[region[k]].append(
                            ctx.stmt(f"{', '.join(names)} = {cast}\n")
                        )
                    rest = (
                        f" and {', '.join(names)} continue in float32"
                        if names
                        else ", the rest runs in float32"
                    )
                    ctx.finding(
                        op,
                        "DDP046",
                        f"`{code(op).strip()}` changes in place a tensor computed under autocast (breaks autograd on GPUs): autocast ends before it{rest}",
                        True,
                    )
                done_blocks.add((id(first), id(last)))
                last = region[k - 1]
            if (id(first), id(last)) not in done_blocks:
                done_blocks.add((id(first), id(last)))
                plan_float32(ctx, unsafe, fp32_done)
                ctx.edits.wraps.append(
                    (
                        first,
                        last,
                        ctx.expr(AUTOCAST if manual is None else AUTOCAST_BF16),
                    )
                )
                ctx.helpers.add("amp")
                if manual is None:
                    ctx.finding(
                        first,
                        "DDP040",
                        f"forward pass and loss run under torch.autocast ({PRECISION_SAID[ctx.opts.amp]})",
                        True,
                    )
                else:
                    ctx.finding(
                        first,
                        "DDP040",
                        "forward pass and loss run under torch.autocast in bf16 only (full precision where the GPU lacks bf16, and on CPU)",
                        True,
                    )
            if manual is not None:
                ctx.finding(
                    manual,
                    "DDP045",
                    "parameters updated by hand: no GradScaler (it needs an optimizer), so no fp16; DDP averages the gradients in backward() before this update",
                    True,
                )
            elif scaled:
                self._scale(ctx, step)

    def _scale(self, ctx: Context, step) -> None:
        a = ctx.a
        ctx.helpers.add("scaler")
        loss = step.backward.func.value

        def bw(node, loss=loss):
            return node.with_changes(
                func=node.func.with_changes(
                    value=ctx.expr(f"SCALER.scale({code(node.func.value)})")
                )
            )

        ctx.edits.replace(step.backward, bw)
        last = None
        for call in step.step_calls:
            opt = code(call.func.value)
            ctx.edits.replace(call, ctx.expr(f"SCALER.step({opt})"))
            last = call
        if last is not None:
            # one update per iteration, after the block's last optimizer step
            prev = self._updates.get(id(step.block))
            if prev is not None:
                ctx.edits.after[prev].remove(self._update_stmt[id(step.block)])
            upd = ctx.stmt("SCALER.update()\n")
            anchor = a.statement(last)
            ctx.edits.after[anchor].append(upd)
            self._updates[id(step.block)] = anchor
            self._update_stmt[id(step.block)] = upd
            ctx.finding(
                step.backward,
                "DDP041",
                "backward and optimizer step go through the GradScaler (active with fp16 only)",
                True,
            )
        else:
            ctx.finding(
                step.backward,
                "DDP041",
                "backward scaled; no optimizer.step() found next to it: call SCALER.step(opt) and SCALER.update() there",
                True,
            )
        # clipping needs unscaled gradients
        for s in step.tail:
            for c in a.findall(s, m.Call()):
                if a.is_call(c, *CLIP) and step.step_calls:
                    opt = self._next_optimizer(ctx, c, step)
                    ctx.edits.before[a.statement(c)].append(
                        ctx.stmt(f"SCALER.unscale_({opt})\n")
                    )

    def _next_optimizer(self, ctx: Context, clip: cst.Call, step) -> str:
        line = ctx.a.pos[clip].start.line
        after = [c for c in step.step_calls if ctx.a.pos[c].start.line >= line]
        return code((after or step.step_calls)[0].func.value)

    def _modernise(self, ctx: Context) -> None:
        a = ctx.a
        for call in a.calls:
            if not ctx.editable(call):
                continue
            if a.is_call(call, "torch.cuda.amp.autocast", "torch.cpu.amp.autocast"):
                dev = (
                    '"cuda"' if a.is_call(call, "torch.cuda.amp.autocast") else '"cpu"'
                )
                ctx.edits.replace(
                    call,
                    lambda n, dev=dev: n.with_changes(
                        func=ctx.expr("torch.autocast"),
                        args=[
                            cst.Arg(
                                ctx.expr(dev),
                                comma=cst.Comma(
                                    whitespace_after=cst.SimpleWhitespace(" ")
                                )
                                if n.args
                                else cst.MaybeSentinel.DEFAULT,
                            ),
                            *_as_keywords(n.args),
                        ],
                    ),
                )
                ctx.require("torch")
                ctx.finding(
                    call,
                    "DDP042",
                    f"torch.{'cuda' if 'cuda' in dev else 'cpu'}.amp.autocast is deprecated: torch.autocast({dev}, ...)",
                    True,
                )
            elif a.is_call(call, "torch.cuda.amp.GradScaler"):
                ctx.edits.replace(
                    call,
                    lambda n: n.with_changes(
                        func=ctx.expr("torch.amp.GradScaler"),
                        args=[
                            cst.Arg(
                                ctx.expr('"cuda"'),
                                comma=cst.Comma(
                                    whitespace_after=cst.SimpleWhitespace(" ")
                                )
                                if n.args
                                else cst.MaybeSentinel.DEFAULT,
                            ),
                            *n.args,
                        ],
                    ),
                )
                ctx.require("torch")
                ctx.finding(
                    call,
                    "DDP042",
                    'torch.cuda.amp.GradScaler is deprecated: torch.amp.GradScaler("cuda", ...)',
                    True,
                )


# torch.cuda.amp.autocast(enabled, dtype, cache_enabled) by position; torch.autocast takes
# (device_type, dtype, enabled, ...): kept positional, `enabled` would land on dtype.
_OLD_AUTOCAST_ARGS = ("enabled", "dtype", "cache_enabled")


def _as_keywords(args) -> list[cst.Arg]:
    out = []
    for i, arg in enumerate(args):
        if arg.keyword is None and not arg.star and i < len(_OLD_AUTOCAST_ARGS):
            arg = arg.with_changes(
                keyword=cst.Name(_OLD_AUTOCAST_ARGS[i]),
                equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""),
                    whitespace_after=cst.SimpleWhitespace(""),
                ),
            )
        out.append(arg)
    return out
