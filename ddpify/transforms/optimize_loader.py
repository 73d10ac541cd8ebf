"""--optimize: persistent DataLoader workers (DDP135). With num_workers > 0, the training
loader keeps its worker processes from one epoch to the next (persistent_workers) instead of
starting them again, each with a copy of the dataset. Refused where the training code changes
the dataset between epochs (persistent workers would keep their old copy). prefetch_factor
stays at its default: each extra batch in flight is a whole batch per worker in shared memory.
Workers that persist are not seeded again each epoch: random augmentations after the first
epoch are other draws (verify --optimize's loss comparison allows for that)."""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import call_args, code, dotted
from ddpify.transforms.base import Context, Transform, append_kwarg
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP135",
    "optimize-persistent-workers",
    "--optimize: persistent DataLoader workers on the training loader (or why not)",
    fix=True,
    check="throughput",
)

CODE = "DDP135"


class LoaderWorkersTransform(Transform):
    name = "optimize_loader"

    def plan(self, ctx: Context) -> None:
        if "loader-workers" not in ctx.opts.optimize or ctx.opts.amp == "apex":
            return  # the apex target reproduces the classic recipe as it was
        for ld in getattr(ctx, "sharded", []):
            if ld.role == "train":
                self._loader(ctx, ld)

    def _loader(self, ctx: Context, ld) -> None:
        _, kw = call_args(ld.call)
        workers = kw["num_workers"].value if "num_workers" in kw else None
        if workers is None or (
            isinstance(workers, cst.Integer) and int(workers.value) == 0
        ):
            ctx.finding(
                ld.call,
                CODE,
                "persistent_workers not set: the training loader loads in the main process (num_workers=0), there are no workers to keep",
                False,
            )
            return
        if (
            "persistent_workers" in kw
            or any(x.star == "**" for x in ld.call.args)
            or not ctx.editable(ld.call)
        ):
            ctx.finding(
                ld.call,
                CODE,
                "persistent_workers left as the script has it (given, or maybe in a **dict)",
                False,
            )
            return
        if isinstance(workers, cst.Integer):
            value = "True"
        elif dotted(workers) is not None:
            value = f"{code(workers).strip()} > 0"  # persistent_workers=True with num_workers=0 raises
        else:
            ctx.finding(
                ld.call,
                CODE,
                "persistent_workers not set: num_workers is an expression ddpify does not repeat (it would run twice)",
                False,
            )
            return
        changed = self._dataset_changed(ctx, ld)
        if changed is not None:
            ctx.finding(
                ld.call,
                CODE,
                f"persistent_workers refused: line {ctx.a.pos[changed].start.line} changes the dataset during training, and persistent workers would keep their old copy of it",
                False,
            )
            return
        ctx.edits.replace(
            ld.call, lambda n: append_kwarg(n, "persistent_workers", ctx.expr(value))
        )
        ctx.finding(
            ld.call,
            CODE,
            "persistent_workers on the training loader: its worker processes (and their copies of the dataset) live from one epoch to the next instead of starting again; their random streams go on instead of being seeded again, so random augmentations after the first epoch are other draws from the same distribution",
            True,
        )

    @staticmethod
    def _dataset_changed(ctx: Context, ld) -> cst.CSTNode | None:
        """An assignment to an attribute of the dataset (or loader.dataset), or a method of it
        called inside a loop: the dataset may differ from epoch to epoch."""
        a = ctx.a
        names = {
            n
            for n in (
                dotted(ld.dataset) if ld.dataset is not None else None,
                f"{ld.target}.dataset" if ld.target else None,
            )
            if n
        }
        for asg in a.assigns:
            targets = (
                [t.target for t in asg.targets]
                if isinstance(asg, cst.Assign)
                else [asg.target]
            )
            if any(
                isinstance(t, (cst.Attribute, cst.Subscript))
                and any((dotted(t.value) or "").startswith(n) for n in names)
                for t in targets
            ):
                return asg
        for c in a.calls:
            f = c.func
            if (
                isinstance(f, cst.Attribute)
                and dotted(f.value) in names
                and a.enclosing_loop(c) is not None
            ):
                return c
            if (
                a.enclosing_loop(c) is not None
                and any(dotted(x.value) in names for x in c.args)
                and dotted(f) not in ("len", "DataLoader")
            ):
                if not a.is_call(c, "torch.utils.data.DataLoader"):
                    return c
        return None
