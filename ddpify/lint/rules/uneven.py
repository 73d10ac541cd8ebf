"""A loop that runs a collective at every iteration (a DDP forward and backward, an all_reduce, a
function that gathers a metric) over data whose length is each rank's own: a file per rank, a
list strided or chunked by the rank, a subset drawn after a per-rank seed, a sampler or data set
class handed the rank. Unless the counts happen to divide evenly, the rank with more batches
waits in a collective the others never join. DistributedSampler pads every rank to the same count;
DDP's Join context manager shadows the missing collectives."""

from __future__ import annotations

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import code, dotted
from ddpify.lint.rules.divergent_exit import silent_forward
from ddpify.rules import declare

declare(
    "DDP212",
    "uneven-batches-per-rank",
    "a loop that runs collectives (a DDP forward, an all_reduce, a metric gather) iterates data whose length is each rank's own (a file per rank, a list split by the rank, a subset drawn after a per-rank seed): the rank with more batches waits for the others and the job hangs",
    severity="blocking",
    tool="lint",
)

ITER_WRAPPERS = {"enumerate", "zip", "tqdm", "iter", "list", "sorted", "reversed"}
EVEN = (
    "torch.utils.data.distributed.DistributedSampler",
    "torch.utils.data.DistributedSampler",
)
LOADERS = ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if not f.distributed or f.framework is not None:
        return
    for loop in a.findall(a.module, m.For()):
        why = _uneven(ctx, loop.iter)
        if why is None:
            continue
        syncs = [
            c
            for c in a.findall(loop.body, m.Call())
            if f.sync_point(c) is not None
            and not f.reach.divergent(c)
            and not silent_forward(f, c)
        ]
        if not syncs or _joined(ctx, loop):
            continue
        ctx.report(
            loop,
            "DDP212",
            f"this loop iterates `{code(loop.iter).strip()}`, whose length is this rank's own ({why}), and runs {f.sync_point(syncs[0])} at every iteration: a rank with more batches waits in a collective the others never join, and the job hangs; give every rank as many batches (DistributedSampler pads to equal counts, or drop the remainder), or run the loop under `with model.join():`",
        )


def _uneven(ctx, it: cst.BaseExpression, depth: int = 0) -> str | None:
    """Why the iterable's length is each rank's own, or None."""
    a, f = ctx.a, ctx.facts
    if depth > 3:
        return None
    while (
        isinstance(it, cst.Call)
        and (dotted(it.func) or "").rsplit(".", 1)[-1] in ITER_WRAPPERS
        and it.args
    ):
        if (dotted(it.func) or "") == "range":
            return None
        it = it.args[0].value
    if isinstance(it, cst.Call) and dotted(it.func) == "range":
        return None  # a count the script chose, not its data
    if isinstance(it, cst.Name) and depth < 3:  # pbar = tqdm(loader, disable=rank != 0)
        fn = a.function_of(it)
        values = (
            a._local_values(fn, it.value)
            if fn is not None and a._is_local(fn, it.value)
            else a._local_values(None, it.value)
        )
        if values and all(
            isinstance(v, cst.Call)
            and (dotted(v.func) or "").rsplit(".", 1)[-1] in ITER_WRAPPERS
            and v.args
            for v in values
        ):
            whys = [_uneven(ctx, v, depth + 1) for v in values]
            return next((w for w in whys if w), None)
    loader = _loader_call(ctx, it)
    if loader is not None:
        args = f.loader_args(loader)
        sampler = (
            args.get("sampler")
            if args.get("sampler") is not None
            else args.get("batch_sampler")
        )
        if sampler is not None and not m.matches(sampler, m.Name("None")):
            dist_samplers = [
                v
                for v in f.sources(sampler)
                if isinstance(v, cst.Call) and a.qualified(v.func) & set(EVEN)
            ]
            if dist_samplers:
                # padded to the same count on every rank, when every rank hands it the same data set
                inner = (
                    dist_samplers[0].args[0].value if dist_samplers[0].args else None
                )
                why = f.rank_derived_len(inner) if inner is not None else None
                return (
                    f"DistributedSampler over a data set of its own on each rank: {why}"
                    if why
                    else None
                )
            why = f.rank_derived_len(sampler)
            if why:
                return f"its sampler: {why}"
        dataset = args.get("dataset")
        why = f.rank_derived_len(dataset) if dataset is not None else None
        return f"its data set: {why}" if why else None
    if isinstance(it, cst.Call) and f.own_call(it):
        if _structural(ctx, it):
            return None
        for x in it.args:
            why = _uneven(ctx, x.value, depth + 1)
            if why:
                return f"{f.own_call(it)}() is handed {why}"
        return None
    if isinstance(it, cst.Subscript) and _padded_stride(ctx, it):
        return None
    if isinstance(it, (cst.Name, cst.Attribute, cst.Subscript)):
        return f.rank_derived_len(it)
    return None


# what a module has as many of on every rank: its architecture
STRUCTURE = {
    "parameters", "named_parameters", "buffers", "named_buffers", "state_dict", "modules",
    "named_modules", "children", "named_children",
}  # fmt: skip


def _structural(ctx, call: cst.Call) -> bool:
    """A function of the script whose every return lists a module's parameters, buffers or
    submodules: as many on every rank, whatever module it is handed."""
    a = ctx.a
    fns = a.functions.get(ctx.facts.own_call(call) or "", [])[:2]
    returns = [
        r.value
        for fn in fns
        for r in a.findall(fn, m.Return())
        if r.value is not None and a.function_of(r) is fn
    ]
    return bool(returns) and all(
        any(
            isinstance(c.func, cst.Attribute) and c.func.attr.value in STRUCTURE
            for c in a.findall(v, m.Call())
        )
        for v in returns
    )


def _padded_stride(ctx, sub: cst.Subscript) -> bool:
    """`chunks[rank::world]` where chunks comes from `.chunk(n)` with n a multiple of world
    (`n = (... // world + 1) * world`): every rank gets n / world of them."""
    f = ctx.facts
    if len(sub.slice) != 1 or not isinstance(sub.slice[0].slice, cst.Slice):
        return False
    step = dotted(sub.slice[0].slice.step) if sub.slice[0].slice.step else None
    if not step:
        return False
    for v in f.sources(sub.value):
        if not (isinstance(v, cst.Call) and isinstance(v.func, cst.Attribute)):
            continue
        if v.func.attr.value not in ("chunk", "split") or not v.args:
            continue
        for n in f.sources(v.args[0].value):
            if isinstance(n, cst.BinaryOperation) and isinstance(
                n.operator, cst.Multiply
            ):
                if step in (dotted(n.left), dotted(n.right)):
                    return True
    return False


def _loader_call(ctx, it: cst.BaseExpression) -> cst.Call | None:
    a, f = ctx.a, ctx.facts
    for v in f.sources(it):
        if isinstance(v, cst.Call) and (
            a.qualified(v.func) & set(LOADERS) or any(ld.call is v for ld in a.loaders)
        ):
            return v
    d = dotted(it)
    for ld in a.loaders:
        if d and ld.target == d:
            return ld.call
    return None


def _joined(ctx, loop: cst.For) -> bool:
    """The loop runs under DDP's Join context manager (`with Join([model]):`, `with model.join():`)."""
    a = ctx.a
    cur = a.parent.get(loop)
    while cur is not None:
        if isinstance(cur, cst.With):
            for item in cur.items:
                name = (
                    dotted(item.item.func) if isinstance(item.item, cst.Call) else None
                )
                if name and name.rsplit(".", 1)[-1] in ("Join", "join"):
                    return True
        cur = a.parent.get(cur)
    return False
