"""A shuffle seed that differs per rank: a DistributedSampler's seed must be the same on every
rank (each rank takes its share of one permutation), and so must the seed of a permutation that
the script splits by rank itself."""

from __future__ import annotations

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import call_args, code, dotted
from ddpify.lint.rules.common import torch_ddp
from ddpify.rules import declare

declare("DDP204", "per-rank-shuffle-seed", "a shuffle seed that differs per rank: the ranks draw different permutations, so their shares overlap and some samples are never seen", severity="blocking", tool="lint")

SEEDERS = ("torch.manual_seed", "numpy.random.seed", "random.seed", "numpy.random.default_rng", "random.Random",
           "numpy.random.RandomState", "torch.Generator.manual_seed")
PERMUTATIONS = ("torch.randperm", "numpy.random.permutation", "random.shuffle", "numpy.random.shuffle")


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if not torch_ddp(ctx):
        return
    for s in f.samplers:
        _, kw = call_args(s)
        if "seed" in kw and f.ranks.depends(kw["seed"].value):
            ctx.report(kw["seed"].value, "DDP204", f"DistributedSampler(seed={code(kw['seed'].value)}) differs per rank: each rank takes its share of a different permutation, so the shares overlap and some samples are never seen; use the same seed on every rank")
    # a permutation drawn after a per-rank seed, then split by rank by hand
    for c in a.calls:
        if not (a.is_call(c, *SEEDERS) or (isinstance(c.func, cst.Attribute) and c.func.attr.value == "manual_seed")):
            continue
        pos, kw = call_args(c)
        seed = pos[0].value if pos else kw["seed"].value if "seed" in kw else None
        if seed is None or not f.ranks.depends(seed):
            continue
        fn = a.function_of(c)
        scope = fn if fn is not None else a.module
        shuffled: set[str | None] = set()
        for p in a.findall(scope, m.Call()):
            if f.order(p) <= f.order(c):
                continue
            meth = p.func.attr.value if isinstance(p.func, cst.Attribute) else dotted(p.func)
            if meth == "shuffle" or a.is_call(p, "random.shuffle", "numpy.random.shuffle"):
                shuffled.add(dotted(p.args[0].value) if p.args else None)  # in place
            elif meth in ("permutation", "randperm") or a.is_call(p, *PERMUTATIONS):
                shuffled.add(a._assign_target(p))
        shuffled.discard(None)
        for sub in a.findall(scope, m.Subscript()):
            if dotted(sub.value) in shuffled and f.order(sub) > f.order(c) and any(f.ranks.reads_rank(el.slice) for el in sub.slice):
                ctx.report(c, "DDP204", f"{code(c.func)}({code(seed)}) seeds per rank, and {dotted(sub.value)} is a permutation drawn after it and split by rank ({code(sub)}): each rank splits a different permutation, so the shares overlap and some samples are never seen; draw the permutation with a seed that is the same on every rank")
                break
