"""Checks on the files the script writes: only global rank 0 writes (`rank0-writes`), and the
candidate wrote what the baseline wrote, in a form that loads into the unwrapped model (`saved`).

Only the script's own outputs count: the probe leaves out what a library writes to a cache or a
temporary folder (compiler caches, a tracker's media) and whatever lands in verify's run folder.
"""

from __future__ import annotations

import os
import re

from ddpify.verify.checks.common import (
    FAIL,
    NA,
    PASS,
    Check,
    Context,
    plural,
    short,
    split_where,
)


def key(ctx: Context, w: dict) -> str:
    """Where a write went, comparable across runs: relative to the rank's working directory (under
    --nnodes, each node's disk), and a converted copy's folder read as the user's project."""
    rel = w.get("rel") or w["path"]
    if rel != w["path"]:
        return rel
    mapped = ctx.sources.user_file(w["path"])
    if mapped != w["path"]:
        here = os.path.realpath(os.getcwd())
        return (
            os.path.relpath(mapped, here)
            if mapped.startswith(here + os.sep)
            else mapped
        )
    return rel


def candidate_writes(ctx: Context) -> dict[str, dict[int, dict]]:
    """{path: {rank: its first write of it}}."""
    by_path: dict[str, dict[int, dict]] = {}
    for r, rec in sorted(ctx.candidate.records.items()):
        for w in rec.get("writes", []):
            by_path.setdefault(key(ctx, w), {}).setdefault(r, w)
    return by_path


def baseline_writes(ctx: Context) -> dict[str, list[dict]]:
    rec = (ctx.baseline.records.get(0) or {}) if ctx.baseline else {}
    out: dict[str, list[dict]] = {}
    for w in rec.get("writes", []):
        out.setdefault(key(ctx, w), []).append(w)
    return out


def _who(rec: dict, r: int, nnodes: int) -> str:
    if nnodes > 1:
        return f"rank {r} (node {rec.get('node')}, LOCAL_RANK {rec.get('local_rank')})"
    return f"rank {r}"


def check_writes(ctx: Context) -> Check:
    recs = ctx.candidate.records
    if not recs:
        return Check("rank0-writes", NA, "no rank recorded anything")
    by_path = candidate_writes(ctx)
    problems = [
        (path, ranks)
        for path, ranks in by_path.items()
        if len(ranks) > 1 or any(r != 0 for r in ranks)
    ]
    if not problems:
        files = [short(p) for p in by_path]
        if not files:
            if baseline_writes(ctx):
                return Check(
                    "rank0-writes",
                    NA,
                    "no rank wrote a file, but the baseline did (see saved)",
                )
            return Check("rank0-writes", PASS, "no rank wrote a file")
        listed = ", ".join(files[:3]) + (
            f" and {len(files) - 3} more" if len(files) > 3 else ""
        )
        return Check(
            "rank0-writes",
            PASS,
            f"only rank 0 wrote: {listed}",
            data={"paths": list(by_path)},
        )
    path, ranks = problems[0]
    who = ", ".join(map(str, sorted(ranks)))
    w = ranks[max(ranks)]
    figure = (
        f"ranks {who} wrote {short(path)}"
        if len(ranks) > 1
        else f"rank {who} wrote {short(path)}"
    )
    if len(problems) > 1:
        figure += f" (+{plural(len(problems) - 1, 'more path')})"
    what, at = w["kind"], ctx.where(w["where"])
    cause = f"{what} at {at} runs on every rank: guard it with `if RANK == 0:`"
    if len(ranks) == 1:
        cause = f"{what} at {at} runs on rank {who}: only global rank 0 should write"
    local = [r for r in ranks if r != 0 and recs[r].get("local_rank") == 0]
    if ctx.nnodes > 1 and local:
        r = local[0]
        file, line = split_where(w["where"])
        guard = ctx.sources.enclosing_if(file, line)
        test = (
            f" `if {guard[1]}:` ({ctx.sources.line(file, guard[0])})" if guard else ""
        )
        cause = (
            f"{what} at {at} also runs on {_who(recs[r], r, ctx.nnodes)}, which wrote {short(path)} "
            f"on its node's disk: the guard{test} tests the local rank, true once per node; only global rank 0 "
            "should write: test RANK (dist.get_rank() == 0)"
        )
    details = [
        f"{short(p)}: " + ", ".join(_who(recs[r], r, ctx.nnodes) for r in sorted(rs))
        for p, rs in problems
    ]
    return Check(
        "rank0-writes",
        FAIL,
        figure,
        cause,
        details,
        data={"problems": [p for p, _ in problems]},
    )


# ------------------------------------------------------------------------ saved


_SD_VERDICT = {
    "module-prefix": "its keys start with DDP's `module.` (e.g. {sample}), so it does not load into the unwrapped "
    "model: save model.module.state_dict()",
    "ddp-object": "it is the DistributedDataParallel wrapper itself, which cannot be loaded without a process "
    "group: save model.module.state_dict()",
}


def _state_dict_problem(sd: dict) -> str | None:
    verdict = sd.get("verdict")
    if verdict in _SD_VERDICT and (
        verdict != "module-prefix"
        or not (sd.get("n_missing") or sd.get("n_unexpected"))
    ):
        sample = ", ".join(sd.get("sample") or []) or "?"
        return _SD_VERDICT[verdict].format(sample=sample)
    if verdict in ("mismatch", "module-prefix"):
        parts = []
        if sd.get("n_missing"):
            parts.append(
                f"{sd['n_missing']} of the model's keys missing ({', '.join(sd['missing'])})"
            )
        if sd.get("n_unexpected"):
            parts.append(
                f"{sd['n_unexpected']} unexpected ({', '.join(sd['unexpected'])})"
            )
        if sd.get("shapes"):
            parts.append("shapes differ: " + "; ".join(sd["shapes"]))
        return "it does not load into the unwrapped model: " + ", ".join(parts)
    return None


def reached_lines(ctx: Context, path: str | None = None) -> set[int]:
    """Lines of a file the ranks ran (the entry by default) whose writes ran on some rank."""
    target = os.path.abspath(path or ctx.exec_path)
    lines = set()
    for rec in ctx.candidate.records.values():
        for w in rec.get("writes", []):
            file, line = split_where(w.get("where") or "")
            if os.path.abspath(file) == target:
                lines.add(line)
    return lines


_ID = re.compile(r"[A-Za-z0-9]*\d[A-Za-z0-9]*|tmp[a-z0-9_]{8}")


def written_alike(key: str, written) -> bool:
    """The candidate wrote `key`, or a file of the same kind in the same folder: names (and
    folders) that carry an epoch, a step, a time, a run id or a temporary folder's random name
    differ from run to run and rank to rank."""
    if key in written:
        return True
    folder, ext = os.path.dirname(key), os.path.splitext(key)[1]
    pattern = _ID.sub("#", folder)
    return any(
        os.path.splitext(k)[1] == ext and _ID.sub("#", os.path.dirname(k)) == pattern
        for k in written
    )


def _never_ran(ctx: Context, w: dict) -> str:
    """Why the candidate never wrote what the baseline wrote at w["where"]: the same call in the
    converted file, if it never ran, and the `if` around it. Empty when that cannot be told."""
    path, line = split_where(w.get("where") or "")
    src = ctx.sources
    copy = src.copy_of(path)
    if not os.path.exists(copy):
        return ""
    kind = w["kind"].split("(")[0]
    sites = {ln: what for ln, what in src.write_sites(copy)}
    reached = reached_lines(ctx, copy)
    for ln in src.converted_lines(copy, line):
        if (
            ln in sites
            and ln not in reached
            and (sites[ln].startswith(kind) or kind == "open")
        ):
            guard = src.enclosing_if(copy, ln)
            text = f": its {sites[ln]} at {src.where(copy, ln)} never ran on any rank"
            if guard:
                text += f", under `if {guard[1]}:` ({src.line(copy, guard[0])}), a condition that was never true"
            return text
    return ""


def check_saved(ctx: Context) -> Check:
    base = baseline_writes(ctx)
    cand = candidate_writes(ctx)
    # 1. Every file the baseline wrote, the candidate wrote too (the same name, or one of the same
    #    kind in the same folder when the name carries an epoch or a time).
    missing = [(k, ws) for k, ws in base.items() if not written_alike(k, cand)]
    # 2. Every state dict saved loads into the unwrapped model (keys and shapes).
    bad = []
    checked = 0
    for k, ranks in cand.items():
        for r, w in sorted(ranks.items()):
            for sd in w.get("state_dicts", []):
                if sd.get("verdict") in (
                    "loads",
                    "module-prefix",
                    "mismatch",
                    "ddp-object",
                ):
                    checked += 1
                problem = _state_dict_problem(sd)
                if problem:
                    bad.append((k, r, w, sd, problem))
    if bad:
        k, r, w, sd, problem = bad[0]
        where = "" if sd["at"] == "<object>" else f" (at {sd['at']})"
        figure = f"rank {r} saved {short(k)}{where}: " + (
            "DDP `module.` keys" if sd["verdict"] == "module-prefix" else sd["verdict"]
        )
        cause = f"the state dict saved to {short(k)}{where} at {ctx.where(w['where'])}: {problem}"
        return Check(
            "saved",
            FAIL,
            figure,
            cause,
            [f"{short(x)}: {p}" for x, _, _, _, p in bad[1:4]],
        )
    if missing:
        k, ws = missing[0]
        figure = f"the baseline wrote {short(k)} ({len(ws)}x); no rank of the candidate wrote it"
        if len(missing) > 1:
            figure += f" (+{plural(len(missing) - 1, 'more file', 'more files')})"
        cause = f"the one-process run wrote {short(k)} ({ws[0]['kind']} at {ctx.where(ws[0]['where'])}), the candidate never did"
        cause += _never_ran(ctx, ws[0])
        details = [
            f"{short(x)}: written {len(v)}x by the baseline, never by the candidate"
            for x, v in missing
        ]
        return Check("saved", FAIL, figure, cause, details)
    parts = []
    if base:
        parts.append(
            f"the candidate wrote {'the' if len(base) == 1 else 'all'} {plural(len(base), 'file')} the baseline wrote"
        )
    if checked:
        parts.append(
            f"{plural(checked, 'state dict')} load{'s' if checked == 1 else ''} into the unwrapped model"
        )
    if not parts:
        if not cand:
            return Check(
                "saved",
                NA,
                "nothing saved" + ("" if ctx.baseline else " (no baseline to compare)"),
            )
        return Check(
            "saved",
            PASS,
            f"no model state dict among the {plural(len(cand), 'file')} written",
        )
    return Check("saved", PASS, "; ".join(parts), data={"baseline_files": len(base)})
