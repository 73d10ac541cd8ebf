"""The checks: each turns what the probe recorded into PASS / FAIL / N/A / INFO, a figure and a cause."""

from __future__ import annotations

import ast
import linecache
import math
import os
import re
from dataclasses import dataclass, field

from ddpify.verify.runner import RunResult

PASS, FAIL, NA, INFO = "PASS", "FAIL", "N/A", "INFO"
# Parameters of DDP ranks are bitwise equal in practice; this only absorbs formatting of float64 copies.
PARAM_RTOL = 1e-6


@dataclass
class Check:
    name: str
    status: str
    figure: str
    cause: str | None = None
    details: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "status": self.status,
            "figure": self.figure,
            "cause": self.cause,
            "details": self.details,
            "data": self.data,
        }


@dataclass
class Context:
    candidate: RunResult
    baseline: RunResult | None
    nproc: int
    steps: int
    exec_path: str  # the file the ranks ran (the converted copy, or the user's file)
    timeout: float = 0.0
    min_scaling: float | None = None
    nnodes: int = 1
    epochs: int | None = None


# Every check's name, in report order (finding codes name the check that proves their fix).
CHECK_NAMES = ("ranks", "devices", "params-in-sync", "even-batches", "data-sharding", "epoch-shuffle", "rank0-writes", "saved",
               "loss", "throughput", "reached", "no-hang")
STOPPED = "the run was stopped before the ranks reported (see no-hang)"


def run_checks(ctx: Context) -> list[Check]:
    if ctx.candidate.hang:
        # Killed ranks never wrote their final records: only what they saved before the stall is known.
        return [
            check_ranks(ctx),
            check_devices(ctx),
            check_params(ctx),
            check_even_batches(ctx),
            *(Check(name, NA, STOPPED) for name in ("data-sharding", "epoch-shuffle", "rank0-writes", "saved", "loss", "throughput", "reached")),
            check_hang(ctx),
        ]
    return [
        check_ranks(ctx),
        check_devices(ctx),
        check_params(ctx),
        check_even_batches(ctx),
        check_sharding(ctx),
        check_epoch_order(ctx),
        check_writes(ctx),
        check_saved(ctx),
        check_loss(ctx),
        check_throughput(ctx),
        check_reached(ctx),
        check_hang(ctx),
    ]


# ------------------------------------------------------------------------ helpers


def _n(x: int) -> str:
    return f"{x:,}"


def _short(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def _where(where: str | None) -> str:
    if not where:
        return "?"
    path, _, line = where.rpartition(":")
    return f"{os.path.basename(path)}:{line}"


def _steps_of(run: RunResult, r: int) -> int:
    rec = run.records.get(r)
    if rec and rec.get("status") != "running":
        return int(rec.get("steps", 0))
    return run.heartbeats.get(r, (0, 0, 0))[0]


def _finished(run: RunResult) -> bool:
    """Every rank ended on its own (stopped at K or script end) with the same step count."""
    recs = [run.records.get(r) for r in range(run.world)]
    if not all(rec and rec.get("status") in ("stopped", "finished") for rec in recs):
        return False
    return len({rec["steps"] for rec in recs}) == 1


def _error_line(rec: dict) -> str:
    err = rec.get("error") or ""
    return err.splitlines()[0][:200] if err else "no error message"


def _tail(text: str, lines: int = 12) -> list[str]:
    return text.rstrip().splitlines()[-lines:]


# ------------------------------------------------------------------------ ranks


def _abort_message(output: str) -> str:
    """The C++ side's last word before an abort: std::terminate's what(), or the fatal error line."""
    lines = output.rstrip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i].strip()
        if line.startswith("what():"):
            return line[len("what():"):].strip()[:300]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(("terminate called", "Fatal Python error")):
            return lines[i].strip()[:300]
    return ""


def _deaths(run: RunResult, exec_path: str = "") -> dict[int, tuple[float, str]]:
    """Every rank that died on its own: (time of death, what killed it), Python errors and fatal signals alike."""
    deaths: dict[int, tuple[float, str]] = {}
    for r in range(run.world):
        rec = run.records.get(r) or {}
        status = rec.get("status")
        exit_ = run.exits.get(r) or {}
        sig = exit_.get("signal")
        if status == "crashed" and rec.get("unused_params"):
            names = rec["unused_params"]
            listed = ", ".join(names[:4]) + (" ..." if len(names) > 4 else "")
            deaths[r] = (rec.get("t_end", math.inf), f"DDP found parameters without a gradient: {listed}")
        elif status == "crashed":
            deaths[r] = (rec.get("t_end", math.inf), _error_line(rec))
        elif status == "exited":
            deaths[r] = (rec.get("t_end", math.inf), f"exited with {rec.get('error')}")
        elif r in run.fatal or (sig and sig != "SIGTERM" and status not in ("stopped", "finished")):
            msg = _abort_message(run.outputs.get(r, ""))
            what = f"killed by {sig}" if sig and sig != "SIGABRT" else "aborted (SIGABRT)" if sig else "died of a fatal signal"
            where = ""
            if r in run.fatal and exec_path:
                # faulthandler's dump: the Python line that called into the C++ code that aborted.
                op, user = _waiting_in(parse_stack(run.fatal[r], os.path.abspath(exec_path)), os.path.abspath(exec_path))
                if user:
                    where = f", in {op} at {os.path.basename(user[0])}:{user[1]}"
            deaths[r] = (run.died_at.get(r, math.inf), f"{what} in C++ code{where}" + (f": {msg}" if msg else ""))
    return deaths


def _batch_counts(rec: dict) -> int | None:
    """Batches per epoch of the rank's first training loader."""
    for e in rec.get("epochs", []):
        if e.get("bw_first") is not None and (e.get("bw_last") or 0) > e["bw_first"]:
            return e.get("num_batches")
    return None


def _uneven(run: RunResult) -> dict[int, int] | None:
    counts = {r: _batch_counts(rec) for r, rec in sorted(run.records.items())}
    counts = {r: c for r, c in counts.items() if c is not None}
    return counts if len(counts) > 1 and len(set(counts.values())) > 1 else None


def _imbalance(counts: dict[int, int]) -> str:
    parts = [f"rank {r}: {c} batches" if i == 0 else f"rank {r}: {c}" for i, (r, c) in enumerate(sorted(counts.items()))]
    return ", ".join(parts)


def _unused_cause(rec: dict) -> str | None:
    names = rec.get("unused_params")
    if not names:
        return None
    listed = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return (
        f"DDP: {len(names)} parameter{'s' if len(names) > 1 else ''} got no gradient in the step: {listed}. "
        "Use them in forward(), remove them (or set requires_grad=False), or pass "
        "find_unused_parameters=True to DistributedDataParallel"
    )


def check_ranks(ctx: Context) -> Check:
    run, n = ctx.candidate, ctx.nproc
    recs = run.records
    problems: list[str] = []
    details: list[str] = []
    started = [r for r in range(n) if r in recs]
    for r in range(n):
        if r not in recs:
            problems.append(f"rank {r} never started")
    initialised = []
    backend = None
    for r in started:
        init = recs[r].get("init")
        if not init:
            if recs[r].get("status") in ("stopped", "finished"):
                problems.append(f"rank {r} never initialised the process group")
            continue
        backend = init["backend"]
        if init["world_size"] != n or init["rank"] != r:
            problems.append(f"rank {r} joined a group as rank {init['rank']} of {init['world_size']}, not {r} of {n}")
        else:
            initialised.append(r)
    deaths = _deaths(run, ctx.exec_path)
    for r in started:
        rec = recs[r]
        status = rec.get("status")
        at = _steps_of(run, r)
        if r in deaths:
            problems.append(f"rank {r} {'crashed' if status == 'crashed' else 'failed'} at step {at}: {deaths[r][1]}")
            if rec.get("traceback"):
                details.append(f"rank {r} traceback:")
                details.extend("  " + line for line in _tail(rec.get("traceback") or "", 20))
            else:
                details.append(f"rank {r} output:")
                details.extend("  " + line for line in _tail(run.outputs.get(r, ""), 8))
        elif status == "running":
            if run.hang:
                why = "stalled (see no-hang)"
            elif deaths:
                why = "was stopped by torchrun after another rank failed"
            else:
                why = "was killed"
            problems.append(f"rank {r} {why}, at step {at} of {ctx.steps}")
    if run.records and not problems:
        ends = {r: recs[r]["steps"] for r in range(n)}
        if len(set(ends.values())) > 1:
            problems.append("ranks ended after different step counts: " + ", ".join(f"rank {r} {s}" for r, s in ends.items()))
    if not started and run.launcher_output:
        details.extend("  " + line for line in _tail(run.launcher_output, 15))
    head = f"{len(started)}/{n} started, {len(initialised)}/{n} initialised"
    if problems:
        cause = problems[0]
        if deaths:
            first = min(deaths, key=lambda r: deaths[r][0])
            cause = f"rank {first} failed first, at step {_steps_of(run, first)}: {deaths[first][1]}"
            if len(deaths) > 1:
                others = sorted(set(deaths) - {first})
                cause += f" (then {'ranks' if len(others) > 1 else 'rank'} {', '.join(map(str, others))} failed: {deaths[others[0]][1][:120]})"
            unused = next((c for c in (_unused_cause(recs.get(r) or {}) for r in sorted(deaths, key=lambda r: deaths[r][0])) if c), None)
            if unused:
                cause = unused
        counts = _uneven(run)
        if counts:
            cause += f"; the ranks had different numbers of batches per epoch ({_imbalance(counts)}): see even-batches"
        return Check("ranks", FAIL, f"{head}; " + "; ".join(problems[:3]), cause, details)
    steps = recs[0]["steps"]
    how = f"reached step {steps}" if steps >= ctx.steps else f"script ended at step {steps} (before K={ctx.steps})"
    if ctx.epochs:
        how = f"stopped after {ctx.epochs} epoch{'s' if ctx.epochs > 1 else ''} at step {steps}" if recs[0].get("status") == "stopped" else f"script ended at step {steps}"
    nodes = f", {ctx.nnodes} nodes" if ctx.nnodes > 1 else ""
    return Check("ranks", PASS, f"{n}/{n} started, initialised ({backend}, world {n}{nodes}), {how}", data={"steps": steps})


def check_even_batches(ctx: Context) -> Check:
    recs = ctx.candidate.records
    if ctx.nproc < 2:
        return Check("even-batches", NA, "one process")
    counts = {r: _batch_counts(rec) for r, rec in sorted(recs.items())}
    known = {r: c for r, c in counts.items() if c is not None}
    if len(known) < 2:
        return Check("even-batches", NA, "no training DataLoader with a length on two ranks")
    if len(set(known.values())) == 1:
        c = next(iter(known.values()))
        return Check("even-batches", PASS, f"{c} batches per epoch on each of {len(known)} ranks")
    figure = "batches per epoch: " + _imbalance(known)
    cause = (
        f"the ranks have different numbers of batches per epoch ({_imbalance(known)}): the rank that runs out "
        "first goes on to other collectives while the others still all-reduce gradients. Shard with "
        "DistributedSampler (it pads every rank to the same count), or drop the remainder, or train under "
        "model.join() (torch.distributed.algorithms.Join)"
    )
    return Check("even-batches", FAIL, figure, cause, data={"batches": known})


# ------------------------------------------------------------------------ devices


def _devices_used(rec: dict) -> set[str]:
    used: set[str] = set()
    for d in rec.get("ddp", []):
        used.update(d.get("devices", []))
    used.update((rec.get("devices") or {}).get("params", []))
    if rec.get("loss_device"):
        used.add(rec["loss_device"])
    return used


def check_devices(ctx: Context) -> Check:
    recs = ctx.candidate.records
    per_rank: dict[int, set[str]] = {r: _devices_used(rec) for r, rec in sorted(recs.items())}
    per_rank = {r: d for r, d in per_rank.items() if d}
    if not per_rank:
        return Check("devices", NA, "no rank got as far as building its model")
    problems: list[str] = []
    owner: dict[str, int] = {}
    for r, used in per_rank.items():
        rec = recs[r]
        cuda = sorted(d for d in used if d.startswith("cuda"))
        if cuda and "cpu" in used and len(used) > 1:
            problems.append(f"rank {r} computed on both {', '.join(sorted(used))}")
        if len(cuda) > 1:
            problems.append(f"rank {r} computed on {len(cuda)} GPUs: {', '.join(cuda)}")
        ids = (rec.get("devices") or {}).get("cuda_param_ids", {})
        for d in cuda:
            phys = ids.get(d, d)
            if phys in owner and owner[phys] != r:
                problems.append(f"ranks {owner[phys]} and {r} both computed on {d}")
            owner.setdefault(phys, r)
    # Memory a rank allocated on a GPU other than its own.
    for r, used in per_rank.items():
        cuda = sorted(d for d in used if d.startswith("cuda"))
        own = int(cuda[0].split(":")[1]) if cuda and ":" in cuda[0] else None
        peak = (recs[r].get("devices") or {}).get("cuda_peak", {})
        for d, nbytes in peak.items():
            if nbytes and own is not None and int(d) != own:
                problems.append(f"rank {r} allocated {nbytes / 2**20:.1f} MiB on cuda:{d}, not its own cuda:{own}")
    devices = [d for d in (used for used in per_rank.values()) if d]
    if not any(d.startswith("cuda") for used in devices for d in used):
        # CPU (gloo) runs: every rank on the host; nothing to share or collide.
        problems = [p for p in problems if "cuda" in p]
    figure = ", ".join(f"rank{r} {'+'.join(sorted(u))}" for r, u in per_rank.items())
    if not problems:
        return Check("devices", PASS, figure)
    cause = problems[0]
    for r in per_rank:
        rec = recs[r]
        if rec.get("local_rank", r) != 0 and not rec.get("set_device") and any(
            d in ("cuda:0", "cuda") for d in per_rank[r]
        ):
            cause = (
                f"torch.cuda.set_device(LOCAL_RANK) is never called: rank {r} (LOCAL_RANK {rec.get('local_rank')}) "
                "put its model on cuda:0, so every rank computes on GPU 0"
            )
            break
    return Check("devices", FAIL, f"{figure}; " + "; ".join(problems[:3]), cause, problems[3:])


# ------------------------------------------------------------------------ parameters


def check_params(ctx: Context) -> Check:
    run = ctx.candidate
    if ctx.nproc < 2:
        return Check("params-in-sync", NA, "one process: nothing to compare")
    if not _finished(run):
        return Check("params-in-sync", NA, "not every rank finished its steps")
    files = {r: run.run_dir / f"rank{r}.params.pt" for r in range(ctx.nproc)}
    if not all(f.exists() for f in files.values()):
        return Check("params-in-sync", NA, "no optimizer or DDP model seen: no parameters to compare")
    import torch

    vecs = {r: torch.load(f, weights_only=True) for r, f in files.items()}
    info = run.records[0].get("params", {})
    numel, stride = info.get("numel", vecs[0].numel()), info.get("stride", 1)
    worst, worst_rank = 0.0, None
    for r in range(1, ctx.nproc):
        if vecs[r].shape != vecs[0].shape:
            return Check(
                "params-in-sync",
                FAIL,
                f"rank {r} has {_n(vecs[r].numel())} parameters, rank 0 {_n(vecs[0].numel())}",
                "the ranks built different models",
            )
        diff = (vecs[r] - vecs[0]).abs().max().item() if vecs[0].numel() else 0.0
        if not diff <= worst:  # NaN counts as the worst
            worst, worst_rank = diff, r
    scale = max(1.0, vecs[0].abs().max().item() if vecs[0].numel() else 1.0)
    over = f"over {_n(numel)} params" + (f" (every {stride}th compared)" if stride > 1 else "")
    figure = f"max |diff| {worst:.3g} {over}" + (f" (rank {worst_rank} vs rank 0)" if worst_rank else "")
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


# ------------------------------------------------------------------------ data


def _training_epochs(rec: dict) -> dict[tuple, list[dict]]:
    """Training epochs (a backward pass happened between their batches), grouped by loader signature."""
    groups: dict[tuple, list[dict]] = {}
    for e in rec.get("epochs", []):
        if e.get("bw_first") is None or e.get("bw_last", 0) <= e["bw_first"]:
            continue
        groups.setdefault((e["dataset"], e["dataset_len"], e["batch_size"]), []).append(e)
    return groups


def check_sharding(ctx: Context) -> Check:
    recs = ctx.candidate.records
    if ctx.nproc < 2:
        return Check("data-sharding", NA, "one process")
    if len(recs) < ctx.nproc:
        return Check("data-sharding", NA, "not every rank recorded its data")
    per_rank = {r: _training_epochs(recs[r]) for r in range(ctx.nproc)}
    keys = set.intersection(*(set(g) for g in per_rank.values())) if per_rank else set()
    if not keys:
        return _check_step_sharding(ctx)
    iterable = {k for k in keys if per_rank[0][k][0].get("iterable")}
    if iterable:
        return _check_iterable_sharding(ctx, per_rank, sorted(iterable, key=str)[0])
    figures, problems, data = [], [], []
    for key in sorted(keys, key=str):
        count = min(len(per_rank[r][key]) for r in range(ctx.nproc))
        for i in range(count):
            eps = [per_rank[r][key][i] for r in range(ctx.nproc)]
            if eps[0].get("replacement"):
                # draws with replacement repeat indices by design: only the same draws on every rank is unsharded
                n = min(len(e["indices"]) for e in eps)
                same = sum(1 for k in range(n) if len({e["indices"][k] for e in eps}) == 1)
                data.append({"epoch": i, "drawn": [len(e["indices"]) for e in eps], "same_position": same})
                if i == 0:
                    figures.append(f"epoch 0: {ctx.nproc} ranks drew with replacement from {key[1]}, the same index at {same} of {n} positions")
                if n and same > max(4 * n / max(key[1] or 1, 1), n / 4):
                    problems.append((i, same, 0, eps))
                continue
            seen: dict = {}
            for r, e in enumerate(eps):
                for idx in set(e["indices"]):
                    seen[idx] = seen.get(idx, 0) + 1
            shared = sum(c - 1 for c in seen.values() if c > 1)
            length = key[1]
            allowed = (-length) % ctx.nproc if length else 0
            drawn = [len(e["indices"]) for e in eps]
            data.append({"epoch": i, "drawn": drawn, "shared": shared, "allowed": allowed})
            if i == 0:
                each = f"{drawn[0]} each" if len(set(drawn)) == 1 else "/".join(map(str, drawn))
                figures.append(f"epoch 0: {ctx.nproc} ranks drew {each} of {length}, {shared} shared (padding allows {allowed})")
            if shared > allowed:
                problems.append((i, shared, allowed, eps))
    if not problems:
        return Check("data-sharding", PASS, "; ".join(figures), data={"epochs": data})
    i, shared, allowed, eps = problems[0]
    e0 = eps[0]
    drawn = [len(e["indices"]) for e in eps]
    each = f"{drawn[0]} each" if len(set(drawn)) == 1 else "/".join(map(str, drawn))
    figure = (
        f"epoch {i}: {ctx.nproc} ranks drew {each} of {e0['dataset_len']}, "
        f"{shared} drawn by more than one rank (padding allows {allowed})"
    )
    if e0.get("replacement"):
        figure = f"epoch {i}: {ctx.nproc} ranks drew with replacement the same index at {shared} positions of {min(drawn)}"
        cause = (f"the training DataLoader ({e0['dataset']}) draws with {e0['sampler']}(replacement=True) from the same "
                 "random state on every rank: give each rank a generator of its own (seeded with RANK added)")
    elif e0["sampler"] != "DistributedSampler":
        cause = (
            f"the training DataLoader ({e0['dataset']}, {e0['dataset_len']} samples) draws with "
            f"{e0['sampler']}, not DistributedSampler: every rank reads the whole dataset"
        )
    elif len({e.get("num_replicas") for e in eps}) == 1 and eps[0].get("num_replicas") != ctx.nproc:
        cause = f"DistributedSampler built with num_replicas={e0.get('num_replicas')}, not the world size {ctx.nproc}"
    elif len({e.get("sampler_rank") for e in eps}) == 1:
        cause = f"DistributedSampler built with rank={e0.get('sampler_rank')} on every rank"
    elif len({e.get("sampler_seed") for e in eps}) > 1:
        seeds = ", ".join(f"rank {r}: seed={e.get('sampler_seed')}" for r, e in enumerate(eps))
        cause = (
            f"the DistributedSampler seeds differ per rank ({seeds}): each rank shuffles the dataset differently "
            "before taking its slice, so the shards overlap. Give every rank the same seed (set_epoch varies it per epoch)"
        )
    else:
        cause = "the ranks' samplers hand out overlapping indices"
    return Check("data-sharding", FAIL, figure, cause, data={"epochs": data})


def _same(a: list[float], b: list[float]) -> bool:
    # the same batch gives bitwise-equal gradients on CPU; a GPU's reduction order may move the last bits
    return all(abs(x - y) <= 1e-6 * max(abs(x), abs(y), 1e-12) for x, y in zip(a, b))


def _check_step_sharding(ctx: Context) -> Check:
    """No DataLoader: compare, step by step, what the DDP model was fed on each rank and the
    gradients each rank computed before DDP averaged them. Equal on every rank at every step:
    the ranks trained on the same data."""
    recs = ctx.candidate.records
    grads = [recs[r].get("grad_prints") or [] for r in range(ctx.nproc)]
    inputs = [recs[r].get("input_prints") or [] for r in range(ctx.nproc)]
    n = min(len(g) for g in grads)
    if n == 0:
        return Check("data-sharding", NA, "no training DataLoader seen, and no backward pass through a DDP model to compare")
    same_grads = sum(1 for i in range(n) if all(_same(grads[r][i], grads[0][i]) for r in range(1, ctx.nproc)))
    k = min(len(x) for x in inputs)
    same_inputs = sum(1 for i in range(k) if all(inputs[r][i] == inputs[0][i] for r in range(1, ctx.nproc)))
    figure = (f"no DataLoader: the DDP model's training inputs were the same on every rank at {same_inputs} of {k} forwards, "
              f"its local gradients at {same_grads} of {n} backward passes")
    data = {"backwards": n, "same_grads": same_grads, "forwards": k, "same_inputs": same_inputs}
    if same_grads == n:
        cause = ("every rank computed the same gradients from the same batches: the training data is not sharded "
                 "(draw per-rank batches: seed with RANK added, or slice the data by RANK/WORLD_SIZE)")
        return Check("data-sharding", FAIL, figure, cause, data=data)
    if same_inputs == k and k:
        figure += " (the same inputs: the loss reads a per-rank part of the output, or per-rank randomness such as dropout differs)"
    return Check("data-sharding", PASS, figure, data=data)


def _check_iterable_sharding(ctx: Context, per_rank: dict, key: tuple) -> Check:
    """IterableDataset: no indices, so compare the ranks' batches (shape and sums) position by position."""
    eps = [per_rank[r][key][0] for r in range(ctx.nproc)]
    prints = [e.get("fingerprints") or [] for e in eps]
    n = min(len(p) for p in prints)
    if n == 0:
        return Check("data-sharding", NA, "IterableDataset: no batch to compare")
    same = sum(1 for i in range(n) if any(prints[a][i] == prints[b][i] for a in range(ctx.nproc) for b in range(a)))
    figure = f"IterableDataset ({eps[0]['dataset']}): {same} of the first {n} batches identical on two or more ranks"
    if same == 0:
        return Check("data-sharding", PASS, figure)
    cause = (
        f"the IterableDataset {eps[0]['dataset']} yields the same items on every rank: "
        "yield only the items i with i % WORLD_SIZE == RANK (and split workers with get_worker_info())"
    )
    return Check("data-sharding", FAIL, figure, cause)


def check_epoch_order(ctx: Context) -> Check:
    recs = ctx.candidate.records
    if not recs:
        return Check("epoch-shuffle", NA, "no rank recorded its data")
    compared, same, no_shuffle, streams = [], [], [], False
    for r, rec in sorted(recs.items()):
        for key, eps in _training_epochs(rec).items():
            if eps[0].get("iterable"):
                streams = True  # no indices: the order of a stream is the dataset's own business
                continue
            for a, b in zip(eps, eps[1:]):
                n = min(len(a["indices"]), len(b["indices"]))
                if n == 0:
                    continue
                compared.append(r)
                if a["indices"][:n] == b["indices"][:n]:
                    if a.get("shuffle") is False:
                        no_shuffle.append(r)
                    else:
                        same.append((r, a, b, n))
    if not compared and streams:
        return Check("epoch-shuffle", NA, "IterableDataset: the stream's order is the dataset's own")
    if not compared:
        if ctx.epochs:
            return Check("epoch-shuffle", NA, f"fewer than two training epochs (--epochs {ctx.epochs}; --epochs 2 compares two)")
        return Check("epoch-shuffle", NA, f"fewer than two training epochs within {ctx.steps} steps (raise --steps, or --epochs 2)")
    if not same:
        if no_shuffle and len(no_shuffle) == len(compared):
            return Check("epoch-shuffle", PASS, "the script does not shuffle: the same order every epoch is expected")
        ranks = sorted(set(compared))
        return Check("epoch-shuffle", PASS, f"order changed between epochs on {len(ranks)}/{len(recs)} ranks")
    r, a, b, n = same[0]
    who = sorted({s[0] for s in same})
    ranks = ("ranks " if len(who) > 1 else "rank ") + ", ".join(map(str, who))
    figure = f"two consecutive epochs drew the same {n} indices in the same order on {ranks}"
    rec = recs[r]
    if a["sampler"] == "DistributedSampler":
        if not rec.get("set_epoch_calls"):
            cause = "DistributedSampler.set_epoch(epoch) is never called: every epoch repeats the order of the first"
        else:
            cause = f"set_epoch is called with the same value every epoch ({a.get('sampler_epoch')})"
    else:
        cause = f"{a['sampler']} yields the same order every epoch though shuffling is on"
    return Check("epoch-shuffle", FAIL, figure, cause)


# ------------------------------------------------------------------------ writes


def _key(w: dict) -> str:
    # Relative to the rank's working directory: under --nnodes, each node's disk.
    return w.get("rel") or w["path"]


def _candidate_writes(ctx: Context) -> dict[str, dict[int, dict]]:
    """{path: {rank: its first write of it}}."""
    by_path: dict[str, dict[int, dict]] = {}
    for r, rec in sorted(ctx.candidate.records.items()):
        for w in rec.get("writes", []):
            by_path.setdefault(_key(w), {}).setdefault(r, w)
    return by_path


def _who(rec: dict, r: int, nnodes: int) -> str:
    if nnodes > 1:
        return f"rank {r} (node {rec.get('node')}, LOCAL_RANK {rec.get('local_rank')})"
    return f"rank {r}"


def check_writes(ctx: Context) -> Check:
    recs = ctx.candidate.records
    if not recs:
        return Check("rank0-writes", NA, "no rank recorded anything")
    by_path = _candidate_writes(ctx)
    problems = []
    for path, ranks in by_path.items():
        if len(ranks) > 1 or any(r != 0 for r in ranks):
            problems.append((path, ranks))
    if not problems:
        files = [_short(p) for p in by_path]
        if not files:
            if _baseline_writes(ctx):
                return Check("rank0-writes", NA, "no rank wrote a file, but the baseline did (see saved)")
            return Check("rank0-writes", PASS, "no rank wrote a file")
        listed = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        return Check("rank0-writes", PASS, f"only rank 0 wrote: {listed}", data={"paths": list(by_path)})
    path, ranks = problems[0]
    who = ", ".join(map(str, sorted(ranks)))
    w = ranks[max(ranks)]
    figure = f"ranks {who} wrote {_short(path)}" if len(ranks) > 1 else f"rank {who} wrote {_short(path)}"
    if len(problems) > 1:
        figure += f" (+{len(problems) - 1} more paths)"
    what = w["kind"]
    cause = f"{what} at {_where(w['where'])} runs on every rank: guard it with `if RANK == 0:`"
    if len(ranks) == 1:
        cause = f"{what} at {_where(w['where'])} runs on rank {who}: only global rank 0 should write"
    local = [r for r in ranks if r != 0 and recs[r].get("local_rank") == 0]
    if ctx.nnodes > 1 and local:
        r = local[0]
        guard = _enclosing_if(*_split_where(w["where"]))
        test = f" `if {guard[1]}:` (line {guard[0]})" if guard else ""
        cause = (
            f"{what} at {_where(w['where'])} also runs on {_who(recs[r], r, ctx.nnodes)}, which wrote {_short(path)} "
            f"on its node's disk: the guard{test} tests the local rank, true once per node; only global rank 0 "
            "should write: test RANK (dist.get_rank() == 0)"
        )
    details = [
        f"{_short(p)}: " + ", ".join(_who(recs[r], r, ctx.nnodes) for r in sorted(rs)) for p, rs in problems
    ]
    return Check("rank0-writes", FAIL, figure, cause, details, data={"problems": [p for p, _ in problems]})


def _split_where(where: str) -> tuple[str, int]:
    path, _, line = where.rpartition(":")
    try:
        return path, int(line)
    except ValueError:
        return path, 0


def _baseline_writes(ctx: Context) -> dict[str, list[dict]]:
    rec = (ctx.baseline.records.get(0) or {}) if ctx.baseline else {}
    out: dict[str, list[dict]] = {}
    for w in rec.get("writes", []):
        out.setdefault(_key(w), []).append(w)
    return out


# ------------------------------------------------------------------------ saved


_SD_VERDICT = {
    "module-prefix": "its keys start with DDP's `module.` (e.g. {sample}), so it does not load into the unwrapped "
    "model: save model.module.state_dict()",
    "ddp-object": "it is the DistributedDataParallel wrapper itself, which cannot be loaded without a process "
    "group: save model.module.state_dict()",
}


def _state_dict_problem(sd: dict) -> str | None:
    verdict = sd.get("verdict")
    if verdict in _SD_VERDICT and (verdict != "module-prefix" or not (sd.get("n_missing") or sd.get("n_unexpected"))):
        sample = ", ".join(sd.get("sample") or []) or "?"
        return _SD_VERDICT[verdict].format(sample=sample)
    if verdict in ("mismatch", "module-prefix"):
        parts = []
        if sd.get("n_missing"):
            parts.append(f"{sd['n_missing']} of the model's keys missing ({', '.join(sd['missing'])})")
        if sd.get("n_unexpected"):
            parts.append(f"{sd['n_unexpected']} unexpected ({', '.join(sd['unexpected'])})")
        if sd.get("shapes"):
            parts.append("shapes differ: " + "; ".join(sd["shapes"]))
        return "it does not load into the unwrapped model: " + ", ".join(parts)
    return None


def _reached_lines(ctx: Context) -> set[int]:
    exec_path = os.path.abspath(ctx.exec_path)
    lines = set()
    for rec in ctx.candidate.records.values():
        for w in rec.get("writes", []):
            path, line = _split_where(w.get("where") or "")
            if os.path.abspath(path) == exec_path:
                lines.add(line)
    return lines


def written_alike(key: str, written) -> bool:
    """The candidate wrote `key`, or a file of the same kind in the same folder: names (and
    folders) that carry an epoch, a step or a time differ from run to run and rank to rank."""
    if key in written:
        return True
    folder, ext = os.path.dirname(key), os.path.splitext(key)[1]
    pattern = re.sub(r"\d+", "#", folder)
    return any(os.path.splitext(k)[1] == ext and re.sub(r"\d+", "#", os.path.dirname(k)) == pattern for k in written)


def check_saved(ctx: Context) -> Check:
    base = _baseline_writes(ctx)
    cand = _candidate_writes(ctx)
    # 1. Every file the baseline wrote, the candidate wrote too (the same name, or one of the same
    #    kind in the same folder when the name carries an epoch or a time).
    missing = [(key, ws) for key, ws in base.items() if not written_alike(key, cand)]
    # 2. Every state dict saved loads into the unwrapped model (keys and shapes).
    bad = []
    checked = 0
    for key, ranks in cand.items():
        for r, w in sorted(ranks.items()):
            for sd in w.get("state_dicts", []):
                if sd.get("verdict") in ("loads", "module-prefix", "mismatch", "ddp-object"):
                    checked += 1
                problem = _state_dict_problem(sd)
                if problem:
                    bad.append((key, r, w, sd, problem))
    if bad:
        key, r, w, sd, problem = bad[0]
        where = "" if sd["at"] == "<object>" else f" (at {sd['at']})"
        figure = f"rank {r} saved {_short(key)}{where}: " + ("DDP `module.` keys" if sd["verdict"] == "module-prefix" else sd["verdict"])
        cause = f"the state dict saved to {_short(key)}{where} at {_where(w['where'])}: {problem}"
        return Check("saved", FAIL, figure, cause, [f"{_short(k)}: {p}" for k, _, _, _, p in bad[1:4]])
    if missing:
        key, ws = missing[0]
        figure = f"the baseline wrote {_short(key)} ({len(ws)}x); no rank of the candidate wrote it"
        if len(missing) > 1:
            figure += f" (+{len(missing) - 1} more files)"
        cause = f"the one-process run wrote {_short(key)} ({ws[0]['kind']} at {_where(ws[0]['where'])}), the candidate never did"
        never = [s for s in _write_sites(ctx.exec_path) if s[0] not in _reached_lines(ctx)]
        kind = ws[0]["kind"].split("(")[0]
        site = next((s for s in never if s[1].startswith(kind)), never[0] if never else None)
        if site:
            guard = _enclosing_if(ctx.exec_path, site[0])
            cause += f": its {site[1]} at line {site[0]} never ran on any rank"
            if guard:
                cause += f", under `if {guard[1]}:` (line {guard[0]}), a condition that was never true"
        details = [f"{_short(k)}: written {len(v)}x by the baseline, never by the candidate" for k, v in missing]
        return Check("saved", FAIL, figure, cause, details)
    parts = []
    if base:
        parts.append(f"the candidate wrote all {len(base)} file{'s' if len(base) > 1 else ''} the baseline wrote")
    if checked:
        parts.append(f"{checked} state dict{'s' if checked > 1 else ''} load{'s' if checked == 1 else ''} into the unwrapped model")
    if not parts:
        if not cand:
            return Check("saved", NA, "nothing saved" + ("" if ctx.baseline else " (no baseline to compare)"))
        return Check("saved", PASS, f"no model state dict among the {len(cand)} files written")
    return Check("saved", PASS, "; ".join(parts))


_WRITERS = ("save", "save_image", "savefig", "to_csv", "savez", "savez_compressed", "write_text", "write_bytes", "dump")


def _write_sites(path: str) -> list[tuple[int, str]]:
    """Calls in the script that write a file: torch.save, open(..., "w"/"a"/"x"), savefig, to_csv, ..."""
    try:
        tree = ast.parse(open(path).read())
    except (OSError, SyntaxError, ValueError):
        return []
    sites = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name == "open":
            mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
            if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and any(c in mode.value for c in "wax"):
                sites.append((node.lineno, f"open({mode.value!r})"))
        elif name in _WRITERS:
            base = ast.unparse(f.value) + "." if isinstance(f, ast.Attribute) else ""
            if name == "save" and base not in ("torch.", ""):
                if not base.startswith(("np.", "numpy.")):
                    continue
            sites.append((node.lineno, f"{base}{name}"))
    return sorted(set(sites))


def _enclosing_if(path: str, line: int) -> tuple[int, str] | None:
    """The innermost `if` whose body holds `line`."""
    try:
        source = open(path).read()
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return None
    found = None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and node.body:
            start, end = node.body[0].lineno, max(getattr(n, "end_lineno", 0) or 0 for n in node.body)
            if start <= line <= end and (found is None or node.lineno > found[0]):
                found = (node.lineno, ast.get_source_segment(source, node.test) or "")
    return found


# ------------------------------------------------------------------------ reached


def check_reached(ctx: Context) -> Check:
    """What the run covered: whole epochs or K steps, and the writes it never got to."""
    rec = ctx.candidate.records.get(0) or {}
    status = rec.get("status")
    never = [s for s in _write_sites(ctx.exec_path) if s[0] not in _reached_lines(ctx)]
    not_reached = ", ".join(f"{what} at line {line}" for line, what in never[:4]) + (
        f" and {len(never) - 4} more" if len(never) > 4 else ""
    )
    train = [e for e in rec.get("epochs", []) if e.get("bw_first") is not None and (e.get("bw_last") or 0) > e["bw_first"]]
    if status == "finished":
        figure = "the script ran to its end"
    elif status == "stopped" and ctx.epochs:
        figure = f"{ctx.epochs} whole epoch{'s' if ctx.epochs > 1 else ''} and the work after {'them' if ctx.epochs > 1 else 'it'} (--epochs)"
    elif status == "stopped" and train and not train[-1].get("complete"):
        last = train[-1]
        of = f" of {last['num_batches']}" if last.get("num_batches") else ""
        figure = (
            f"stopped at step {rec.get('steps')} in epoch {len(train)} (batch {last.get('drawn')}{of}): the end of that "
            "epoch (checkpoints, logs, evaluation) was not reached; --epochs 1 runs whole epochs"
        )
    elif status == "stopped":
        figure = f"stopped at step {rec.get('steps')}"
    else:
        return Check("reached", NA, "rank 0 did not finish (see ranks)")
    if never:
        figure += f"; never reached: {not_reached}"
    return Check("reached", INFO, figure, data={"never_reached": never})


# ------------------------------------------------------------------------ loss


def _diverged(first: float, last: float) -> bool:
    if not (math.isfinite(first) and math.isfinite(last)):
        return True
    return last - first > max(abs(first), 0.01)


def check_loss(ctx: Context) -> Check:
    recs = ctx.candidate.records
    per_rank = {r: rec.get("losses") or [] for r, rec in sorted(recs.items())}
    per_rank = {r: v for r, v in per_rank.items() if v}
    if not per_rank:
        return Check("loss", NA, "no loss recorded (no backward pass)")
    broken = [r for r in range(ctx.nproc) if (recs.get(r) or {}).get("status") not in ("stopped", "finished")]
    if broken:
        return Check("loss", NA, f"rank {broken[0]} did not finish its steps (see ranks): no loss curve to judge")
    if min(len(v) for v in per_rank.values()) < 2 or len(per_rank) < ctx.nproc:
        return Check("loss", NA, "fewer than two losses on some rank: no loss curve to judge")
    for r, losses in per_rank.items():
        for i, v in enumerate(losses):
            if not math.isfinite(v):
                return Check("loss", FAIL, f"rank {r}: loss {v} at backward {i + 1}", "the loss became NaN/inf")
    n = min(len(v) for v in per_rank.values())
    first = sum(v[0] for v in per_rank.values()) / len(per_rank)
    last = sum(v[n - 1] for v in per_rank.values()) / len(per_rank)
    cand = f"candidate {first:.4g} -> {last:.4g} (mean of {len(per_rank)} ranks)"
    data = {"candidate_first": first, "candidate_last": last}
    base_losses = (ctx.baseline.records.get(0) or {}).get("losses") if ctx.baseline else None
    if base_losses:
        bf, bl = base_losses[0], base_losses[-1]
        data.update(baseline_first=bf, baseline_last=bl)
        figure = f"baseline {bf:.4g} -> {bl:.4g}, {cand}"
        if _diverged(first, last) and not _diverged(bf, bl):
            return Check("loss", FAIL, figure, "the candidate's loss diverges where the baseline's does not", data=data)
        return Check("loss", PASS, figure, data=data)
    if _diverged(first, last):
        return Check("loss", FAIL, cand, "the loss diverges", data=data)
    return Check("loss", PASS, cand, data=data)


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
            return Check("optimize-parity", NA, f"rank {r}: no losses recorded by {'the optimised' if not a else 'the plain'} conversion")
        for i, (x, y) in enumerate(zip(a, b)):
            if not (math.isfinite(x) and math.isfinite(y)):
                return Check("optimize-parity", FAIL, f"rank {r}, backward {i + 1}: optimised {x}, plain {y}", "a loss became NaN/inf in one run only" if math.isfinite(x) != math.isfinite(y) else "the loss became NaN/inf")
            rel = abs(x - y) / max(abs(y), 1e-6)
            compared += 1
            if rel > worst[0]:
                worst = (rel, r, i + 1, x, y)
    data = {"max_rel_diff": worst[0], "rtol": OPT_LOSS_RTOL, "compared": compared}
    figure = (f"{compared} losses compared, largest difference {100 * worst[0]:.3f}% (rank {worst[1]}, backward {worst[2]}: {worst[3]:.5g} vs {worst[4]:.5g})"
              if worst[0] else f"{compared} losses compared: identical")
    if worst[0] > OPT_LOSS_RTOL:
        return Check("optimize-parity", FAIL, figure, f"the --optimize conversion computes another training than the plain one (loss differs by more than {100 * OPT_LOSS_RTOL:.0f}%, beyond bf16 noise)", data=data)
    return Check("optimize-parity", PASS, figure, data=data)


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
        cand /= len(rates)  # every rank steps together: the run's step rate is the ranks' mean
    data: dict = {"candidate": cand, "unit": unit}
    base = _rate(ctx.baseline.records.get(0) or {}) if ctx.baseline else None
    if not base or base[1] != unit:
        return Check("throughput", INFO, f"candidate {cand:,.1f} {unit} on {ctx.nproc} ranks", data=data)
    if unit == "samples/s":
        eff = cand / (ctx.nproc * base[0])
    else:
        eff = cand / base[0]  # per-step work unknown: compare step rates
    data.update(baseline=base[0], scaling=eff)
    figure = f"baseline {base[0]:,.1f}, candidate {cand:,.1f} {unit} on {ctx.nproc} ranks, scaling {eff:.0%}"
    if ctx.min_scaling is not None:
        if eff < ctx.min_scaling:
            return Check("throughput", FAIL, figure, f"scaling efficiency below --min-scaling {ctx.min_scaling:.0%}", data=data)
        return Check("throughput", PASS, figure, data=data)
    return Check("throughput", INFO, figure, data=data)


# ------------------------------------------------------------------------ hang

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def parse_stack(text: str, exec_path: str) -> list[tuple[str, int, str]]:
    """The frames (innermost first) of the thread that runs the user's script, from a faulthandler dump."""
    threads: list[list[tuple[str, int, str]]] = []
    for line in text.splitlines():
        if line.startswith(("Thread ", "Current thread ")):
            threads.append([])
            continue
        m = _FRAME.match(line)
        if m and threads:
            threads[-1].append((m["file"], int(m["line"]), m["func"]))
    for frames in threads:
        if any(os.path.abspath(f) == exec_path for f, _, _ in frames):
            return frames
    return threads[0] if threads else []


def _waiting_in(frames: list[tuple[str, int, str]], exec_path: str) -> tuple[str, tuple[str, int, str] | None]:
    user = next((f for f in frames if os.path.abspath(f[0]) == exec_path), None)
    what = None
    for file, _, func in frames:
        if file.endswith("distributed_c10d.py") and not func.startswith("_"):
            what = func
    if what is None:
        if any(f.endswith(("autograd/__init__.py", "autograd/graph.py")) for f, _, _ in frames):
            what = "backward (DDP gradient all-reduce)"
        elif any(f.endswith("parallel/distributed.py") for f, _, _ in frames):
            what = "the DDP forward (buffer broadcast)"
        elif frames:
            what = frames[0][2]
        else:
            what = "?"
    return what, user


def _is_probe(path: str) -> bool:
    return os.path.dirname(os.path.abspath(path)) == os.path.dirname(os.path.abspath(__file__))


def _enclosing_rank_if(path: str, line: int) -> tuple[int, str] | None:
    """The innermost `if` around `line` whose test mentions a rank, e.g. `if rank == 0:`."""
    try:
        tree = ast.parse(open(path).read())
        source = open(path).read()
    except (OSError, SyntaxError, ValueError):
        return None
    found = None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and node.body:
            start, end = node.body[0].lineno, max(getattr(n, "end_lineno", 0) or 0 for n in node.body)
            if start <= line <= end:
                test = ast.get_source_segment(source, node.test) or ""
                if re.search(r"rank|is_main|master", test, re.I) and (found is None or node.lineno > found[0]):
                    found = (node.lineno, test)
    return found


def _parse(path: str):
    try:
        source = open(path).read()
        return source, ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return None, None


def _spans(node, line: int) -> bool:
    return node.lineno <= line <= (getattr(node, "end_lineno", None) or node.lineno)


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _owned_breaks(loop) -> list:
    """The `break` statements that leave this loop (not an inner one)."""
    found, todo = [], list(loop.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Break):
            found.append(node)
        elif not isinstance(node, (*_LOOPS, *_SCOPES)):
            todo.extend(ast.iter_child_nodes(node))
        elif isinstance(node, _LOOPS):
            todo.extend(node.orelse)  # a nested loop's else: belongs to this loop
    return sorted(found, key=lambda n: n.lineno)


def _scope_of(tree, line: int):
    best = tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _spans(node, line):
            if best is tree or node.lineno > best.lineno:
                best = node
    return best


def _loop_left_by_break(path: str, out_line: int, in_line: int) -> tuple | None:
    """A loop that holds in_line but not out_line, in out_line's function, and the break that leaves it."""
    source, tree = _parse(path)
    if tree is None:
        return None
    scope = _scope_of(tree, out_line)
    loops = [n for n in ast.walk(scope) if isinstance(n, _LOOPS) and _spans(n, in_line) and not _spans(n, out_line)]
    loops = [n for n in loops if _scope_of(tree, n.lineno) is scope]
    # The outermost: leaving an inner loop only goes on with the outer one.
    for loop in sorted(loops, key=lambda n: n.lineno):
        breaks = _owned_breaks(loop)
        if breaks:
            head = (ast.get_source_segment(source, loop) or "").splitlines()[0].strip()
            brk = breaks[0]
            guard = _enclosing_if(path, brk.lineno)
            return loop.lineno, head, brk.lineno, guard
    return None


def _loop_exit_causes(run: RunResult, hang: dict, exec_path: str, waits: dict) -> list[str]:
    """A rank that left a loop through a `break` the others did not take: an early stop decided per rank."""
    frames = {r: [f for f in parse_stack(hang["stacks"].get(r, ""), exec_path) if os.path.abspath(f[0]) == exec_path] for r in waits}
    causes = []
    for a in sorted(frames):
        for b in sorted(frames):
            if a == b:
                continue
            for fa in frames[a]:
                for fb in frames[b]:
                    if fa[1] == fb[1]:
                        continue
                    found = _loop_left_by_break(exec_path, fa[1], fb[1])
                    if not found:
                        continue
                    loop_line, head, brk, guard = found
                    under = f" under `if {guard[1]}:` (line {guard[0]})" if guard else ""
                    causes.append(
                        f"rank {a} left the loop `{head}` (line {loop_line}) through the `break` at line {brk}{under} "
                        f"and waits in {waits[a][0]} at line {fa[1]}, while rank {b} is still inside the loop, in "
                        f"{waits[b][0]} at line {fb[1]}: the ranks decided differently. Decide on every rank alike "
                        "(all_reduce the metric first, or broadcast rank 0's decision)"
                    )
                    return causes
    return causes


def check_hang(ctx: Context) -> Check:
    for run in (ctx.baseline, ctx.candidate):
        if run is None or not run.hang:
            continue
        hang, exec_path = run.hang, os.path.abspath(ctx.exec_path)
        parts, details, causes = [], [], []
        waits = {}
        for r in range(run.world):
            waits[r] = _waiting_in(parse_stack(hang["stacks"].get(r, ""), exec_path), exec_path)
        for r in range(run.world):
            frames = parse_stack(hang["stacks"].get(r, ""), exec_path)
            what, user = _waiting_in(frames, exec_path)
            waits[r] = (what, user)
            at = f"{os.path.basename(user[0])}:{user[1]}" if user else "?"
            code = linecache.getline(user[0], user[1]).strip() if user else ""
            parts.append(f"rank {r} in {what} at {at}")
            details.append(f"rank {r} at step {_steps_of(run, r)}: waiting in {what} at {at}" + (f"  `{code}`" if code else ""))
            details.extend(
                "    " + f"{os.path.basename(f)}:{ln} in {fn}" for f, ln, fn in frames[:12] if not _is_probe(f)
            )
            if user:
                guard = _enclosing_rank_if(user[0], user[1])
                inside_too = guard and all(
                    o == r or (waits.get(o, (None, None))[1] and _enclosing_rank_if(*waits[o][1][:2]) == guard)
                    for o in range(run.world)
                )
                if guard and not inside_too:
                    causes.append(
                        f"rank {r} waits in {what} at line {user[1]}, inside `if {guard[1]}:` (line {guard[0]}): "
                        "the other ranks never join this collective"
                    )
        if not causes:
            causes.extend(_loop_exit_causes(run, hang, exec_path, waits))
        kinds = {w[0] for w in waits.values()}
        cause = causes[0] if causes else (
            "the ranks wait in different collectives: " + ", ".join(sorted(kinds)) if len(kinds) > 1 else
            f"no progress for {hang['timeout']:g} s"
        )
        role = "" if run.role == "candidate" else " (baseline, one process)"
        stalled = ("ranks " if len(hang["ranks"]) > 1 else "rank ") + ", ".join(map(str, hang["ranks"]))
        figure = f"{stalled} made no progress for {hang['timeout']:g} s{role}: " + "; ".join(parts)
        return Check("no-hang", FAIL, figure, cause, details, data={"stalled": hang["ranks"]})
    return Check("no-hang", PASS, f"no rank stalled for {ctx.timeout:g} s")
