"""Mixed precision: forward and loss under torch.autocast; fp16 backward through a GradScaler.
Scripts that already use AMP keep their precision, modernised to torch.amp."""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import code
from ddpify.transforms.base import Context, Transform

AUTOCAST = "torch.autocast(LOCAL_DEVICE.type, dtype=AMP_DTYPE, enabled=AMP_DTYPE is not None)"
CLIP = ("torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_value_", "torch.nn.utils.clip_grad.clip_grad_norm_", "torch.nn.utils.clip_grad.clip_grad_value_")


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
        if ctx.opts.amp in ("none", "apex"):
            return
        scaled = ctx.opts.amp in ("auto", "fp16")
        self._updates: dict[int, cst.BaseStatement] = {}
        self._update_stmt: dict[int, cst.BaseStatement] = {}
        done_blocks: set[int] = set()
        for step in a.steps:
            if not ctx.editable(step.stmt):
                continue
            body = list(step.block.body)
            if step.forward_first is None or step.forward_first is step.stmt or step.forward_first not in body:
                ctx.finding(step.backward, "DDP043", "mixed precision not added: put the forward pass and loss in their own statements before backward()", False)
                continue
            first = step.forward_first
            last = step.loss_stmt if step.loss_stmt in body and body.index(step.loss_stmt) >= body.index(first) else first
            if (id(first), id(last)) not in done_blocks:
                done_blocks.add((id(first), id(last)))
                ctx.edits.wraps.append((first, last, ctx.expr(AUTOCAST)))
                ctx.helpers.add("amp")
                ctx.finding(first, "DDP040", f"forward pass and loss run under torch.autocast ({PRECISION_SAID[ctx.opts.amp]})", True)
            if scaled:
                self._scale(ctx, step)

    def _scale(self, ctx: Context, step) -> None:
        a = ctx.a
        ctx.helpers.add("scaler")
        loss = step.backward.func.value

        def bw(node, loss=loss):
            return node.with_changes(func=node.func.with_changes(value=ctx.expr(f"SCALER.scale({code(node.func.value)})")))

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
            ctx.finding(step.backward, "DDP041", "backward and optimizer step go through the GradScaler (active with fp16 only)", True)
        else:
            ctx.finding(step.backward, "DDP041", "backward scaled; no optimizer.step() found next to it: call SCALER.step(opt) and SCALER.update() there", True)
        # clipping needs unscaled gradients
        for s in step.tail:
            for c in a.findall(s, m.Call()):
                if a.is_call(c, *CLIP) and step.step_calls:
                    opt = self._next_optimizer(ctx, c, step)
                    ctx.edits.before[a.statement(c)].append(ctx.stmt(f"SCALER.unscale_({opt})\n"))

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
                dev = '"cuda"' if a.is_call(call, "torch.cuda.amp.autocast") else '"cpu"'
                ctx.edits.replace(call, lambda n, dev=dev: n.with_changes(func=ctx.expr("torch.autocast"), args=[cst.Arg(ctx.expr(dev), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if n.args else cst.MaybeSentinel.DEFAULT), *n.args]))
                ctx.require("torch")
                ctx.finding(call, "DDP042", f"torch.{'cuda' if 'cuda' in dev else 'cpu'}.amp.autocast is deprecated: torch.autocast({dev}, ...)", True)
            elif a.is_call(call, "torch.cuda.amp.GradScaler"):
                ctx.edits.replace(call, lambda n: n.with_changes(func=ctx.expr("torch.amp.GradScaler"), args=[cst.Arg(ctx.expr('"cuda"'), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if n.args else cst.MaybeSentinel.DEFAULT), *n.args]))
                ctx.require("torch")
                ctx.finding(call, "DDP042", 'torch.cuda.amp.GradScaler is deprecated: torch.amp.GradScaler("cuda", ...)', True)
