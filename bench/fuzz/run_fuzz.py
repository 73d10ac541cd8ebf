"""Fuzz ddpify at scale: hypothesmith programs and mutated fixtures, counted into results.txt.

    python bench/fuzz/run_fuzz.py --programs 10000 --mutations 1000 --jobs 2

For every input that compiles: no crash (an exception other than ConversionError), the output
compiles, and converting the output again changes nothing (see fuzzlib.check). Failing inputs are
saved under bench/fuzz/failures/ for replay.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import random
import signal
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

import fuzzlib  # noqa: E402

TIMEOUT_S = 20


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    # Raised inside a gc callback the exception would be swallowed: fire again in a second
    # so the next one lands in ordinary code.
    signal.alarm(1)
    raise _Timeout()


def run_one(source: str, options=None) -> tuple[str, str]:
    """(outcome, detail): converted | unchanged | refused | invalid | crash | property | timeout."""
    if not fuzzlib.compiles(source):
        return "invalid", ""
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIMEOUT_S)
    try:
        return fuzzlib.check(source, options), ""
    except _Timeout:
        return "timeout", f"over {TIMEOUT_S} s"
    except fuzzlib.PropertyFailure as exc:
        return "property", str(exc)
    except Exception:
        return "crash", traceback.format_exc(limit=-3)
    finally:
        signal.alarm(0)


def hypothesmith_worker(args: tuple[int, int]) -> tuple[collections.Counter, list]:
    worker, count = args
    import hypothesmith
    from hypothesis import HealthCheck, given, seed, settings

    counts: collections.Counter = collections.Counter()
    failures: list = []

    @seed(1000 + worker)
    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(hypothesmith.from_grammar())
    def body(source):
        outcome, detail = run_one(source)
        counts[outcome] += 1
        if outcome in ("crash", "property", "timeout") and len(failures) < 20:
            failures.append((outcome, detail, source))

    body()
    return counts, failures


def mutation_worker(seed_: int) -> tuple[str, str, str]:
    rng = random.Random(seed_)
    source = fuzzlib.mutate(rng.choice(FIXTURES), rng)
    outcome, detail = run_one(source, fuzzlib.random_options(rng))
    return outcome, detail, source


FIXTURES = fuzzlib.fixture_sources()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=10_000)
    parser.add_argument("--mutations", type=int, default=1_000)
    parser.add_argument("--jobs", type=int, default=mp.cpu_count())
    parser.add_argument("--out", type=Path, default=HERE / "results.txt")
    args = parser.parse_args()

    start = time.time()
    totals = {"hypothesmith": collections.Counter(), "mutations": collections.Counter()}
    failures: list = []
    with mp.Pool(args.jobs) as pool:
        shares = [
            (w, args.programs // args.jobs + (w < args.programs % args.jobs))
            for w in range(args.jobs)
        ]
        for counts, fails in pool.imap_unordered(hypothesmith_worker, shares):
            totals["hypothesmith"].update(counts)
            failures += [("hypothesmith", *f) for f in fails]
        if FIXTURES:
            for outcome, detail, source in pool.imap_unordered(
                mutation_worker, range(args.mutations), chunksize=4
            ):
                totals["mutations"][outcome] += 1
                if outcome in ("crash", "property", "timeout"):
                    failures.append(("mutation", outcome, detail, source))
    elapsed = time.time() - start

    fail_dir = HERE / "failures"
    if failures:
        fail_dir.mkdir(exist_ok=True)
        for i, (kind, outcome, detail, source) in enumerate(failures):
            (fail_dir / f"{i:03d}_{kind}_{outcome}.py").write_text(
                f"# {outcome}: {detail.strip()}\n".replace("\n", "\n# ") + "\n" + source
            )
    keys = (
        "programs",
        "converted",
        "unchanged",
        "refused",
        "invalid",
        "crashes",
        "property failures",
        "timeouts",
    )
    lines = [
        "$ python bench/fuzz/run_fuzz.py " + " ".join(sys.argv[1:]),
        f"# {time.strftime('%Y-%m-%d %H:%M:%S')}, {elapsed:.0f} s, {args.jobs} processes, Python {sys.version.split()[0]}",
        "# invalid: generated programs that do not compile (ddpify refuses them before converting)",
        "# crashes: an exception other than ConversionError; property failures: output does not compile",
        "#   or converting it again changes it. Failing inputs: bench/fuzz/failures/",
        "",
        f"{'':14}" + "".join(f"{k:>19}" for k in keys),
    ]
    for name, c in totals.items():
        row = [
            sum(c.values()),
            c["converted"],
            c["unchanged"],
            c["refused"],
            c["invalid"],
            c["crash"],
            c["property"],
            c["timeout"],
        ]
        lines.append(f"{name:14}" + "".join(f"{v:>19}" for v in row))
    if not FIXTURES:
        lines.append("# no fixtures/*/input.py: no mutations run")
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
