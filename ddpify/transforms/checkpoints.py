"""Checkpoints: loads wait at a barrier (rank 0 may still be writing) and map storage onto
the rank's own device; a whole pickled model is saved unwrapped."""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import call_args, dotted
from ddpify.transforms.base import Context, Transform, append_kwarg


class CheckpointTransform(Transform):
    name = "checkpoints"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        barriers: set[int] = set()
        for call in a.calls:
            if not ctx.editable(call):
                continue
            if a.is_call(call, "torch.load"):
                pos, kw = call_args(call)
                if "map_location" not in kw and len(pos) < 2:
                    ctx.edits.replace(call, lambda n: append_kwarg(n, "map_location", cst.Name("LOCAL_DEVICE")))
                elif "map_location" in kw and isinstance(kw["map_location"].value, cst.SimpleString) and "cuda" in kw["map_location"].value.value:
                    ctx.edits.replace(kw["map_location"].value, cst.Name("LOCAL_DEVICE"))
                stmt = a.statement(call)
                if id(stmt) not in barriers and isinstance(a.block(stmt), (cst.IndentedBlock, cst.Module)):
                    barriers.add(id(stmt))
                    ctx.edits.before[stmt].append(ctx.stmt(f"{ctx.name('dist')}.barrier()  # rank 0 may still be writing it\n"))
                ctx.finding(call, "DDP071", "checkpoint loaded after a barrier, onto this rank's device (map_location=LOCAL_DEVICE)", True)
            elif a.is_call(call, "torch.save"):
                pos, _ = call_args(call)
                if pos and dotted(pos[0].value) in ctx.wrapped:
                    ctx.edits.replace(pos[0].value, lambda n: cst.Attribute(value=n, attr=cst.Name("module")))
                    ctx.finding(call, "DDP070", "the unwrapped model is saved, so it loads without DDP", True)
