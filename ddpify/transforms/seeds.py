"""Random state made before training (see ddpify/analysis/seeds.py) is the same on every rank,
as in the one-process program: where the script draws from a global generator before its
training loop with no seed of that generator before the draw (a target function, synthetic
data, a random split), every rank starts that generator from rank 0's seed right after the
process group is set up (one broadcast each, on every rank, also in a run of one process).
A seed of the script's own later on still wins; what each rank draws per step is made per
rank again before the loop where ddpify shards random batches (DDP110)."""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import code
from ddpify.transforms.base import Context, Transform
from ddpify.transforms.launch import prelude_end
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP145",
    "rank0-seed",
    "random draws before training with no seed: every rank seeds those generators from rank 0's seed after the set-up",
    fix=True,
    check="loss",
)
declare(
    "DDP146",
    "draw-before-setup",
    "an unseeded random draw runs before the process group can be set up (among the imports): each rank draws its own",
    severity="blocking",
)
declare(
    "DDP147",
    "own-generator-seed",
    "generator of the script's own made with no seed and drawn from before training: started from rank 0's seed (where ddpify cannot, each rank would draw its own)",
    severity="blocking",
    fix=True,
    check="loss",
)

SEED = {
    "torch": "{alias}.manual_seed(rank0_seed())",
    "numpy": "{alias}.random.seed(rank0_seed() % 2**32)",
    "random": "{alias}.seed(rank0_seed())",
}
LIBRARY = {"torch": "torch", "numpy": "numpy", "random": "random"}


class SeedsTransform(Transform):
    name = "seeds"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        found = a.unseeded_draws()
        draws, tops = found.draws, found.tops
        early = [
            (fam, draws[fam])
            for fam, top in tops.items()
            if self._before_setup(ctx, top)
        ]
        early += [
            (code(ctor.func), draw)
            for ctor, draw, _cond, top in found.own
            if top is not None and self._before_setup(ctx, top)
        ]
        for what, draw in early:
            ctx.finding(
                draw,
                "DDP146",
                f"`{code(draw)}` draws from the {what} generator, unseeded, before the process group can be set up (among the imports): every rank would draw its own; move it below the imports, or seed it before",
                False,
            )
        if early:
            return
        for ctor, draw, cond, top in found.own:
            self._own(ctx, ctor, draw, cond, top)
        if not draws:
            return
        ctx.helpers.add("rank0_seed")
        lines = []
        for fam in ("torch", "numpy", "random"):
            if fam in draws:
                alias = a.module_alias(fam) or ctx.name(LIBRARY[fam])
                lines.append(SEED[fam].format(alias=alias))
        first = sorted(draws, key=lambda f: a.line_col(draws[f]))
        where = ", ".join(
            f"{f}: `{code(draws[f])}`" for f in first
        )  # no line: project mode merges files
        comment = "# ddpify: random draws before training with no seed: every rank starts from rank 0's seed, so all ranks draw the same data, as the one process did\n"
        ctx.after_setup += [
            ctx.stmt((comment if k == 0 else "") + line + "\n")
            for k, line in enumerate(lines)
        ]
        # a draw at module level outside the main guard runs before the guard: set up there
        ctx.setup_before += [top for top in tops.values() if top is not a.main_guard]
        fams = "/".join(sorted(draws))
        ctx.finding(
            draws[first[0]],
            "DDP145",
            f"random draws before training with no seed ({where}): each rank would draw its own and the ranks would train on different data; every rank now seeds {fams} from rank 0's seed right after the process-group set-up (one broadcast each), so all draw the same, as the one process did",
            True,
        )

    def _own(self, ctx: Context, ctor, draw, cond: bool, top) -> None:
        """`rng = np.random.default_rng()` drawn from before training: rank 0's seed for it."""
        what = code(ctor.func)
        if cond or not ctx.editable(ctor):
            ctx.finding(
                draw,
                "DDP147",
                f"`{code(draw)}` draws before training from `{what}()`, made with no seed: each rank would draw its own; give it a seed that is the same on every rank",
                False,
                "blocking",
            )
            return
        seed = "rank0_seed() % 2**32" if "RandomState" in what else "rank0_seed()"
        ctx.edits.replace(
            ctor, lambda n: n.with_changes(args=[cst.Arg(ctx.expr(seed))])
        )
        ctx.helpers.add("rank0_seed")
        if top is not None and top is not ctx.a.main_guard:
            ctx.setup_before.append(top)
        ctx.finding(
            ctor,
            "DDP147",
            f"`{what}()` is made with no seed and draws before training (`{code(draw)}`): each rank would draw its own; it now starts from rank 0's seed (rank0_seed(), one broadcast), so every rank draws the same, as the one process did",
            True,
        )

    @staticmethod
    def _before_setup(ctx: Context, top) -> bool:
        """A module-level statement up to the last leading import, after which the set-up goes."""
        end = prelude_end(ctx)
        ids = [id(s) for s in ctx.a.module.body]
        return (
            end is not None
            and id(top) in ids
            and ids.index(id(top)) <= ids.index(id(end))
        )
