"""Before/after speed of two checkouts of ddpify on one corpus, run alternately.

    python bench/converter/ab_compare.py --before /tmp/old-checkout --after . --rounds 3

Per round, each checkout in turn (which goes first alternates): `python -m ddpify --check -q
FILES` over the generated corpus pinned to one core, then the one ~300-line file (--single-runs
times). CPU time (user+sys of the child) is the figure to compare on this shared machine: other
load stretches wall time far more than it does CPU time. Prints medians and after/before ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_corpus  # noqa: E402
from run_converter_bench import timed  # noqa: E402


def env_for(checkout: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout), NO_COLOR="1")
    where = subprocess.run(
        [sys.executable, "-c", "import ddpify; print(ddpify.__file__)"],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if not Path(where.strip()).is_relative_to(
        checkout
    ):  # an installed ddpify must not stand in
        raise SystemExit(f"{checkout}: imports ddpify from {where.strip()}")
    return env


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--before", type=Path, required=True)
    p.add_argument("--after", type=Path, required=True)
    p.add_argument("--count", type=int, default=240, help="scripts in the corpus")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--single-runs", type=int, default=5)
    a = p.parse_args()
    checkouts = {"before": a.before.resolve(), "after": a.after.resolve()}
    envs = {k: env_for(v) for k, v in checkouts.items()}
    with tempfile.TemporaryDirectory(prefix="ddpify-ab-") as tmp:
        summary = make_corpus.generate(Path(tmp), a.count)
        files, big = summary["paths"], summary["precommit"]
        cpu0 = min(os.sched_getaffinity(0))
        cmd = [sys.executable, "-m", "ddpify", "--check", "-q"]
        corpus: dict[str, list[dict]] = {"before": [], "after": []}
        single: dict[str, list[dict]] = {"before": [], "after": []}
        for r in range(a.rounds):
            for k in ("before", "after") if r % 2 == 0 else ("after", "before"):
                res = timed(cmd + files, cpu0, envs[k], tmp)
                if res["rc"] not in (0, 1):
                    raise SystemExit(f"{k}: exit {res['rc']}: {res['err'][-500:]}")
                corpus[k].append(res)
                single[k] += [
                    timed(cmd + [big], cpu0, envs[k], tmp) for _ in range(a.single_runs)
                ]
    lines = [
        f"corpus: {summary['files']} scripts, {summary['lines']} lines; one file: {summary['precommit_lines']} lines; "
        f"{a.rounds} rounds, alternating; load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        "| measure | before CPU s | after CPU s | after/before CPU | before wall s | after wall s | after/before wall |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, runs in (
        (
            f"`ddpify --check -j 1` over the corpus, 1 core (median of {a.rounds})",
            corpus,
        ),
        (f"one file, `ddpify --check` (median of {a.rounds * a.single_runs})", single),
    ):
        c = {k: statistics.median(x["cpu"] for x in v) for k, v in runs.items()}
        w = {k: statistics.median(x["wall"] for x in v) for k, v in runs.items()}
        lines.append(
            f"| {name} | {c['before']:.3f} | {c['after']:.3f} | {c['after'] / c['before']:.3f} | "
            f"{w['before']:.3f} | {w['after']:.3f} | {w['after'] / w['before']:.3f} |"
        )
    lines.append(
        "raw CPU s: "
        + "; ".join(
            f"{k} corpus {[round(x['cpu'], 3) for x in corpus[k]]}" for k in corpus
        )
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
