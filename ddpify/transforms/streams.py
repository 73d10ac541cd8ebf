"""IterableDataset streams: a sampler cannot shard them, so the training loader reads its stream
through RankShard (a generated helper): each rank, and each DataLoader worker, keeps one item of
every WORLD_SIZE x workers, with the same count on every rank. Only for a stream class defined in
the file, whose __iter__ ddpify can read: one that splits by rank itself, or one defined elsewhere,
is a blocking finding (reading the whole stream on every rank trains on each item N times)."""

from __future__ import annotations

import re

import libcst as cst

from ddpify.analysis import code, dotted
from ddpify.transforms.batch_scale import batch_note
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP019",
    "iterable-dataset-sharded",
    "IterableDataset sharded by rank and DataLoader worker (RankShard), the same count on every rank",
    fix=True,
    check="data-sharding",
)
declare(
    "DDP023",
    "iterable-dataset-elsewhere",
    "IterableDataset defined elsewhere or reading the rank itself: shard it by rank by hand",
    severity="blocking",
)

# streams from libraries: IterableDatasets whose class is not in the file
LIBRARY_STREAMS = (
    "torch.utils.data.ChainDataset",
    "webdataset.WebDataset",
    "webdataset.DataPipeline",
    "torchdata.",
    "datasets.IterableDataset",
)
RANK_AWARE = re.compile(
    r"\b(RANK|WORLD_SIZE|rank|world_size|get_rank|get_world_size|split_dataset_by_node|num_replicas|num_shards|shard_id)\b"
)


def stream_class(a, ds: cst.BaseExpression) -> tuple[str | None, cst.ClassDef | None]:
    """The class name the dataset expression is built from, and its definition in this file."""
    cls_name = None
    if isinstance(ds, cst.Call):
        cls_name = dotted(ds.func)
    else:
        name = dotted(ds)
        for asg in a.assigns:
            if (
                isinstance(asg, cst.Assign)
                and any(dotted(t.target) == name for t in asg.targets)
                and isinstance(asg.value, cst.Call)
            ):
                cls_name = dotted(asg.value.func)
    if not cls_name:
        return None, None
    return cls_name, a.classes.get(cls_name.rsplit(".", 1)[-1])


def library_stream(a, ds: cst.BaseExpression) -> bool:
    """A dataset built by a library's stream class, or load_dataset(..., streaming=True)."""
    values = [ds]
    if isinstance(ds, cst.Name):
        values = a._local_values(a.function_of(ds), ds.value) or [ds]
    for value in values:
        if not isinstance(value, cst.Call):
            continue
        names = a.qualified(value.func)
        if any(
            q == s or (s.endswith(".") and q.startswith(s))
            for q in names
            for s in LIBRARY_STREAMS
        ):
            return True
        if any(q.endswith("load_dataset") for q in names) and any(
            x.keyword is not None
            and x.keyword.value == "streaming"
            and code(x.value) == "True"
            for x in value.args
        ):
            return True
    return False


def _iter_method(a, cls: cst.ClassDef, depth: int = 0) -> cst.FunctionDef | None:
    for stmt in cls.body.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == "__iter__":
            return stmt
    for base in cls.bases:  # an in-file base class may hold it
        name = dotted(base.value)
        parent = a.classes.get(name.rsplit(".", 1)[-1]) if name else None
        if parent is not None and parent is not cls and depth < 8:
            found = _iter_method(a, parent, depth + 1)
            if found is not None:
                return found
    return None


def shard_stream(ctx, ld) -> None:
    """Wrap the training loader's stream in RankShard, or say why not (DDP023, blocking)."""
    a = ctx.a
    name, cls = stream_class(a, ld.dataset)
    what = f"`{name}`" if name else "this IterableDataset"
    manual = "give each rank its share by hand: keep item i where i % WORLD_SIZE == RANK (and split DataLoader workers with get_worker_info()), with the same number of items on every rank"
    if cls is None:
        ctx.finding(
            ld.call,
            "DDP023",
            f"IterableDataset {what} is defined elsewhere: ddpify cannot see how it is read, and every rank would read all of it; {manual}",
            False,
        )
        return
    it = _iter_method(a, cls)
    if it is None:
        ctx.finding(
            ld.call,
            "DDP023",
            f"IterableDataset {what} has no __iter__ in this file: every rank would read all of it; {manual}",
            False,
        )
        return
    text = code(cls)
    if RANK_AWARE.search(text):
        ctx.finding(
            ld.call,
            "DDP023",
            f"IterableDataset {what} reads a rank or world size itself: check it gets RANK and WORLD_SIZE from torchrun's environment and that every rank yields the same number of items",
            False,
        )
        return
    workers_split = "get_worker_info" in text
    extra = ", split_workers=False" if workers_split else ""
    ctx.edits.replace(ld.dataset, lambda n: ctx.expr(f"RankShard({code(n)}{extra})"))
    ctx.helpers.add("shard_stream")
    ctx.require("torch")
    how = (
        "each rank keeps one item of every WORLD_SIZE (its workers already split the stream)"
        if workers_split
        else "each rank and DataLoader worker keeps one item of every WORLD_SIZE x workers"
    )
    ctx.finding(
        ld.call,
        "DDP019",
        f"IterableDataset {what} sharded with RankShard: {how}, the same count on every rank",
        True,
    )
    ctx.finding(ld.call, "DDP026", batch_note(ctx, ld.call), False)
