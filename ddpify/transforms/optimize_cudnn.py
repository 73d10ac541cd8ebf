"""--optimize: torch.backends.cudnn.benchmark = True (DDP134) for a convolutional model whose
training batches all have one shape (drop_last=True on the training loader): cuDNN then times
its convolution algorithms once per shape and keeps the fastest. Refused where the script asks
for deterministic algorithms or sets cuDNN's modes itself."""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import call_args
from ddpify.analysis.model_code import convolutions
from ddpify.transforms.base import Context, Transform
from ddpify.transforms.optimize_common import (
    anchor_of,
    before_wrap,
    code_of,
    wrapped_models,
)
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP134",
    "optimize-cudnn-benchmark",
    "--optimize: torch.backends.cudnn.benchmark for a convolutional model with fixed input shapes (or why not)",
    fix=True,
    check="throughput",
)

CODE = "DDP134"
DETERMINISM = (
    "torch.use_deterministic_algorithms",
    "torch.backends.cudnn.deterministic",
    "torch.backends.cudnn.benchmark",
)


class CudnnBenchmarkTransform(Transform):
    name = "optimize_cudnn"

    def plan(self, ctx: Context) -> None:
        if "cudnn-benchmark" not in ctx.opts.optimize:
            return
        a = ctx.a
        convs = [
            n
            for n in wrapped_models(ctx)
            if not isinstance(code_of(ctx, n), str) and convolutions(code_of(ctx, n))
        ]
        if not convs:
            return  # cuDNN benchmarking only picks convolution algorithms: nothing to gain
        name = convs[0]
        anchor = anchor_of(ctx, name)
        set_by_script = next(
            (
                n
                for n in a.attributes + a.calls
                if (
                    a.qualified(n.func if isinstance(n, cst.Call) else n)
                    & set(DETERMINISM)
                )
            ),
            None,
        )
        if set_by_script is not None:
            ctx.finding(
                set_by_script,
                CODE,
                "cudnn.benchmark not set: the script chooses cuDNN's modes or deterministic algorithms itself (benchmark mode may pick other algorithms from run to run)",
                False,
            )
            return
        train = [ld for ld in getattr(ctx, "sharded", []) if ld.role == "train"]
        fixed = bool(train) and all(self._drop_last(ld.call) for ld in train)
        if not fixed:
            where = train[0].call if train else anchor
            ctx.finding(
                where,
                CODE,
                "cudnn.benchmark not set: the training loader keeps a smaller last batch (no drop_last=True), so the input shape is not fixed and cuDNN would time its algorithms again for it",
                False,
            )
            return
        before_wrap(ctx, name, f"{ctx.name('torch')}.backends.cudnn.benchmark = True\n")
        ctx.finding(
            anchor,
            CODE,
            f"torch.backends.cudnn.benchmark = True: `{name}` has convolutions and every training batch has one shape (drop_last=True), so cuDNN picks the fastest algorithm once",
            True,
        )

    @staticmethod
    def _drop_last(call: cst.Call) -> bool:
        _, kw = call_args(call)
        return "drop_last" in kw and m.matches(kw["drop_last"].value, m.Name("True"))
