"""Data preparation before training (download, extract, tokenise, write an index), most often
behind `if not os.path.exists(...)`: rank 0 prepares, the other ranks wait at a barrier and
then find the data in place (their own `exists` check is then true), and every rank reads it.

    if RANK != 0:
        dist.barrier()  # rank 0 prepares the data first
    if not os.path.exists(root):      # every rank runs it: rank 0 first, the others after
        download_and_extract(root)
    if RANK == 0:
        dist.barrier()  # the data is in place: the other ranks go on

Every rank calls barrier() once, so the pair never hangs; names the block binds are bound on
every rank. The file writes inside stay on rank 0 (rank0.py). Runs after Rank0Transform: a
block inside rank-0 code, in a loop, in a Dataset's method or that runs the model or a
collective gets no barrier.
"""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis.writes import checks_existence
from ddpify.transforms.base import Context, Transform
from ddpify.transforms.rank0 import Rank0Transform
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare("DDP073", "data-prep-rank0", "data prepared (downloaded, extracted, written) by rank 0 first; the other ranks wait at a barrier", fix=True, check="ranks")

_inside = Rank0Transform._within


class DataPrepTransform(Transform):
    name = "dataprep"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        eff = ctx.effects
        found: list[tuple[cst.CSTNode, str]] = []
        # `if not os.path.exists(p):` whose body prepares files (directly or through a helper)
        for if_ in a.ifs:
            if checks_existence(if_.test) and not isinstance(a.parent.get(if_), cst.If) and eff.prepares(if_.body):
                self._candidate(ctx, if_, found, "prepared")
        # a download (urlretrieve, download_url, Dataset(..., download=True)) or an extraction
        for call in a.calls:
            if eff.downloads(call) or self._download_kwarg(call) or eff.extracts(call):
                self._candidate(ctx, a.statement(call), found, "extracted" if eff.extracts(call) else "downloaded")
        found.sort(key=lambda f: a._order[id(f[0])])
        # statements next to each other in a block share one pair of barriers
        spans: list[list[tuple[cst.CSTNode, str]]] = []
        for stmt, what in found:
            prev = spans[-1][-1][0] if spans else None
            body = list(a.block(stmt).body)
            k = body.index(stmt)
            if prev is not None and k > 0 and body[k - 1] is prev:
                spans[-1].append((stmt, what))
            else:
                spans.append([(stmt, what)])
        dist = ctx.name("dist")
        for span in spans:
            first, last = span[0][0], span[-1][0]
            if all(s in ctx.edits.guarded for s, _ in span):
                # rank 0 alone runs them: the others only wait
                ctx.edits.after[last].append(ctx.stmt(f"{dist}.barrier()  # rank 0 prepares the data; the other ranks wait for it\n"))
            else:
                ctx.edits.before[first].append(ctx.stmt(f"if RANK != 0:\n    {dist}.barrier()  # rank 0 prepares the data first\n"))
                ctx.edits.after[last].append(ctx.stmt(f"if RANK == 0:\n    {dist}.barrier()  # the data is in place: the other ranks go on\n"))
            ctx.barrier_stmts.extend(s for s, _ in span)
            for stmt, what in span:
                ctx.finding(stmt, "DDP073", f"data {what} by rank 0 first; the other ranks wait at a barrier, then find it in place", True)

    @staticmethod
    def _download_kwarg(call: cst.Call) -> bool:
        return any(x.keyword is not None and x.keyword.value == "download" and not m.matches(x.value, m.Name("False")) for x in call.args)

    def _candidate(self, ctx: Context, stmt: cst.CSTNode, found: list, what: str) -> None:
        a = ctx.a
        if not ctx.editable(stmt):
            return
        # out of branches that ask the file system: each rank may answer differently
        while (owner := a.branch_owner(stmt)) is not None and isinstance(owner, cst.If) and checks_existence(owner.test):
            stmt = owner
        if any(stmt is d or _inside(a, stmt, d) for d, _ in found):
            return
        if not isinstance(a.block(stmt), (cst.IndentedBlock, cst.Module)) or a.enclosing_loop(stmt) is not None:
            return
        if a.runs_per_item(stmt):
            return  # per sample or in a worker process (a Dataset's method, Pool.map): no barrier there
        if a.runs_collective(stmt) or a.runs_model(stmt) or self._rank0_only(ctx, stmt):
            return
        body = list(a.block(stmt).body)
        nxt = body[body.index(stmt) + 1] if body.index(stmt) + 1 < len(body) else None
        if nxt is not None and any(b is nxt for b in ctx.barrier_stmts):
            return  # a barrier right after it already (checkpoints.py: the file is read back there)
        found[:] = [(d, w) for d, w in found if not _inside(a, d, stmt)]
        found.append((stmt, what))

    @staticmethod
    def _rank0_only(ctx: Context, stmt: cst.CSTNode) -> bool:
        """stmt is in a statement guarded to rank 0, or in a function such a statement calls (the
        barriers go around stmt: a guard of stmt itself is inside them)."""
        a = ctx.a
        guarded = ctx.edits.guarded
        if any(_inside(a, stmt, g) for g in guarded):
            return True
        fn = a.function_of(stmt)
        if fn is None:
            return False
        return any(a._calls_function_in(c, {fn.name.value}) for g in guarded for c in a.findall(g, m.Call()))

