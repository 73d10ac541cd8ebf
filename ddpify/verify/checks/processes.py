"""Checks on the processes: every rank started, joined the group and ended well (`ranks`), each
computed on its own device (`devices`), and, in project mode, imported the converted modules
(`imports`)."""

from __future__ import annotations

import math
import os
import re

from ddpify.verify.checks.common import (
    FAIL,
    NA,
    PASS,
    Check,
    Context,
    error_line,
    plural,
    steps_of,
    tail,
    training_epochs,
    user_line,
)
from ddpify.verify.checks.hang import collective_cause, parse_stack, waiting_in
from ddpify.verify.runner import RunResult


def _abort_message(output: str) -> str:
    """The C++ side's last word before an abort: std::terminate's what(), or the fatal error line."""
    lines = output.rstrip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i].strip()
        if line.startswith("what():"):
            return line[len("what():") :].strip()[:300]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(("terminate called", "Fatal Python error")):
            return lines[i].strip()[:300]
    return ""


def deaths(ctx: Context, run: RunResult) -> dict[int, tuple[float, str]]:
    """Every rank that died on its own: (time of death, what killed it), Python errors and fatal signals alike."""
    out: dict[int, tuple[float, str]] = {}
    exec_path = os.path.abspath(ctx.exec_path)
    for r in range(run.world):
        rec = run.records.get(r) or {}
        status = rec.get("status")
        sig = (run.exits.get(r) or {}).get("signal")
        if status == "crashed" and rec.get("unused_params"):
            names = rec["unused_params"]
            listed = ", ".join(names[:4]) + (" ..." if len(names) > 4 else "")
            out[r] = (
                rec.get("t_end", math.inf),
                f"DDP found parameters without a gradient: {listed}",
            )
        elif status == "crashed":
            at = user_line(ctx, rec.get("traceback") or "")
            out[r] = (
                rec.get("t_end", math.inf),
                error_line(rec) + (f" at {at}" if at else ""),
            )
        elif status == "exited":
            out[r] = (rec.get("t_end", math.inf), f"exited with {rec.get('error')}")
        elif r in run.fatal or (
            sig and sig != "SIGTERM" and status not in ("stopped", "finished")
        ):
            msg = _abort_message(run.outputs.get(r, ""))
            what = (
                f"killed by {sig}"
                if sig and sig != "SIGABRT"
                else "aborted (SIGABRT)"
                if sig
                else "died of a fatal signal"
            )
            where = ""
            if r in run.fatal:
                # faulthandler's dump: the Python line that called into the C++ code that aborted.
                op, user = waiting_in(parse_stack(run.fatal[r], exec_path), exec_path)
                if user:
                    where = f", in {op} at {ctx.sources.where(user[0], user[1])}"
            out[r] = (
                run.died_at.get(r, math.inf),
                f"{what} in C++ code{where}" + (f": {msg}" if msg else ""),
            )
    return out


def batch_count(rec: dict) -> int | None:
    """Batches per epoch of the rank's first training loader."""
    epochs = training_epochs(rec)
    return epochs[0].get("num_batches") if epochs else None


def uneven(run: RunResult) -> dict[int, int] | None:
    counts = {r: batch_count(rec) for r, rec in sorted(run.records.items())}
    counts = {r: c for r, c in counts.items() if c is not None}
    return counts if len(counts) > 1 and len(set(counts.values())) > 1 else None


def imbalance(counts: dict[int, int]) -> str:
    return ", ".join(
        f"rank {r}: {c} batches" if i == 0 else f"rank {r}: {c}"
        for i, (r, c) in enumerate(sorted(counts.items()))
    )


def _unused_cause(rec: dict) -> str | None:
    names = rec.get("unused_params")
    if not names:
        return None
    listed = ", ".join(names[:6]) + (
        f" and {len(names) - 6} more" if len(names) > 6 else ""
    )
    return (
        f"DDP: {plural(len(names), 'parameter')} got no gradient in the step: {listed}. "
        "Use them in forward(), remove them (or set requires_grad=False), or pass "
        "find_unused_parameters=True to DistributedDataParallel"
    )


# What a rank says when a peer it waits for in a collective is gone (the peer ran ahead or exited).
_PEER_GONE = r"Connection closed by peer|Connection reset by peer|closed by remote|ProcessGroupGloo.*(closed|timed out)|NCCL.*(remote|Timeout)"

# A script that assumes a GPU per process, run with shared GPUs.
_NOT_SHARED = r"invalid device ordinal|Duplicate GPU detected|device >= 0 && device < num_gpus|CUDA error: invalid device"


def check_ranks(ctx: Context) -> Check:
    run, n = ctx.candidate, ctx.nproc
    recs = run.records
    problems: list[str] = []
    details: list[str] = []
    started = [r for r in range(n) if r in recs]
    problems += [f"rank {r} never started" for r in range(n) if r not in recs]
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
            problems.append(
                f"rank {r} joined a group as rank {init['rank']} of {init['world_size']}, not {r} of {n}"
            )
        else:
            initialised.append(r)
    died = deaths(ctx, run)
    of = "" if ctx.to_end or ctx.epochs else f" of {ctx.steps}"
    for r in started:
        rec = recs[r]
        status = rec.get("status")
        at = steps_of(run, r)
        if r in died:
            problems.append(
                f"rank {r} {'crashed' if status == 'crashed' else 'failed'} at step {at}: {died[r][1]}"
            )
            if rec.get("traceback"):
                details.append(f"rank {r} traceback:")
                details.extend(
                    "  " + line
                    for line in tail(
                        ctx.sources.rewrite(rec.get("traceback") or ""), 20
                    )
                )
            else:
                details.append(f"rank {r} output:")
                details.extend("  " + line for line in tail(run.outputs.get(r, ""), 8))
        elif status == "running":
            why = (
                "stalled (see no-hang)"
                if run.hang
                else "was stopped by torchrun after another rank failed"
                if died
                else "was killed"
            )
            problems.append(f"rank {r} {why}, at step {at}{of}")
    if run.records and not problems:
        ends = {r: recs[r]["steps"] for r in range(n)}
        if len(set(ends.values())) > 1:
            problems.append(
                "ranks ended after different step counts: "
                + ", ".join(f"rank {r} {s}" for r, s in ends.items())
            )
    if not started and run.launcher_output:
        details.extend("  " + line for line in tail(run.launcher_output, 15))
    head = f"{len(started)}/{n} started, {len(initialised)}/{n} initialised"
    if problems:
        cause = problems[0]
        if died:
            first = min(died, key=lambda r: died[r][0])
            cause = f"rank {first} failed first, at step {steps_of(run, first)}: {died[first][1]}"
            if len(died) > 1:
                others = sorted(set(died) - {first})
                cause += f" (then {'ranks' if len(others) > 1 else 'rank'} {', '.join(map(str, others))} failed: {died[others[0]][1][:120]})"
            unused = next(
                (
                    c
                    for c in (
                        _unused_cause(recs.get(r) or {})
                        for r in sorted(died, key=lambda r: died[r][0])
                    )
                    if c
                ),
                None,
            )
            if unused:
                cause = unused
            elif re.search(_PEER_GONE, died[first][1]):
                # gloo's "Connection closed by peer" is the symptom: the cause is the rank that left
                told = collective_cause(ctx, run)
                if told:
                    cause = f"{told} (rank {first} then failed with: {died[first][1][:100]})"
        if ctx.shared_gpus and any(
            re.search(_NOT_SHARED, d[1], re.I) for d in died.values()
        ):
            cause += (f"; the ranks share {plural(ctx.shared_gpus, 'GPU')} (--share-gpus): a script must then pick GPU "
                      "LOCAL_RANK % torch.cuda.device_count(), and gloo for CUDA tensors when LOCAL_WORLD_SIZE exceeds "
                      "the GPUs (ddpify's set-up does both); or verify it with a GPU per process")  # fmt: skip
        counts = uneven(run)
        if counts:
            cause += f"; the ranks had different numbers of batches per epoch ({imbalance(counts)}): see even-batches"
        return Check(
            "ranks", FAIL, f"{head}; " + "; ".join(problems[:3]), cause, details
        )
    steps = recs[0]["steps"]
    status = recs[0].get("status")
    if status == "finished":
        how = f"ran to the script's end at step {steps}"
        if not ctx.to_end and not ctx.epochs:
            how = f"script ended at step {steps} (before K={ctx.steps})"
    elif ctx.epochs:
        how = f"stopped after {plural(ctx.epochs, 'epoch')} at step {steps}"
    else:
        how = f"reached step {steps}"
    nodes = f", {ctx.nnodes} nodes" if ctx.nnodes > 1 else ""
    return Check(
        "ranks",
        PASS,
        f"{n}/{n} started, initialised ({backend}, world {n}{nodes}), {how}",
        data={"steps": steps},
    )


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
    per_rank: dict[int, set[str]] = {
        r: _devices_used(rec) for r, rec in sorted(recs.items())
    }
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
        if ctx.shared_gpus:
            # Ranks share the GPUs: local rank L belongs on GPU L % GPUs, as the conversion picks it.
            want = f"cuda:{rec.get('local_rank', r) % ctx.shared_gpus}"
            problems += [
                f"rank {r} (LOCAL_RANK {rec.get('local_rank')}) computed on {d}, not {want}"
                for d in cuda
                if d != want
            ]
            continue
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
                problems.append(
                    f"rank {r} allocated {nbytes / 2**20:.1f} MiB on cuda:{d}, not its own cuda:{own}"
                )
    if not any(d.startswith("cuda") for used in per_rank.values() for d in used):
        # CPU (gloo) runs: every rank on the host; nothing to share or collide.
        problems = [p for p in problems if "cuda" in p]
    figure = ", ".join(f"rank{r} {'+'.join(sorted(u))}" for r, u in per_rank.items())
    if ctx.shared_gpus:
        figure += f" ({len(per_rank)} ranks sharing {plural(ctx.shared_gpus, 'GPU')}, --share-gpus)"
    if not problems:
        return Check("devices", PASS, figure)
    cause = problems[0]
    for r in per_rank:
        rec = recs[r]
        if (
            not ctx.shared_gpus
            and rec.get("local_rank", r) != 0
            and not rec.get("set_device")
            and any(d in ("cuda:0", "cuda") for d in per_rank[r])
        ):
            cause = (
                f"torch.cuda.set_device(LOCAL_RANK) is never called: rank {r} (LOCAL_RANK {rec.get('local_rank')}) "
                "put its model on cuda:0, so every rank computes on GPU 0"
            )
            break
    return Check(
        "devices", FAIL, f"{figure}; " + "; ".join(problems[:3]), cause, problems[3:]
    )


# ------------------------------------------------------------------------ imports (project mode)


def check_imports(ctx: Context) -> Check | None:
    """Project mode: the ranks must run the converted modules, not the user's originals (an import
    path into the project that verify did not point at its copies would test unconverted code)."""
    if not ctx.sources.roots:
        return None
    recs = ctx.candidate.records
    seen = {
        r: rec.get("imports")
        for r, rec in sorted(recs.items())
        if rec.get("imports") is not None
    }
    if not seen:
        return Check("imports", NA, "no rank recorded its imports")
    # An original the conversion left as it is runs the same code as its copy: only a converted one matters.
    changed = {os.path.realpath(user) for user, _ in ctx.sources.copies.values()}
    wrong = {
        r: [f for f in i.get("originals", []) if os.path.realpath(f) in changed]
        for r, i in seen.items()
    }
    wrong = {r: files for r, files in wrong.items() if files}
    copies = max(i.get("copies", 0) for i in seen.values())
    if not wrong:
        same = max(len(i.get("originals", [])) for i in seen.values())
        also = (
            f"; {plural(same, 'unchanged module')} from your project itself (the same code)"
            if same
            else ""
        )
        return Check(
            "imports",
            PASS,
            f"every converted module came from verify's copy ({plural(copies, 'local module')} imported from it){also}",
        )
    r, files = next(iter(wrong.items()))
    names = ", ".join(ctx.sources.name(f) for f in files[:4]) + (
        " ..." if len(files) > 4 else ""
    )
    cause = (f"rank {r} imported {names} from your project ({os.path.dirname(files[0])}), not from verify's converted "
             "copy: an import path into the project that verify could not redirect; the checks then judge unconverted "
             "code. Run verify from a clean environment (no editable install of the project), or convert in place and "
             "verify with --no-convert")  # fmt: skip
    return Check(
        "imports",
        FAIL,
        f"rank {r} imported {len(files)} original module{'s' if len(files) > 1 else ''}: {names}",
        cause,
    )
