"""The whole model state across ranks (`model-state`): every module the script holds (the trained
model, EMA and momentum copies, teachers, anything no optimizer steps), its parameters and
buffers, at the end and at each checkpoint the script saved.

A norm layer's running statistics without SyncBatchNorm are per rank by design (each rank
normalises its own batches), as is a buffer DDP overwrites from rank 0 at every forward: they
get a tolerance of their own and a note. Everything else must be equal, as parameters are."""

from __future__ import annotations

import math
import re

from ddpify.verify.checks.common import FAIL, NA, PASS, Check, Context, finished, n

# parameters of DDP ranks are bitwise equal in practice (as params-in-sync)
STATE_RTOL = 1e-6
# per-rank statistics: the ranks' last batches differ, moved by the layer's momentum (0.1)
PER_RANK_RTOL = 0.5


def _load(path: str) -> dict | None:
    import torch

    try:
        return torch.load(path, weights_only=True)
    except Exception:
        return None


def _per_rank(kind: str) -> bool:
    return kind in ("buffer:stats", "buffer:broadcast")


def _slices(dump: dict) -> dict[str, tuple[str, list, object]]:
    """{name: (kind, shape, values)} of one rank's dump."""
    out, off = {}, 0
    for name, kind, shape, count in dump["index"]:
        out[name] = (kind, shape, dump["flat"][off : off + count])
        off += count
    return out


def _compare(dumps: dict[int, dict]) -> dict:
    """Per tensor every rank holds, the largest difference of any rank to rank 0:
    {name: (diff, scale, kind, rank)}. What some rank alone holds (a dict rank 0 builds to save
    a checkpoint, an EMA kept on rank 0 only) is no difference between replicas."""
    base = _slices(dumps[0])
    worst: dict[str, tuple[float, float, str, int]] = {}
    for r, d in dumps.items():
        if r == 0:
            continue
        other = _slices(d)
        for name, (kind, shape, a) in base.items():
            if name not in other:
                continue
            if other[name][1] != shape:
                return {"mismatch": r}
            b = other[name][2]
            if not a.numel():
                continue
            diff = (a - b).abs().max().item()
            if math.isnan(diff) and bool(((a != a) == (b != b)).all()):
                diff = (a.nan_to_num() - b.nan_to_num()).abs().max().item()
            scale = max(1.0, a.abs().nan_to_num().max().item())
            if name not in worst or not diff <= worst[name][0]:
                worst[name] = (diff, scale, kind, r)
    return worst


def _root_of(name: str) -> str:
    """The module the script holds that a tensor belongs to: `ema.fc.weight` -> `ema`."""
    return re.split(r"[.\[]", name, maxsplit=1)[0] if not name.startswith("[") else name


def _moment(ctx: Context, state: dict) -> str:
    if state["tag"] == "end":
        saved = [ctx.where(w) for w in (state.get("where") or "").split("; ") if w]
        return "at the end" + (
            f" (after the checkpoint at {', '.join(saved)})" if saved else ""
        )
    return f"at the checkpoint saved after step {state['step']} ({ctx.where(state['where'])})"


def check_model_state(ctx: Context) -> Check:
    run = ctx.candidate
    if ctx.nproc < 2:
        return Check("model-state", NA, "one process: nothing to compare")
    if not finished(run):
        return Check("model-state", NA, "not every rank finished its steps")
    per_rank = {
        r: (run.records.get(r) or {}).get("states") or [] for r in range(ctx.nproc)
    }
    moments = [s for s in per_rank[0] if s.get("tensors")]
    if not moments:
        return Check("model-state", NA, "no module found in what the script holds")
    failures, notes, compared = [], [], []
    for state in moments:
        key = (state["tag"], state["n"])
        others = {
            r: next((s for s in states if (s["tag"], s["n"]) == key), None)
            for r, states in per_rank.items()
        }
        if any(s is None for s in others.values()):
            continue  # a checkpoint some rank never saw (it ended first): the end covers it
        dumps = {r: _load(s["file"]) for r, s in others.items()}
        if any(d is None for d in dumps.values()):
            continue
        worst = _compare(dumps)
        where = _moment(ctx, state)
        if "mismatch" in worst:
            r = worst["mismatch"]
            failures.append(
                (
                    math.inf,
                    where,
                    None,
                    f"rank {r} holds a tensor of another shape than rank 0's",
                )
            )
            continue
        compared.append((state, where))
        for name, (diff, scale, kind, r) in worst.items():
            if kind == "param:stepped":
                continue  # what an optimizer steps is params-in-sync's to judge
            tol = (PER_RANK_RTOL if _per_rank(kind) else STATE_RTOL) * scale
            if diff <= tol:
                if _per_rank(kind) and diff > STATE_RTOL * scale:
                    notes.append((diff, name, kind))
                continue
            failures.append((diff, where, name, kind, r))
    if not compared and not failures:
        return Check("model-state", NA, "the ranks' model state could not be read back")
    last = moments[-1]
    roots = last.get("roots") or []
    shown = ", ".join(f"`{x}`" for x in roots[:4]) + (
        f" and {len(roots) - 4} more" if len(roots) > 4 else ""
    )
    over = f"{n(last.get('numel', 0))} values of {shown}" + (
        f" (one in {last['stride']} compared)" if last.get("stride", 1) > 1 else ""
    )
    when = "at the end" + (
        f" and at {len(compared) - 1} checkpoint{'s' if len(compared) > 2 else ''}"
        if len(compared) > 1
        else ""
    )
    data = {
        "modules": roots,
        "moments": [s["tag"] for s, _ in compared],
        "failures": [list(map(str, f)) for f in failures[:8]],
    }
    note = ""
    if notes:
        diff, name, kind = max(notes)
        why = (
            "norm layers' running statistics: per rank by design without SyncBatchNorm, each rank normalises its own batches"
            if kind == "buffer:stats"
            else "buffers DDP overwrites from rank 0 at every forward"
        )
        note = f"; `{name.rsplit('.', 1)[0]}` differs by up to {diff:.3g} ({why}; allowed {PER_RANK_RTOL:g} of their scale)"
    if not failures:
        return Check(
            "model-state", PASS, f"max |diff| 0 over {over}, {when}{note}", data=data
        )
    # the first moment the ranks differ at, and there the largest difference
    first = [f for f in failures if f[1] == failures[0][1]]
    worst = max(first, key=lambda f: f[0])
    if worst[2] is None:
        return Check(
            "model-state",
            FAIL,
            f"{worst[1]}: {worst[3]}",
            "the ranks hold different models",
            data=data,
        )
    diff, where, name, kind, r = worst
    module = _root_of(name)
    modules = sorted({_root_of(f[2]) for f in failures if f[2]} - {module})
    figure = f"`{module}` differs across ranks {where}: max |diff| {diff:.3g} at `{name}` (rank {r} vs rank 0)"
    if modules:
        figure += f"; also {', '.join(f'`{m}`' for m in modules)}"
    if kind.startswith("buffer"):
        what = f"the buffer `{name}`"
        why = "is updated from each rank's own values, or on some ranks only"
    else:
        what = f"`{module}`, which no optimizer steps,"
        why = (
            "is updated on some ranks only, or from values of each rank's own (an EMA or momentum copy taken of an "
            "unsynchronised model, a teacher updated under a rank-0 guard): update it on every rank, from the "
            "synchronised model, with no rank test around it"
        )
    cause = f"{what} holds different values on different ranks {where}: it {why}"
    return Check("model-state", FAIL, figure, cause, data=data)
