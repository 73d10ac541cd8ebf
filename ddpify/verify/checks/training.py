"""Checks on the training itself: parameters in sync across ranks (`params-in-sync`), a sane loss
curve (`loss`), the throughput (`throughput`), and, under --optimize, the optimised conversion
training the same as the plain one (`optimize-parity`)."""

from __future__ import annotations

import math

from ddpify.verify.checks.common import (
    FAIL,
    INFO,
    NA,
    PASS,
    Check,
    Context,
    finished,
    n,
)
from ddpify.verify.runner import RunResult

# Parameters of DDP ranks are bitwise equal in practice; this only absorbs formatting of float64 copies.
PARAM_RTOL = 1e-6


def check_params(ctx: Context) -> Check:
    run = ctx.candidate
    if ctx.nproc < 2:
        return Check("params-in-sync", NA, "one process: nothing to compare")
    if not finished(run):
        return Check("params-in-sync", NA, "not every rank finished its steps")
    files = {r: run.run_dir / f"rank{r}.params.pt" for r in range(ctx.nproc)}
    if not all(f.exists() for f in files.values()):
        return Check(
            "params-in-sync",
            NA,
            "no optimizer or DDP model seen: no parameters to compare",
        )
    import torch

    vecs = {r: torch.load(f, weights_only=True) for r, f in files.items()}
    info = run.records[0].get("params", {})
    numel, stride = info.get("numel", vecs[0].numel()), info.get("stride", 1)
    worst, worst_rank = 0.0, None
    for r in range(1, ctx.nproc):
        if vecs[r].shape != vecs[0].shape:
            figure = f"rank {r} has {n(vecs[r].numel())} parameters, rank 0 {n(vecs[0].numel())}"
            return Check(
                "params-in-sync", FAIL, figure, "the ranks built different models"
            )
        diff = (vecs[r] - vecs[0]).abs().max().item() if vecs[0].numel() else 0.0
        if not diff <= worst:  # NaN counts as the worst
            worst, worst_rank = diff, r
    scale = max(1.0, vecs[0].abs().max().item() if vecs[0].numel() else 1.0)
    over = f"over {n(numel)} params" + (
        f" (one in {stride} compared)" if stride > 1 else ""
    )
    figure = f"max |diff| {worst:.3g} {over}" + (
        f" (rank {worst_rank} vs rank 0)" if worst_rank else ""
    )
    data = {"max_abs_diff": worst, "numel": numel, "stride": stride}
    if worst <= PARAM_RTOL * scale:
        return Check("params-in-sync", PASS, figure, data=data)
    if not any(rec.get("ddp") for rec in run.records.values()):
        cause = (
            "the model is never wrapped in DistributedDataParallel: gradients are not averaged, "
            "so each rank trains its own copy on its own shard"
        )
    else:
        cause = (
            "parameters differ although DistributedDataParallel was used: some parameters are updated "
            "outside the DDP model, or the ranks built different initial weights"
        )
    return Check("params-in-sync", FAIL, figure, cause, data=data)


# ------------------------------------------------------------------------ loss


def diverged(first: float, last: float) -> bool:
    if not (math.isfinite(first) and math.isfinite(last)):
        return True
    return last - first > max(abs(first), 0.01)


def check_loss(ctx: Context) -> Check:
    recs = ctx.candidate.records
    per_rank = {r: rec.get("losses") or [] for r, rec in sorted(recs.items())}
    per_rank = {r: v for r, v in per_rank.items() if v}
    if not per_rank:
        return Check("loss", NA, "no loss recorded (no backward pass)")
    broken = [
        r
        for r in range(ctx.nproc)
        if (recs.get(r) or {}).get("status") not in ("stopped", "finished")
    ]
    if broken:
        return Check(
            "loss",
            NA,
            f"rank {broken[0]} did not finish its steps (see ranks): no loss curve to judge",
        )
    if min(len(v) for v in per_rank.values()) < 2 or len(per_rank) < ctx.nproc:
        return Check(
            "loss", NA, "fewer than two losses on some rank: no loss curve to judge"
        )
    for r, losses in per_rank.items():
        for i, v in enumerate(losses):
            if not math.isfinite(v):
                return Check(
                    "loss",
                    FAIL,
                    f"rank {r}: loss {v} at backward {i + 1}",
                    "the loss became NaN/inf",
                )
    count = min(len(v) for v in per_rank.values())
    first = sum(v[0] for v in per_rank.values()) / len(per_rank)
    last = sum(v[count - 1] for v in per_rank.values()) / len(per_rank)
    cand = f"candidate {first:.4g} -> {last:.4g} (mean of {len(per_rank)} ranks)"
    data = {"candidate_first": first, "candidate_last": last}
    base_losses = (
        (ctx.baseline.records.get(0) or {}).get("losses") if ctx.baseline else None
    )
    if base_losses:
        bf, bl = base_losses[0], base_losses[-1]
        data.update(baseline_first=bf, baseline_last=bl)
        figure = f"baseline {bf:.4g} -> {bl:.4g}, {cand}"
        if diverged(first, last) and not diverged(bf, bl):
            return Check(
                "loss",
                FAIL,
                figure,
                "the candidate's loss diverges where the baseline's does not",
                data=data,
            )
        return Check("loss", PASS, figure, data=data)
    if diverged(first, last):
        return Check("loss", FAIL, cand, "the loss diverges", data=data)
    return Check("loss", PASS, cand, data=data)


# ------------------------------------------------------------------------ throughput


def _rate(rec: dict) -> tuple[float, str] | None:
    marks = rec.get("marks") or []
    if len(marks) < 2:
        return None
    (t0, s0), (t1, s1) = marks[0], marks[-1]
    if t1 <= t0:
        return None
    if rec.get("samples") is not None and s1 > s0:
        return (s1 - s0) / (t1 - t0), "samples/s"
    return (len(marks) - 1) / (t1 - t0), "steps/s"


def check_throughput(ctx: Context) -> Check:
    rates = [_rate(rec) for rec in ctx.candidate.records.values()]
    rates = [x for x in rates if x]
    if not rates or len(rates) < ctx.nproc:
        return Check("throughput", NA, "fewer than two steps on some rank")
    unit = rates[0][1]
    cand = sum(x[0] for x in rates)
    if unit == "steps/s":
        cand /= len(
            rates
        )  # every rank steps together: the run's step rate is the ranks' mean
    data: dict = {"candidate": cand, "unit": unit}
    shared = ""
    if ctx.shared_gpus:
        data["shared_gpus"] = ctx.shared_gpus
        shared = f" (ranks shared {'a GPU' if ctx.shared_gpus == 1 else f'{ctx.shared_gpus} GPUs'}: these figures say nothing about scaling)"
    base = _rate(ctx.baseline.records.get(0) or {}) if ctx.baseline else None
    if not base or base[1] != unit:
        return Check(
            "throughput",
            INFO,
            f"candidate {cand:,.1f} {unit} on {ctx.nproc} ranks{shared}",
            data=data,
        )
    eff = (
        cand / (ctx.nproc * base[0]) if unit == "samples/s" else cand / base[0]
    )  # per-step work unknown: step rates
    data.update(baseline=base[0], scaling=eff)
    figure = f"baseline {base[0]:,.1f}, candidate {cand:,.1f} {unit} on {ctx.nproc} ranks, scaling {eff:.0%}{shared}"
    if ctx.min_scaling is not None and not ctx.shared_gpus:
        if eff < ctx.min_scaling:
            return Check(
                "throughput",
                FAIL,
                figure,
                f"scaling efficiency below --min-scaling {ctx.min_scaling:.0%}",
                data=data,
            )
        return Check("throughput", PASS, figure, data=data)
    return Check("throughput", INFO, figure, data=data)


# ------------------------------------------------------------------------ --optimize parity

# `verify --optimize`: the optimised conversion's losses against the plain conversion's, step by
# step and rank by rank. bf16 keeps 8 significant bits (2^-8 = 0.4% per rounding); two runs that
# differ only in kernel choice and summation order (channels-last, fused optimizers, cuDNN
# benchmark) drift apart by well under 1% over a short run; persistent DataLoader workers draw
# other random augmentations after the first epoch (about 1% on fixture 160's second epoch).
# A changed computation moves further.
OPT_LOSS_RTOL = 0.02


def check_optimized(optimized: RunResult, plain: RunResult, nproc: int) -> Check:
    worst = (0.0, 0, 0, 0.0, 0.0)  # relative difference, rank, step, optimised, plain
    compared = 0
    for r in range(nproc):
        a = (optimized.records.get(r) or {}).get("losses") or []
        b = (plain.records.get(r) or {}).get("losses") or []
        if not a or not b:
            return Check(
                "optimize-parity",
                NA,
                f"rank {r}: no losses recorded by {'the optimised' if not a else 'the plain'} conversion",
            )
        for i, (x, y) in enumerate(zip(a, b)):
            if not (math.isfinite(x) and math.isfinite(y)):
                why = (
                    "a loss became NaN/inf in one run only"
                    if math.isfinite(x) != math.isfinite(y)
                    else "the loss became NaN/inf"
                )
                return Check(
                    "optimize-parity",
                    FAIL,
                    f"rank {r}, backward {i + 1}: optimised {x}, plain {y}",
                    why,
                )
            rel = abs(x - y) / max(abs(y), 1e-6)
            compared += 1
            if rel > worst[0]:
                worst = (rel, r, i + 1, x, y)
    data = {"max_rel_diff": worst[0], "rtol": OPT_LOSS_RTOL, "compared": compared}
    figure = (f"{compared} losses compared, largest difference {100 * worst[0]:.3f}% (rank {worst[1]}, backward {worst[2]}: {worst[3]:.5g} vs {worst[4]:.5g})"
              if worst[0] else f"{compared} losses compared: identical")  # fmt: skip
    if worst[0] > OPT_LOSS_RTOL:
        why = f"the --optimize conversion computes another training than the plain one (loss differs by more than {100 * OPT_LOSS_RTOL:.0f}%, beyond bf16 noise)"
        return Check("optimize-parity", FAIL, figure, why, data=data)
    return Check("optimize-parity", PASS, figure, data=data)
