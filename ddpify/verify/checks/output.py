"""The `rank0-output` check: ranks other than 0 must not print what rank 0 prints (the losses and
metrics of a training log), through any channel: print, sys.stdout.write, a logging handler.

The probe notes, on every rank, the line of the script that wrote each output (its `printed`
record); a rank printing a loss-like line at a line of code where rank 0 prints too fails. Output
the probe could not trace to a line (a C extension, os.write) is compared as text: the same
loss-like line, numbers aside, on rank 0 and another rank.
"""

from __future__ import annotations

import re

from ddpify.verify.checks.common import FAIL, NA, PASS, Check, Context, plural

# A loss or a metric with its value, as training logs print them ("loss 0.53", "acc=91.2%", "ppl: 12").
METRIC = re.compile(
    r"(?<![a-z])(loss|acc|accuracy|ppl|perplexity|top-?[15])\w*\D{0,20}?(\d|nan\b|inf\b)",
    re.I,
)
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?|nan|inf", re.I)
_NOT_THE_SCRIPTS = re.compile(
    r"Warning:|^\s*(File \"|Traceback|warnings\.warn)|^\[W|^\[rank\d+\]:\[W"
)
MAX_OUTPUT = 2_000_000  # characters of a rank's output read for the text comparison


def _metric(entry: dict) -> str:
    """The loss-like line a print site wrote (its first or its latest), or ""."""
    return next(
        (t for t in (entry.get("text", ""), entry.get("last", "")) if METRIC.search(t)),
        "",
    )


def _template(line: str) -> str:
    return _NUMBER.sub("#", line.strip())


def _metric_lines(text: str) -> dict[str, str]:
    """{template: first such line} of the loss-like lines in a rank's output."""
    out: dict[str, str] = {}
    in_traceback = False
    for line in text.splitlines():  # "\r" splits too: each state of a progress bar
        if line.startswith("Traceback"):
            in_traceback = True
        elif in_traceback and line and not line[0].isspace():
            in_traceback = False
            continue  # the exception's own line
        if in_traceback or _NOT_THE_SCRIPTS.search(line) or not METRIC.search(line):
            continue
        out.setdefault(_template(line), line.strip())
    return out


def _read_output(ctx: Context, r: int) -> str:
    path = ctx.candidate.run_dir / f"rank{r}.out"
    try:
        with open(path, errors="replace") as f:
            return f.read(MAX_OUTPUT)
    except OSError:
        return ctx.candidate.outputs.get(r, "")


def check_rank0_output(ctx: Context) -> Check:
    recs = ctx.candidate.records
    if ctx.nproc < 2:
        return Check("rank0-output", NA, "one process")
    if 0 not in recs:
        return Check("rank0-output", NA, "rank 0 recorded nothing")
    sites0 = {e["where"] for e in recs[0].get("printed", []) if _metric(e)}
    text0 = _metric_lines(_read_output(ctx, 0))
    copied: list[
        tuple[int, dict]
    ] = []  # (rank, printed entry): a site rank 0 prints its log at
    by_text: list[tuple[int, str]] = []
    for r in range(1, ctx.nproc):
        rec = recs.get(r) or {}
        mine = [
            e for e in rec.get("printed", []) if e["where"] in sites0 and _metric(e)
        ]
        copied += [(r, e) for e in mine]
        if not mine:
            same = [
                line
                for t, line in _metric_lines(_read_output(ctx, r)).items()
                if t in text0
            ]
            by_text += [(r, line) for line in same[:3]]
    if copied:
        r, e = copied[0]
        ranks = sorted({x for x, _ in copied})
        who = ("ranks " if len(ranks) > 1 else "rank ") + ", ".join(map(str, ranks))
        figure = f"{who} printed rank 0's log lines: `{_metric(e)[:80]}` ({plural(e['n'], 'time')} on rank {r}, to {e['stream']})"
        cause = (f"the output at {ctx.where(e['where'])} runs on every rank: each rank prints its own copy of rank 0's "
                 "log (print, sys.stdout.write and logging handlers alike); guard it with `if RANK == 0:` or log "
                 "through a logger that only rank 0 configures")  # fmt: skip
        sites = sorted({ctx.where(x["where"]) for _, x in copied})
        return Check(
            "rank0-output",
            FAIL,
            figure,
            cause,
            [f"also at {s}" for s in sites[1:5]],
            data={"ranks": ranks},
        )
    if by_text:
        r, line = by_text[0]
        figure = f"rank {r} printed a line of rank 0's log: `{line[:80]}`"
        cause = (f"rank {r} printed the same loss or metric lines as rank 0 (numbers aside), through output verify could "
                 "not trace to a line of the script (a C extension, os.write, a subprocess): guard that output with "
                 "`if RANK == 0:`")  # fmt: skip
        return Check(
            "rank0-output",
            FAIL,
            figure,
            cause,
            [f"rank {x}: {y[:120]}" for x, y in by_text[1:4]],
        )
    count = sum(
        e.get("n", 0) for e in recs[0].get("printed", []) if e["where"] in sites0
    ) or len(text0)
    if not count:
        return Check(
            "rank0-output", NA, "rank 0 printed no loss or metric line to compare"
        )
    others = "rank 1" if ctx.nproc == 2 else f"ranks 1-{ctx.nproc - 1}"
    return Check(
        "rank0-output",
        PASS,
        f"rank 0 alone printed its log ({plural(count, 'loss or metric line')}); {others} none of it",
    )


def check_metrics(ctx: Context) -> Check:
    """A figure rank 0 reports right after evaluating its own shard (a DistributedSampler's share),
    with no collective between the evaluation and the report: one shard's figure, shown as the
    whole data set's."""
    rec = ctx.candidate.records.get(0) or {}
    evals = [
        e
        for e in rec.get("epochs", [])
        if e.get("sampler") == "DistributedSampler"
        and e.get("bw_first") == e.get("bw_last")
    ]
    hits = rec.get("one_shard") or []
    if hits:
        h = hits[0]
        n = ctx.nproc
        cause = (
            f"rank 0 reported `{h['text']}` at {ctx.where(h['where'])} right after evaluating only its own shard "
            f"(a DistributedSampler's 1/{n} of the {h.get('dataset_len') or '?'} samples), with no all_reduce or "
            "gather in between: the figure is one shard's, not the data set's. all_reduce the sums and counts "
            "before reporting (or evaluate every sample on one rank)"
        )
        return Check(
            "metrics",
            FAIL,
            f"{len(hits)} figure(s) reported from one shard",
            cause,
            [f"{ctx.where(x['where'])}: {x['text']}" for x in hits[1:]],
        )
    if not evals:
        return Check("metrics", NA, "no evaluation over a sharded loader")
    return Check(
        "metrics",
        PASS,
        f"{len(evals)} sharded evaluation pass(es); nothing reported from one shard alone",
    )
