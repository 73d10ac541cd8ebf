"""Speed of `ddpify lint`: milliseconds a file, against a bare LibCST parse of the same files.

    python bench/lint/run_lint_bench.py                       # writes bench/lint/results.txt
    python bench/lint/run_lint_bench.py --repeats 5 --mirrors /work/.mirror

Corpora (each file linted on its own, in this process, after one untimed warm-up pass):
  realworld  every .py file of bench/realworld's entries (the script and its siblings, the
             held-back split excepted), extracted at the pinned commits from the mirrors:
             real training code, distributed or not, as a pre-commit hook meets it;
  outputs    the converter's fixture outputs (fixtures/*/expected.py): distributed scripts;
  lint       fixtures/lint (the bug and control scripts).
For each: the mean per file of `lint_source` (parse, analysis, rules) and of a bare
`libcst.parse_module` (the floor), as CPU time (this small machine is shared: CPU time is less
disturbed by other load than wall time, shown beside it), median of --repeats interleaved
repeats; the ratio to the floor; the slowest files. Then `ddpify lint` as a command over all the
files (one process) and on one file (start-up included, as a pre-commit hook runs it).
The target: at most 100 ms a file on average.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

TARGET_MS = 100.0


def realworld_files(mirrors: Path, dest: Path) -> list[Path]:
    sys.path.insert(0, str(HERE))
    from corpus_lint import extract, git_dir

    entries = tomllib.loads(
        (ROOT / "bench" / "realworld" / "manifest.toml").read_text()
    )["entry"]
    out: list[Path] = []
    for e in entries:
        gd = git_dir(mirrors, e["repo"])
        if gd is None:
            continue
        target = dest / e["name"]
        try:
            extract(e, gd, target)
        except subprocess.CalledProcessError:
            continue
        out += sorted(target.rglob("*.py"))
    return out


def timed(fn, files: list[tuple[Path, str]]) -> tuple[list[float], list[float]]:
    """CPU and wall seconds for each file."""
    cpu, wall = [], []
    for _, text in files:
        c, w = time.process_time(), time.perf_counter()
        fn(text)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return cpu, wall


def measure(
    name: str, paths: list[Path], repeats: int, out: list[str]
) -> tuple[float, int]:
    import libcst

    from ddpify.lint import lint_source
    from ddpify.result import ConversionError

    files = []
    for p in paths:
        try:
            text = p.read_text(encoding="utf-8")
            libcst.parse_module(text)
        except (UnicodeDecodeError, libcst.ParserSyntaxError, RecursionError):
            continue  # not Python 3 LibCST parses: not timed (lint reports it as an error)
        files.append((p, text))

    def lint(text: str) -> None:
        try:
            lint_source(text)
        except ConversionError:
            pass

    timed(lint, files)  # warm-up: imports, first-use caches
    runs = {"lint": [], "floor": []}
    for _ in range(repeats):
        runs["floor"].append(timed(libcst.parse_module, files))
        runs["lint"].append(timed(lint, files))
    per_file = {
        k: [statistics.median(r[0][i] for r in v) for i in range(len(files))]
        for k, v in runs.items()
    }
    per_wall = {
        k: [statistics.median(r[1][i] for r in v) for i in range(len(files))]
        for k, v in runs.items()
    }
    n = len(files)
    lint_ms = 1000 * sum(per_file["lint"]) / n
    floor_ms = 1000 * sum(per_file["floor"]) / n
    wall_ms = 1000 * sum(per_wall["lint"]) / n
    lines = sum(t.count("\n") for _, t in files)
    out.append(
        f"| {name} | {n} | {lines // n} | {lint_ms:.1f} | {wall_ms:.1f} | {floor_ms:.1f} | {lint_ms / floor_ms:.2f}x | "
        f"{'yes' if lint_ms <= TARGET_MS else 'NO'} |"
    )
    slow = sorted(zip(per_file["lint"], (p for p, _ in files)), reverse=True)[:3]
    out.append(
        "|  | slowest: "
        + ", ".join(f"{p.name} {1000 * s:.0f} ms" for s, p in slow)
        + " | | | | | | |"
    )
    return sum(per_file["lint"]), n


def cli_run(paths: list[str]) -> tuple[float, float]:
    t = time.perf_counter()
    before = os.times()
    subprocess.run(
        [sys.executable, "-m", "ddpify", "lint", "-q", *paths],
        cwd=ROOT,
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    after = os.times()
    return time.perf_counter() - t, (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mirrors", default=os.environ.get("RW_MIRRORS", "/work/.mirror"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--results", default=str(HERE / "results.txt"))
    args = ap.parse_args()
    import libcst

    out = [
        f"# ddpify lint speed benchmark, {time.strftime('%Y-%m-%d %H:%M:%S %z')}",
        "",
        f"command: python bench/lint/run_lint_bench.py {' '.join(sys.argv[1:])}".rstrip(),
        f"cpus: {os.cpu_count()} (affinity {sorted(os.sched_getaffinity(0))}), {platform.processor() or platform.machine()}",
        f"python: {platform.python_version()}, libcst {getattr(libcst, '__version__', '?')}",
        f"git: {subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True).stdout.strip()}",
        f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        "",
        "| corpus | files | lines/file | lint ms/file (CPU) | lint ms/file (wall) | LibCST parse ms/file (CPU) | lint / parse | <= 100 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="lint-bench-") as tmp:
        rw = realworld_files(Path(args.mirrors), Path(tmp))
        corpora = [
            ("realworld", rw),
            ("outputs", sorted(ROOT.glob("fixtures/*/expected.py"))),
            ("lint", sorted((ROOT / "fixtures" / "lint").rglob("*.py"))),
        ]
        total_s, total_n = 0.0, 0
        for name, paths in corpora:
            if paths:
                s, n = measure(name, paths, args.repeats, out)
                total_s, total_n = total_s + s, total_n + n
        out.append(
            f"| all | {total_n} | | {1000 * total_s / total_n:.1f} | | | | {'yes' if 1000 * total_s / total_n <= TARGET_MS else 'NO'} |"
        )
        everything = [str(p) for _, ps in corpora for p in ps]
        wall, cpu = cli_run(everything)
        out += [
            "",
            f"`ddpify lint -q` on all {len(everything)} files, one process: {wall:.1f} s wall, {cpu:.1f} s CPU "
            f"({1000 * cpu / len(everything):.0f} ms CPU a file, start-up included)",
        ]
        one = str(ROOT / "fixtures" / "lint" / "clean" / "c03_trainer_snapshots.py")
        singles = [cli_run([one]) for _ in range(5)]
        out.append(
            f"`ddpify lint` on one file (a pre-commit run), median of 5: {statistics.median(w for w, _ in singles):.2f} s wall, "
            f"{statistics.median(c for _, c in singles):.2f} s CPU"
        )
    out += ["", f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"]
    text = "\n".join(out) + "\n"
    print(text, end="")
    Path(args.results).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
