"""Input pipeline speed: the training DataLoader pins its batches on GPUs, and the batch's
copies to the device in the training loop are asynchronous (non_blocking). Neither changes
what is computed: a pinned host-to-device copy is ordered on the stream like any other."""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import _flatten_targets, call_args, code, dotted
from ddpify.transforms.base import Context, Transform, append_kwarg
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP028",
    "pin-memory",
    "pin_memory on the training DataLoader (GPUs)",
    fix=True,
    check="throughput",
)
declare(
    "DDP029",
    "non-blocking-copies",
    "batch copies to the device made non_blocking",
    fix=True,
    check="throughput",
)


class InputPipelineTransform(Transform):
    name = "input_pipeline"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        if ctx.opts.amp == "apex" or ctx.cpu_only:
            return  # the apex target reproduces the classic recipe as it was; a CPU program copies nothing
        # loaders iterated together (zip(l1, l2)) share their loop: each copy is edited once
        self._done: set[int] = set()
        for ld in getattr(ctx, "sharded", []):
            if ld.role != "train":
                continue
            if not self._device_data(ctx, ld):
                self._pin(ctx, ld.call)
            if ld.target:
                for site, _ in a.loader_iteration_sites(
                    ld.target, a.function_of(ld.stmt)
                ):
                    if isinstance(site, cst.For):
                        self._non_blocking(ctx, site)

    @staticmethod
    def _device_data(ctx: Context, ld) -> bool:
        """A dataset whose tensors may already be on the GPU: pinning those raises."""
        a = ctx.a
        texts = []
        work = [ld.dataset] if ld.dataset is not None else []
        seen = 0
        while work and seen < 16:
            node = work.pop()
            seen += 1
            texts.append(code(node))
            if isinstance(node, cst.Name):
                work.extend(a._local_values(a.function_of(ld.stmt), node.value))
            for c in a.findall(node, m.Call()):
                name = dotted(c.func)
                if name and name.rsplit(".", 1)[-1] in a.classes:
                    texts.append(code(a.classes[name.rsplit(".", 1)[-1]]))
        return any(k in t for t in texts for k in ("cuda", "device", ".to("))

    def _pin(self, ctx: Context, call: cst.Call) -> None:
        _, kw = call_args(call)
        # a **kwargs dict may hold pin_memory already: adding it again is a TypeError
        if (
            "pin_memory" in kw
            or any(x.star == "**" for x in call.args)
            or not ctx.editable(call)
        ):
            return
        ctx.edits.replace(
            call,
            lambda n: append_kwarg(
                n, "pin_memory", ctx.expr('LOCAL_DEVICE.type == "cuda"')
            ),
        )
        ctx.finding(
            call,
            "DDP028",
            "pin_memory on GPUs: batches are copied to the device asynchronously",
            True,
        )

    def _non_blocking(self, ctx: Context, loop: cst.For) -> None:
        a = ctx.a
        names = {dotted(el) for el in _flatten_targets(loop.target)} - {None}
        done = False
        for call in a.findall(
            loop.body, m.Call(func=m.Attribute(attr=m.Name("to") | m.Name("cuda")))
        ):
            recv = call.func.value  # type: ignore[attr-defined]
            while isinstance(recv, (cst.Subscript, cst.Attribute)):
                recv = recv.value
            if (
                not (isinstance(recv, cst.Name) and recv.value in names)
                or not ctx.editable(call)
                or id(call) in self._done
            ):
                continue
            pos, kw = call_args(call)
            if "non_blocking" in kw or any(x.star for x in call.args) or len(pos) > 1:
                continue
            if (
                pos
                and isinstance(pos[0].value, cst.SimpleString)
                and "cpu" in pos[0].value.value
            ):
                continue
            ctx.edits.replace(
                call, lambda n: append_kwarg(n, "non_blocking", cst.Name("True"))
            )
            self._done.add(id(call))
            done = True
        if done:
            ctx.finding(
                loop,
                "DDP029",
                "batch copies to the device are non_blocking (from pinned memory)",
                True,
            )
