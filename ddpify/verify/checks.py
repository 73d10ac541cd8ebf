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


STOPPED = "the run was stopped before the ranks reported (see no-hang)"


def run_checks(ctx: Context) -> list[Check]:
    if ctx.candidate.hang:
        # Killed ranks never wrote their final records: only what they saved before the stall is known.
        return [
            check_ranks(ctx),
            check_devices(ctx),
            check_params(ctx),
            *(Check(name, NA, STOPPED) for name in ("data-sharding", "epoch-shuffle", "rank0-writes", "loss", "throughput")),
            check_hang(ctx),
        ]
    return [
        check_ranks(ctx),
        check_devices(ctx),
        check_params(ctx),
        check_sharding(ctx),
        check_epoch_order(ctx),
        check_writes(ctx),
        check_loss(ctx),
        check_throughput(ctx),
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
    recs = [run.records.get(r) for r in range(run.nproc)]
    if not all(rec and rec.get("status") in ("stopped", "finished") for rec in recs):
        return False
    return len({rec["steps"] for rec in recs}) == 1


def _error_line(rec: dict) -> str:
    err = rec.get("error") or ""
    return err.splitlines()[0][:200] if err else "no error message"


def _tail(text: str, lines: int = 12) -> list[str]:
    return text.rstrip().splitlines()[-lines:]


# ------------------------------------------------------------------------ ranks


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
    hung = set(run.hang["ranks"]) if run.hang else set()
    crashed = []
    for r in started:
        rec = recs[r]
        status = rec.get("status")
        at = _steps_of(run, r)
        if status == "crashed":
            crashed.append(r)
            problems.append(f"rank {r} crashed at step {at}: {_error_line(rec)}")
            details.append(f"rank {r} traceback:")
            details.extend("  " + line for line in _tail(rec.get("traceback") or "", 20))
        elif status == "exited":
            problems.append(f"rank {r} exited with {rec.get('error')} at step {at}")
            details.extend(f"  rank {r}: {line}" for line in _tail(run.outputs.get(r, ""), 6))
        elif status == "running":
            if run.hang:
                why = "stalled (see no-hang)"
            elif any(recs[o].get("status") in ("crashed", "exited") for o in started if o != r):
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
        cause = next((p for p in problems if "crashed" in p or "exited" in p), problems[0])
        if len(crashed) > 1:
            first = min(crashed, key=lambda r: recs[r].get("t_end", math.inf))
            cause = f"rank {first} failed first: {_error_line(recs[first])}"
        return Check("ranks", FAIL, f"{head}; " + "; ".join(problems[:3]), cause, details)
    steps = recs[0]["steps"]
    how = f"reached step {steps}" if steps >= ctx.steps else f"script ended at step {steps} (before K={ctx.steps})"
    return Check("ranks", PASS, f"{n}/{n} started, initialised ({backend}, world {n}), {how}", data={"steps": steps})


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
        return Check("data-sharding", NA, "no training DataLoader seen (no backward pass between its batches)")
    iterable = {k for k in keys if per_rank[0][k][0].get("iterable")}
    if iterable:
        return _check_iterable_sharding(ctx, per_rank, sorted(iterable, key=str)[0])
    figures, problems, data = [], [], []
    for key in sorted(keys, key=str):
        count = min(len(per_rank[r][key]) for r in range(ctx.nproc))
        for i in range(count):
            eps = [per_rank[r][key][i] for r in range(ctx.nproc)]
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
    if e0["sampler"] != "DistributedSampler":
        cause = (
            f"the training DataLoader ({e0['dataset']}, {e0['dataset_len']} samples) draws with "
            f"{e0['sampler']}, not DistributedSampler: every rank reads the whole dataset"
        )
    elif len({e.get("num_replicas") for e in eps}) == 1 and eps[0].get("num_replicas") != ctx.nproc:
        cause = f"DistributedSampler built with num_replicas={e0.get('num_replicas')}, not the world size {ctx.nproc}"
    elif len({e.get("sampler_rank") for e in eps}) == 1:
        cause = f"DistributedSampler built with rank={e0.get('sampler_rank')} on every rank"
    else:
        cause = "the ranks' samplers hand out overlapping indices"
    return Check("data-sharding", FAIL, figure, cause, data={"epochs": data})


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
        return Check("epoch-shuffle", NA, f"fewer than two training epochs within {ctx.steps} steps (raise --steps)")
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


def check_writes(ctx: Context) -> Check:
    recs = ctx.candidate.records
    if not recs:
        return Check("rank0-writes", NA, "no rank recorded anything")
    by_path: dict[str, dict[int, dict]] = {}
    for r, rec in sorted(recs.items()):
        for w in rec.get("writes", []):
            by_path.setdefault(w["path"], {}).setdefault(r, w)
    problems = []
    for path, ranks in by_path.items():
        if len(ranks) > 1 or any(r != 0 for r in ranks):
            problems.append((path, ranks))
    if not problems:
        files = [_short(p) for p in by_path]
        if not files:
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
    details = [f"{_short(p)}: ranks {', '.join(map(str, sorted(rs)))}" for p, rs in problems]
    return Check("rank0-writes", FAIL, figure, cause, details, data={"problems": [p for p, _ in problems]})


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


def check_hang(ctx: Context) -> Check:
    for run in (ctx.baseline, ctx.candidate):
        if run is None or not run.hang:
            continue
        hang, exec_path = run.hang, os.path.abspath(ctx.exec_path)
        parts, details, causes = [], [], []
        waits = {}
        for r in range(run.nproc):
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
                if guard and "DDP" not in what:
                    causes.append(
                        f"rank {r} waits in {what} at line {user[1]}, inside `if {guard[1]}:` (line {guard[0]}): "
                        "the other ranks never join this collective"
                    )
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
