"""Training batches that no DataLoader hands out (see ddpify/analysis/batches.py), sharded per rank:

- random draws: each rank re-seeds the generators the draws use with RANK added, once, just
  before the training loop (everything before it, a random split included, stays the same on
  every rank; the model is in sync anyway: DDP broadcasts rank 0's weights at the wrap);
- a loop over range(...) that slices pre-loaded tensors, or over a list of pre-made batches:
  the loop runs over this rank's contiguous share (rank_share), the same length on every rank;
- a loop over the script's own batch iterator (its class with __iter__, a generator function):
  every WORLD_SIZE-th batch from RANK on, in rounds (rank_batches);
- full-batch training whose loss picks rows with an index: the loss reads every
  WORLD_SIZE-th row of the index from RANK on (rank_rows);
- an LBFGS closure, or draws/indices ddpify cannot make per-rank: refused (blocking).
Evaluation loops are not touched: only the loop that feeds a backward pass is."""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import code, dotted
from ddpify.transforms.base import Context, Transform
from ddpify.transforms import batch_scale
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP110",
    "random-draws-per-rank",
    "batches or inputs drawn at random in the training step (no DataLoader, or a GAN's noise beside one): generators re-seeded per rank (RANK added) before training",
    fix=True,
    check="data-sharding",
)
declare(
    "DDP111",
    "rank-share",
    "loop over pre-loaded data or pre-made batches runs over this rank's contiguous share (rank_share)",
    fix=True,
    check="data-sharding",
)
declare(
    "DDP118",
    "rank-batches",
    "loop over the script's own batch iterator (a class with __iter__, a generator) takes this rank's batches (rank_batches)",
    fix=True,
    check="data-sharding",
)
declare(
    "DDP119",
    "full-batch-rows",
    "full-batch training: each step reads this rank's rows of the whole tensors (every WORLD_SIZE-th from RANK)",
    fix=True,
    check="data-sharding",
)
declare(
    "DDP112",
    "rank-rows",
    "full-batch training: the loss reads this rank's rows of its index (rank_rows)",
    fix=True,
    check="data-sharding",
)
declare(
    "DDP109",
    "batches-differ-per-rank",
    "the training batches come from a generator of the script's own made without a seed or from the process's own entropy: they already differ on every rank, so they are left as they are",
)
declare(
    "DDP114",
    "lbfgs-closure",
    "LBFGS closure: its line search uses the rank's own loss, so the ranks diverge",
    severity="blocking",
)
declare(
    "DDP116",
    "random-draws-not-per-rank",
    "random batch draws ddpify cannot make per-rank (own generator, re-seeded in the loop, draw decides the step)",
    severity="blocking",
)
declare(
    "DDP117",
    "full-batch-index-per-rank",
    "full-batch index that may differ per rank (drawn unseeded, or from code ddpify cannot see)",
    severity="blocking",
)

RESEED = {
    # a draw from the generator (the same on every rank until now) plus RANK: a function that
    # runs the loop again on its next call goes on with new draws, not the first ones again
    "torch": "{torch}.manual_seed(int({torch}.randint(2**62, ())) + RANK)",
    "numpy": "{alias}.random.seed(({alias}.random.randint(2**31) + RANK) % 2**32)",
    "random": "{alias}.seed({alias}.getrandbits(64) + RANK)",
}


class BatchesTransform(Transform):
    name = "batches"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        ctx.batches_done = False  # type: ignore[attr-defined]
        if any(ld.role == "train" for ld in a.loaders):
            for (
                step
            ) in a.steps:  # an LBFGS line search is per rank with a DataLoader too
                src = a._closure_step(step)
                if src is not None:
                    ctx.finding(src.node, "DDP114", src.problem)
                    return
            self._noise(ctx)
            return
        sources = []
        for step in a.steps:
            src = a.batch_source(step)
            if src is None:
                return  # SamplerTransform reports DDP024
            sources.append((step, src))
        problems = [(s, src) for s, src in sources if src.problem]
        for step, src in problems:
            code_ = {"closure": "DDP114", "index": "DDP117"}.get(src.kind, "DDP116")
            ctx.finding(
                src.node if src.kind != "random" else step.backward, code_, src.problem
            )
        ctx.batches_done = True  # type: ignore[attr-defined]
        if problems:
            return
        done: set[int] = set()
        for step, src in sources:
            if id(src.node) in done:
                continue
            done.add(id(src.node))
            if not ctx.editable(src.node):
                ctx.skipped_here(
                    src.node, "training batches not sharded per rank", blocking=True
                )
                continue
            getattr(self, f"_{src.kind}")(ctx, step, src)

    # -- random inputs beside a DataLoader ----------------------------------------------
    def _noise(self, ctx: Context) -> None:
        """The loader shards the data, but the step also draws inputs at random (a GAN's noise,
        random masks): from a generator that is the same on every rank (seeded, or set from
        rank 0's seed), every rank would draw the same ones. Re-seed per rank before training,
        as for random batches, unless a draw decides which steps run (then the ranks must agree)."""
        a = ctx.a
        done: set[int] = set()
        for step in a.steps:
            loop, first = a._data_loop(step)
            src = a._random_source(first, loop) if isinstance(loop, cst.For) else None
            if (
                src is None
                or src.problem
                or id(src.node) in done
                or not ctx.editable(src.node)
            ):
                continue
            done.add(id(src.node))
            self._random(
                ctx,
                step,
                src,
                what="inputs drawn at random in the training step",
                batch_note=False,
            )

    # -- random draws -----------------------------------------------------------------
    def _random(
        self,
        ctx: Context,
        step,
        src,
        what: str = "batches drawn at random",
        batch_note: bool = True,
    ) -> None:
        a = ctx.a
        anchor = a.training_anchor(src.loop)
        if anchor is None:
            ctx.finding(
                step.backward,
                "DDP116",
                "the training loop's function is called from several places: re-seed the batch draws with RANK added by hand before training",
            )
            return
        torch = ctx.name("torch")
        lines = [
            "# ddpify: each rank makes its own random draws: its generators go on from a seed of its own (RANK added)"
        ]
        for fam in ("torch", "numpy", "random"):
            if fam in src.families:
                lines.append(RESEED[fam].format(torch=torch, alias=a.module_alias(fam)))
        for k, line in enumerate(lines[1:]):
            ctx.edits.before[anchor].append(
                ctx.stmt((lines[0] + "\n" if k == 0 else "") + line + "\n")
            )
        fams = "/".join(sorted(src.families))
        ctx.finding(
            anchor,
            "DDP110",
            f"{what} ({fams}): before training each rank re-seeds from a draw with RANK added, so the ranks draw different samples (the model stays in sync: DDP broadcasts rank 0's weights)",
            True,
        )
        if batch_note:
            ctx.finding(step.backward, "DDP026", batch_scale.batch_note(ctx), False)

    # -- pre-batched data -------------------------------------------------------------
    def _range(self, ctx: Context, step, src) -> None:
        ctx.edits.replace(
            src.node, lambda n: cst.Call(func=cst.Name("rank_share"), args=[cst.Arg(n)])
        )
        ctx.helpers.add("rank_share")
        ctx.finding(
            src.node,
            "DDP111",
            "the loop over pre-loaded data runs over this rank's contiguous share (rank_share): the same number of steps on every rank, a remainder of fewer than WORLD_SIZE batches dropped",
            True,
        )
        ctx.finding(step.backward, "DDP026", batch_scale.batch_note(ctx), False)

    _sequence = _range

    def _full(self, ctx: Context, step, src) -> None:
        for n in src.reads:
            ctx.edits.replace(
                n,
                lambda x: cst.Subscript(
                    value=x,
                    slice=[
                        cst.SubscriptElement(
                            cst.Slice(
                                lower=cst.Name("RANK"),
                                upper=None,
                                step=cst.Name("WORLD_SIZE"),
                            )
                        )
                    ],
                ),
            )
        what = ", ".join(sorted({n.value for n in src.reads}))
        ctx.finding(
            src.reads[0],
            "DDP119",
            f"full-batch training: each step on this rank reads its rows of {what} (every WORLD_SIZE-th from RANK), so the ranks' mean gradients average to the whole batch's",
            True,
        )

    def _iterable(self, ctx: Context, step, src) -> None:
        ctx.edits.replace(
            src.node,
            lambda n: cst.Call(func=cst.Name("rank_batches"), args=[cst.Arg(n)]),
        )
        ctx.helpers.add("rank_batches")
        ctx.finding(
            src.node,
            "DDP118",
            "the training loop takes this rank's batches of the script's own batch iterator (rank_batches): every WORLD_SIZE-th from RANK on, a last incomplete round dropped, so every rank runs as many steps; each rank still makes every batch",
            True,
        )
        ctx.finding(step.backward, "DDP026", batch_scale.batch_note(ctx), False)

    # -- a source that differs per rank already ----------------------------------------
    def _per_rank(self, ctx: Context, step, src) -> None:
        ctx.finding(
            src.node,
            "DDP109",
            f"the training batches are drawn from `{code(src.node)}`, made without a seed or "
            "seeded from what each process has of its own (os.getpid(), the time, its rank): "
            "every rank already draws batches of its own (rollouts of its own environment), so "
            "they are left as they are",
            False,
        )
        ctx.finding(step.backward, "DDP026", batch_scale.batch_note(ctx), False)

    # -- full-batch index -------------------------------------------------------------
    def _index(self, ctx: Context, step, src) -> None:
        a = ctx.a
        region = [src.node]
        if step.forward_first is not None and step.forward_first is not src.node:
            region.append(step.forward_first)
        for stmt in region:
            for sub in a.findall(stmt, m.Subscript()):
                if (
                    len(sub.slice) == 1
                    and isinstance(sub.slice[0].slice, cst.Index)
                    and dotted(sub.slice[0].slice.value) == src.index
                ):
                    ctx.edits.replace(
                        sub.slice[0].slice.value,
                        lambda n: cst.Call(
                            func=cst.Name("rank_rows"), args=[cst.Arg(n)]
                        ),
                    )
        ctx.helpers.add("rank_rows")
        ctx.finding(
            src.node,
            "DDP112",
            f"full-batch training: the loss reads this rank's rows of `{src.index}` (every WORLD_SIZE-th from RANK on, rank_rows), so the averaged gradient is the full batch's; when len({src.index}) is not a multiple of WORLD_SIZE the shares differ by one row and the rows weigh slightly unequally",
            True,
        )
