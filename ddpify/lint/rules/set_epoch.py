"""A DistributedSampler whose epoch loop never calls set_epoch: its shuffle is seeded with the
epoch, so every epoch visits the data in the same order."""

from __future__ import annotations

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import call_args, dotted
from ddpify.lint.rules.common import torch_ddp
from ddpify.rules import declare

declare(
    "DDP203",
    "missing-set-epoch",
    "a DistributedSampler shuffles, but its epoch loop never calls sampler.set_epoch(epoch): every epoch sees the same order",
    severity="blocking",
    tool="lint",
)


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if not torch_ddp(ctx) or not f.samplers:
        return
    if any(
        isinstance(c.func, cst.Attribute) and c.func.attr.value == "set_epoch"
        for c in a.calls
    ):
        return  # set_epoch is called somewhere (on the sampler, the loader's sampler or a batch sampler)
    for ld in a.loaders:
        if ld.role != "train":
            continue
        sampler = f.loader_args(ld.call).get("sampler")
        if sampler is None:
            continue
        used = [v for v in f.sources(sampler) if any(v is s for s in f.samplers)]
        if not used or all(_no_shuffle(v) for v in used):
            continue
        loop = _epoch_loop(ctx, ld)
        if loop is not None:
            ctx.report(
                loop,
                "DDP203",
                f"this epoch loop never calls set_epoch on the DistributedSampler of {ld.target or 'the training loader'}: its shuffle is seeded with the epoch, so every epoch sees the same order; call {ld.target + '.sampler' if ld.target else 'sampler'}.set_epoch(epoch) at the top of each epoch",
            )
            return


def _no_shuffle(call: cst.Call) -> bool:
    pos, kw = call_args(call)
    return "shuffle" in kw and m.matches(kw["shuffle"].value, m.Name("False"))


def _epoch_loop(ctx, ld) -> cst.CSTNode | None:
    """The loop around the loop that iterates the loader: in its function, or around a call of
    that function (a train_one_epoch() called each epoch)."""
    a = ctx.a
    names = [(ld.target, a.function_of(ld.call))] if ld.target else []
    # `return DataLoader(...)` from a factory method: the names its callers bind it to
    names += [
        (name, caller_fn)
        for name, caller_fn in a.returned_as(ld.call)
        if name and caller_fn is not None
    ]
    if not names:
        return None
    sites = [
        site
        for target, origin in names
        for site, _ in a.loader_iteration_sites(target, origin)
    ]
    # `with tqdm(loader) as pbar: for batch in pbar:` iterates the loader too
    for w in a.withs:
        for item in w.items:
            if (
                item.asname is not None
                and isinstance(item.item, cst.Call)
                and any(
                    dotted(x.value) in {n for n, _ in names} for x in item.item.args
                )
            ):
                alias = dotted(item.asname.name)
                sites += [
                    lp
                    for lp in a.findall(w, m.For())
                    if alias and dotted(lp.iter) == alias
                ]
    for site in sites:
        outer = a.enclosing_loop(site)
        if outer is not None:
            return outer
        fn = a.function_of(site)
        for _ in range(3):
            if fn is None:
                break
            calls = [c for c in a.callers(fn) if a.function_of(c) is not fn]
            loops = [a.enclosing_loop(c) for c in calls]
            loop = next((lp for lp in loops if lp is not None), None)
            if loop is not None:
                return loop
            fn = a.function_of(calls[0]) if calls else None
    return None
