"""Checkpoints and files read back: loads wait at a barrier (rank 0 may still be writing)
and map storage onto the rank's own device. What is saved needs no change: the model keeps its
name for the plain module (the DDP wrapper has a name of its own), so state dicts carry no
`module.` prefix and a whole pickled model loads without a process group."""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import call_args
from ddpify.analysis.writes import same_file
from ddpify.transforms.base import Context, Transform, append_kwarg
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP071",
    "load-after-barrier",
    "checkpoint loaded after a barrier, onto the rank's own device",
    fix=True,
    check="ranks",
)
declare(
    "DDP072",
    "read-back-barrier",
    "file written by rank 0 and read back by every rank: barrier before the read",
    fix=True,
    check="ranks",
)


class CheckpointTransform(Transform):
    name = "checkpoints"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        self._barriers: set[int] = set()
        for call in a.calls:
            if not ctx.editable(call):
                continue
            if a.is_call(call, "torch.load"):
                if a.runs_per_item(call):
                    continue  # per sample, maybe in a worker process: CPU tensors, no barrier
                pos, kw = call_args(call)
                where = "this rank's device (map_location=LOCAL_DEVICE)"
                if "map_location" not in kw and len(pos) < 2:
                    # what rank 0 saved from cuda:0 goes to this rank's GPU; CPU tensors stay on the
                    # CPU, where the script may keep its model (a --cuda flag left off)
                    mapping = (
                        "LOCAL_DEVICE"
                        if ctx.cpu_only
                        else '{"cuda:0": str(LOCAL_DEVICE)}'
                    )
                    ctx.edits.replace(
                        call,
                        lambda n: append_kwarg(n, "map_location", ctx.expr(mapping)),
                    )
                    if not ctx.cpu_only:
                        where = 'this rank\'s GPU where it was saved on GPU 0, CPU tensors staying on the CPU (map_location={"cuda:0": str(LOCAL_DEVICE)})'
                elif (
                    "map_location" in kw
                    and isinstance(kw["map_location"].value, cst.SimpleString)
                    and "cuda" in kw["map_location"].value.value
                ):
                    ctx.edits.replace(
                        kw["map_location"].value, cst.Name("LOCAL_DEVICE")
                    )
                if a.enclosing_loop(a.statement(call)) is not None:
                    ctx.finding(
                        call,
                        "DDP071",
                        f"loaded onto {where}; no barrier inside a loop",
                        True,
                    )
                    continue
                self._barrier_before(
                    ctx, a.statement(call), "rank 0 may still be writing it"
                )
                ctx.finding(
                    call,
                    "DDP071",
                    f"checkpoint loaded after a barrier, onto {where}",
                    True,
                )
        self._read_back(ctx)

    def _barrier_before(self, ctx: Context, stmt: cst.CSTNode, why: str) -> None:
        a = ctx.a
        stmt = self._outside_branches(a, stmt)
        if id(stmt) in self._barriers or not isinstance(
            a.block(stmt), (cst.IndentedBlock, cst.Module)
        ):
            return
        self._barriers.add(id(stmt))
        ctx.barrier_stmts.append(stmt)
        ctx.edits.before[stmt].append(ctx.stmt(ctx.barrier(stmt, why)))

    @staticmethod
    def _outside_branches(a, stmt: cst.CSTNode) -> cst.CSTNode:
        """The barrier goes before the if/try/with that holds the load: every rank must reach
        it, whatever each one finds on its own disk (`if os.path.exists(ckpt)`), and before
        an `open` of the file."""
        while (owner := a.branch_owner(stmt)) is not None:
            stmt = owner
        return stmt

    @classmethod
    def _per_item(cls, a, call: cst.CSTNode) -> bool:
        """Read per sample or per step, not once by every rank: no barrier."""
        return a.runs_per_item(call) or a.enclosing_loop(a.statement(call)) is not None

    # -- a file rank 0 writes and every rank reads back -----------------------------------
    def _read_back(self, ctx: Context) -> None:
        """cfg written on first run, then read: the other ranks wait for rank 0's file."""
        a = ctx.a
        writes: list[tuple[cst.Call, str]] = []
        reads: list[tuple[cst.Call, str]] = []
        eff = ctx.effects
        for call in a.calls:
            path = eff.written_path(call)
            if path is not None:
                writes.append((call, path))
                continue
            path = eff.read_path(call)
            if path is not None and not self._per_item(a, call):
                reads.append((call, path))
        for rcall, rpath in reads:
            rline = a.pos[rcall].start.line
            fn = a.function_of(rcall)
            for wcall, wpath in writes:
                if (
                    not same_file(wpath, rpath)
                    or a.function_of(wcall) is not fn
                    or a.pos[wcall].start.line >= rline
                ):
                    continue
                stmt = self._outer_in_common_block(
                    a, a.statement(wcall), a.statement(rcall)
                )
                if stmt is not None and ctx.editable(stmt):
                    self._barrier_before(ctx, stmt, "rank 0 writes this file above")
                    ctx.finding(
                        rcall,
                        "DDP072",
                        f"{rpath} is written by rank 0 above and read by every rank: dist.barrier() before the read",
                        True,
                    )
                break

    @staticmethod
    def _outer_in_common_block(
        a, wstmt: cst.CSTNode, rstmt: cst.CSTNode
    ) -> cst.CSTNode | None:
        """The read's ancestor statement in the innermost block that also holds the write."""
        wblocks = []
        cur = wstmt
        while cur is not None:
            wblocks.append(cur)
            cur = a.parent.get(cur)
        wset = {
            id(x) for x in wblocks if isinstance(x, (cst.IndentedBlock, cst.Module))
        }
        child = rstmt
        cur = a.parent.get(rstmt)
        while cur is not None:
            if isinstance(cur, (cst.IndentedBlock, cst.Module)) and id(cur) in wset:
                return child if isinstance(child, cst.BaseStatement) else None
            if isinstance(cur, cst.BaseStatement):
                child = cur
            cur = a.parent.get(cur)
        return None
