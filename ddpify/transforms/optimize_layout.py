"""--optimize: channels-last memory format for convolutional models (DDP130). bf16 convolutions
and BatchNorm run NHWC kernels without layout transposes (bench/README.md: ResNet-50 1.82x).
Applied only where the model's code is read and holds 2-d convolutions, nothing in it or in
the training step depends on the layout (`.view`, strides), and no layer is 3-d."""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import _flatten_targets, call_args, dotted
from ddpify.analysis.model_code import (
    CONV3D,
    convolutions,
    input_goes_to_conv,
    layout_hazards,
    model_hazards,
)
from ddpify.transforms.base import Context, Transform, append_kwarg
from ddpify.transforms.optimize_common import (
    anchor_of,
    before_wrap,
    code_of,
    wrapped_models,
)
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP130",
    "optimize-channels-last",
    "--optimize: channels-last memory format for a convolutional model and its input batches (or why not)",
    fix=True,
    check="throughput",
)

CODE = "DDP130"


class ChannelsLastTransform(Transform):
    name = "optimize_layout"

    def plan(self, ctx: Context) -> None:
        if "channels-last" not in ctx.opts.optimize:
            return
        for name in wrapped_models(ctx):
            self._model(ctx, name)

    def _model(self, ctx: Context, name: str) -> None:
        a = ctx.a
        anchor = anchor_of(ctx, name)
        mc = code_of(ctx, name)
        if isinstance(mc, str):
            ctx.finding(
                anchor,
                CODE,
                f"channels-last not applied to `{name}`: {mc}, so ddpify cannot check that nothing in it depends on the memory layout",
                False,
            )
            return
        cls = mc.name
        if not convolutions(mc):
            ctx.finding(
                anchor,
                CODE,
                f"channels-last not applied to `{name}`: {cls} has no 2-d convolution, so the layout gains nothing",
                False,
            )
            return
        if convolutions(mc, CONV3D):
            ctx.finding(
                anchor,
                CODE,
                f"channels-last not applied to `{name}`: {cls} has 3-d layers (5-d weights take channels_last_3d, not channels_last)",
                False,
            )
            return
        steps = [s for s in a.steps if name in s.models]
        # where the model's outputs may go: the training step, and the script's functions that
        # run a model (evaluation, a loss helper); a .view there on a 4-d output would raise
        region = [st for s in steps for st in self._region(ctx, s)]
        region += [
            fn for f in sorted(a.forward_functions) for fn in a.functions.get(f, [])
        ]
        hazards = [(h, mc.line(h)) for h in model_hazards(mc)] + [
            (h, f"line {a.pos[h].start.line}") for h in layout_hazards(a, region)
        ]
        if hazards:
            call, where = hazards[0]
            what = (
                f".{call.func.attr.value}(...)"
                if isinstance(call.func, cst.Attribute)
                else "as_strided"
            )
            ctx.finding(
                anchor,
                CODE,
                f"channels-last refused for `{name}`: {what} at {where} depends on the memory layout (a .view of a channels-last convolution output raises); use .reshape/.flatten there to allow it",
                False,
            )
            return
        before_wrap(
            ctx,
            name,
            f"{name} = {name}.to(memory_format={ctx.name('torch')}.channels_last)\n",
        )
        inputs = self._inputs(ctx, name, steps) if input_goes_to_conv(mc) else 0
        also = (
            " and its input batches"
            if inputs
            else " (its input batches keep their layout: the first convolution converts them)"
        )
        ctx.finding(
            anchor,
            CODE,
            f"`{name}` ({cls}: 2-d convolutions, nothing layout-dependent in its forward or the training step) in channels-last memory format{also}: faster convolutions and BatchNorm on GPUs, the same values",
            True,
        )

    @staticmethod
    def _region(ctx: Context, step) -> list[cst.CSTNode]:
        """The step's forward pass and loss: where the model's output is used."""
        body = list(step.block.body)
        if step.forward_first not in body:
            return [step.stmt]
        return body[body.index(step.forward_first) : body.index(step.stmt) + 1]

    def _inputs(self, ctx: Context, name: str, steps) -> int:
        """`x = x.to(device)` of the batch the model gets first: + memory_format=channels_last."""
        a = ctx.a
        done = 0
        for step in steps:
            fwd = next(
                (
                    c
                    for c in a.findall(step.forward_first or step.stmt, m.Call())
                    if dotted(c.func) == name
                ),
                None,
            )
            pos, _ = call_args(fwd) if fwd is not None else ([], {})
            x = dotted(pos[0].value) if pos else None
            loop = a.enclosing_loop(step.stmt)
            if not x or loop is None:
                continue
            for asg in a.findall(loop.body, m.Assign()):
                targets = [
                    dotted(el) for t in asg.targets for el in _flatten_targets(t.target)
                ]
                if x not in targets:
                    continue
                values = (
                    [e.value for e in asg.value.elements]
                    if isinstance(asg.value, cst.Tuple)
                    else [asg.value]
                )
                value = (
                    values[targets.index(x)] if len(values) == len(targets) else None
                )
                if (
                    isinstance(value, cst.Call)
                    and m.matches(value.func, m.Attribute(attr=m.Name("to")))
                    and ctx.editable(value)
                ):
                    _, kw = call_args(value)
                    if "memory_format" not in kw and not any(
                        arg.star for arg in value.args
                    ):
                        ctx.edits.replace(
                            value,
                            lambda n: append_kwarg(
                                n,
                                "memory_format",
                                ctx.expr(f"{ctx.name('torch')}.channels_last"),
                            ),
                        )
                        done += 1
        return done
