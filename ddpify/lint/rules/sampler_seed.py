"""A shuffle seed that differs per rank: a DistributedSampler's seed must be the same on every
rank (each rank takes its share of one permutation), and so must the seed of a permutation that
the script splits by rank itself."""

from __future__ import annotations

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import call_args, code, dotted
from ddpify.lint.rules.common import torch_ddp
from ddpify.rules import declare

declare(
    "DDP204",
    "per-rank-shuffle-seed",
    "a shuffle seed that differs per rank: the ranks draw different permutations, so their shares overlap and some samples are never seen",
    severity="blocking",
    tool="lint",
)

SEEDERS = (
    "torch.manual_seed",
    "numpy.random.seed",
    "random.seed",
    "numpy.random.default_rng",
    "random.Random",
    "numpy.random.RandomState",
    "torch.Generator.manual_seed",
)
PERMUTATIONS = (
    "torch.randperm",
    "numpy.random.permutation",
    "random.shuffle",
    "numpy.random.shuffle",
)


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if not torch_ddp(ctx):
        return
    for s in f.samplers:
        _, kw = call_args(s)
        if "seed" in kw and f.ranks.depends(kw["seed"].value):
            ctx.report(
                kw["seed"].value,
                "DDP204",
                f"DistributedSampler(seed={code(kw['seed'].value)}) differs per rank: each rank takes its share of a different permutation, so the shares overlap and some samples are never seen; use the same seed on every rank",
            )
    # a permutation drawn after a per-rank seed (or from a generator seeded per rank), then split
    # by rank by hand: each rank splits a different permutation
    done: set[int] = set()
    for p in a.calls:
        perm = _permuted(ctx, p)
        if perm is None:
            continue
        why = f._draw(p) if not _in_place(ctx, p) else _shuffle_seed(ctx, p)
        if not why:
            continue
        fn = a.function_of(p)
        scope = fn if fn is not None else a.module
        for sub in a.findall(scope, m.Subscript()):
            if (
                dotted(sub.value) == perm
                and f.order(sub) > f.order(p)
                and any(f.ranks.reads_rank(el.slice) for el in sub.slice)
            ):
                if id(scope) in done:
                    break
                done.add(id(scope))
                seeder = next(
                    (c for c in f.per_rank_seeded.values() if f"`{code(c)}`" in why), p
                )
                ctx.report(
                    seeder,
                    "DDP204",
                    f"`{code(p).strip()}` is {why}, and {perm} is then split by rank ({code(sub)}): each rank takes its share of a different permutation, so the shares overlap and some samples are never seen; draw the permutation with a seed that is the same on every rank",
                )
                break


def _in_place(ctx, p: cst.Call) -> bool:
    meth = p.func.attr.value if isinstance(p.func, cst.Attribute) else dotted(p.func)
    return meth == "shuffle"


def _permuted(ctx, p: cst.Call) -> str | None:
    """The name that holds the permutation a call draws (shuffled in place, or assigned)."""
    a = ctx.a
    meth = (
        p.func.attr.value
        if isinstance(p.func, cst.Attribute)
        else (dotted(p.func) or "").rsplit(".", 1)[-1]
    )
    if meth == "shuffle" or a.is_call(p, "random.shuffle", "numpy.random.shuffle"):
        return dotted(p.args[0].value) if p.args else None
    if meth in ("permutation", "randperm", "sample") or a.is_call(p, *PERMUTATIONS):
        return a._assign_target(p)
    return None


def _shuffle_seed(ctx, p: cst.Call) -> str | None:
    """An in-place shuffle: random.shuffle(x) draws from the global generator, rng.shuffle(x) from rng."""
    f = ctx.facts
    if (
        isinstance(p.func, cst.Attribute)
        and dotted(p.func.value) in f.per_rank_generators
    ):
        return f"a shuffle by {dotted(p.func.value)}, seeded per rank"
    return f._draw(p)
