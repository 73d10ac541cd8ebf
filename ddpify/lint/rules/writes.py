"""Files, checkpoints, logs and trackers written by every rank (N processes writing one path at
once, N tracker runs, N downloads of one archive), and the writer chosen by the local rank (one
writer a node)."""

from __future__ import annotations

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import call_args, code, dotted
from ddpify.analysis.writes import (
    WRITE_METHODS,
    WRITE_MODE,
    WRITERS,
    _arg,
    checks_existence,
)
from ddpify.rules import declare

declare(
    "DDP220",
    "write-on-every-rank",
    "a file, checkpoint, log or tracker written by every rank: the processes overwrite each other's file (or start one run each); write on global rank 0 only",
    severity="blocking",
    tool="lint",
)
declare(
    "DDP221",
    "writer-by-local-rank",
    "the writer is chosen by the local rank: one process per node writes, so a multi-node run writes the same path once a node; use the global rank (RANK == 0) unless each node needs its own copy",
    tool="lint",
)
declare(
    "DDP222",
    "download-on-every-rank",
    "data downloaded or extracted by every rank at once: the processes write the same files concurrently; download on rank 0 first, the others after a barrier",
    severity="blocking",
    tool="lint",
)

declare(
    "DDP223",
    "read-before-written",
    "rank 0 prepares a file or data set (downloads, extracts, writes it) while the other ranks read it with no barrier in between: they read a file that is missing or half-written",
    severity="blocking",
    tool="lint",
)

TRACKERS = (
    "torch.utils.tensorboard.SummaryWriter",
    "torch.utils.tensorboard.writer.SummaryWriter",
    "tensorboardX.SummaryWriter",
    "wandb.init",
    "mlflow.start_run",
    "neptune.init_run",
    "neptune.init",
    "comet_ml.Experiment",
    "clearml.Task.init",
)
MKDIR = ("os.makedirs", "os.mkdir")
NULL_PATHS = ("/dev/null", "os.devnull", "NUL")


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if not f.distributed:
        return
    _read_before_written(ctx)
    prepared: set[int] = (
        set()
    )  # one DDP222 a function: a download and its extraction are one step
    for c in a.calls:
        site = _site(ctx, c)
        if site is None:
            continue
        code_, what, path = site
        if a.runs_per_item(c) or a.unused_in_project(c):
            continue
        if any(
            x.keyword is not None and x.keyword.value == "is_main_process"
            for x in c.args
        ):
            continue  # save_pretrained(..., is_main_process=...): the library writes on the main process
        if path is not None and (
            any(f.ranks.reads_rank(v) for v in f.sources(path))
            or any(n in code(path) for n in NULL_PATHS)
        ):
            continue  # a file of this rank's own, or none
        if path is not None and _per_item(ctx, c, path):
            continue  # a file per sample of this rank's shard (`for p in predictions: open(p["file_name"])`)
        kind = f.reach.guard_kind(c)
        if kind is None:
            if not f.reach.every_rank(c):
                continue  # never called here, or not known
            if code_ == "DDP222":
                if _rank0_first(ctx, c) or id(a.function_of(c)) in prepared:
                    continue
                prepared.add(id(a.function_of(c)))
                ctx.report(
                    c,
                    "DDP222",
                    f"{what} on every rank at once: the processes write the same files concurrently (a torn archive, a half-written file another rank reads); download on rank 0 first (`if rank == 0:` then `dist.barrier()` on every rank), or under a rank-0-first context",
                )
            elif code_ == "mkdir":
                if any(checks_existence(t) for t, _ in f.reach.conditions(c)):
                    continue
                ctx.report(
                    c,
                    "DDP220",
                    f"{what} without exist_ok=True on every rank: the first rank creates the directory and the others raise FileExistsError; pass exist_ok=True, or create it on global rank 0 only",
                )
            else:
                ctx.report(
                    c,
                    "DDP220",
                    f"{what} runs on every rank: {'each rank starts its own run' if code_ == 'tracker' else 'the processes write the same file at once and overwrite each other'}; do it on global rank 0 only (`if dist.get_rank() == 0:`)",
                )
        elif kind == "local" and code_ not in ("DDP222", "mkdir"):
            test = next((t for t, _ in f.reach.rank_conditions(c)), None)
            where = f" (`{code(test)}`)" if test is not None else ""
            ctx.report(
                c,
                "DDP221",
                f"{what} is decided by the local rank{where}: one process a node writes, so on several nodes the same path is written once a node; use the global rank (RANK == 0 / dist.get_rank() == 0) unless each node needs its own copy",
            )


def _read_before_written(ctx) -> None:
    """`if rank == 0: ds = Data(root, download=True) else: ds = Data(root)` (or the read after the
    `if`) with no barrier between: the other ranks read before rank 0 has written."""
    a, f = ctx.a, ctx.facts
    for c in a.calls:
        if not (
            ctx.effects.downloads(c) or ctx.effects.extracts(c) or _download_kwarg(c)
        ):
            continue
        runs = f.reach.local(c)
        if not f.reach.rank_conditions(c) or runs[1] is not False:
            continue  # rank 1 prepares too: DDP222's case
        fn = a.function_of(c)
        name = (dotted(c.func) or "").rsplit(".", 1)[-1]
        first = code(c.args[0].value) if c.args else None
        # what rank 0's block prepares: the arguments of its calls (paths, roots)
        block = a.ancestor(c, cst.If)
        prepared = {
            code(x.value)
            for b in (a.findall(block.body, m.Call()) if block is not None else [c])
            for x in b.args
            if isinstance(x.value, (cst.SimpleString, cst.Name, cst.Attribute))
        }
        for r in a.calls:
            if r is c or a.function_of(r) is not fn:
                continue
            same = (dotted(r.func) or "").rsplit(".", 1)[-1] == name and (
                first is None or (r.args and code(r.args[0].value) == first)
            )
            after_block = block is not None and f.order(r) >= a._subtree_end(block)
            shares = (
                after_block
                and f.own_call(r) is not None
                and any(code(x.value) in prepared for x in r.args)
            )
            if not (same or shares):
                continue
            if f.reach.local(r)[1] is False:
                continue  # rank 1 does not read it here
            if not (f.exclusive(r, c) or f.order(r) > f.order(c)):
                continue
            lo, hi = (f.order(c), f.order(r))
            if any(
                a.function_of(b) is fn
                and lo < f.order(b) < hi
                and f.collective(b) is not None
                for b in a.calls
            ) and not f.exclusive(r, c):
                continue  # a barrier in between
            ctx.report(
                r,
                "DDP223",
                f'`{code(r).strip()}` reads what `{code(c).strip()}` prepares on rank 0 only, with no barrier in between: the other ranks read before rank 0 has written it ("not found", a truncated file); call dist.barrier() on every rank after rank 0 prepares, and read after it',
            )
            break


def _per_item(ctx, c: cst.Call, path) -> bool:
    """The path is built from the target of a loop around the call: one file per item."""
    a = ctx.a
    loop = a.enclosing_loop(c)
    while loop is not None:
        if isinstance(loop, cst.For):
            names = {n.value for n in a.findall(loop.target, m.Name())}
            if names & {n.value for n in a.findall(path, m.Name())}:
                return True
        loop = a.enclosing_loop(loop)
    return False


def _site(ctx, c: cst.Call):
    """(kind, what, path node) of a call that writes, creates a tracker or downloads; None otherwise."""
    a, eff = ctx.a, ctx.effects
    qs = a.qualified(c.func)
    name = dotted(c.func) or code(c.func)
    if qs & set(TRACKERS):
        return "tracker", f"{name}(...)", _log_dir(c)
    if eff.downloads(c) or eff.extracts(c) or _download_kwarg(c):
        verb = (
            "extracts"
            if eff.extracts(c) and not eff.downloads(c) and not _download_kwarg(c)
            else "downloads"
        )
        return "DDP222", f"{name}(...) {verb}", None
    if qs & set(MKDIR):
        _, kw = call_args(c)
        if "exist_ok" in kw and not m.matches(kw["exist_ok"].value, m.Name("False")):
            return None
        return (
            "mkdir",
            f"{name}({code(c.args[0].value) if c.args else ''})",
            c.args[0].value if c.args else None,
        )
    mode = eff.open_mode(c)
    if mode is not None:
        if not WRITE_MODE.search(mode):
            return None
        target = (
            c.args[0].value
            if m.matches(c.func, m.Name("open")) and c.args
            else getattr(c.func, "value", None)
        )
        return (
            "file",
            f"open({code(target) if target is not None else ''}, {mode!r})",
            target,
        )
    handler = eff.file_handler(c)
    if handler is not None:
        return "file", f"{name}({code(handler)})", handler
    writer = eff.writer(c)
    if writer is not None:
        for q in qs:
            if q in WRITERS:
                if WRITERS[q] is None:
                    return None  # json.dump(x, f): the open() of f is what writes
                path = _arg(c, WRITERS[q])
                return (
                    "file",
                    f"{name}({'..., ' if WRITERS[q][0] else ''}{code(path) if path is not None else ''})",
                    path,
                )
        if isinstance(c.func, cst.Attribute) and c.func.attr.value in WRITE_METHODS:
            where = WRITE_METHODS[c.func.attr.value]
            path = c.func.value if where == "self" else _arg(c, where)  # type: ignore[arg-type]
            return (
                "file",
                f"{name}({code(path) if path is not None and where != 'self' else ''})",
                path,
            )
        return "file", f"{name}(...)", next((x.value for x in c.args), None)
    return None


def _download_kwarg(c: cst.Call) -> bool:
    return any(
        x.keyword is not None
        and x.keyword.value == "download"
        and m.matches(x.value, m.Name("True"))
        for x in c.args
    )


def _log_dir(c: cst.Call):
    _, kw = call_args(c)
    for k in ("log_dir", "logdir", "dir", "name", "project"):
        if k in kw:
            return kw[k].value
    return c.args[0].value if c.args and c.args[0].keyword is None else None


def _rank0_first(ctx, c: cst.Call) -> bool:
    """Rank 0 prepares first: a barrier that rank 0 skips comes before the call in its function
    (`if rank != 0: dist.barrier()`), or the call is in a rank-0-first context manager
    (`with accelerator.main_process_first():`, `torch_distributed_zero_first(rank)`)."""
    a, f = ctx.a, ctx.facts
    fn = a.function_of(c)
    for b in a.calls:
        if (
            a.function_of(b) is fn
            and f.order(b) < f.order(c)
            and (dotted(b.func) or "").endswith("barrier")
        ):
            if f.reach.local(b)[0] is False:
                return True
    cur = a.parent.get(c)
    while cur is not None:
        if isinstance(cur, cst.With):
            for item in cur.items:
                name = (
                    dotted(item.item.func)
                    if isinstance(item.item, cst.Call)
                    else dotted(item.item)
                ) or ""
                if "first" in name.rsplit(".", 1)[-1]:
                    return True
        cur = a.parent.get(cur)
    return False
