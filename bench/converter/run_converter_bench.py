"""Converter-speed benchmark: `ddpify --check` over a corpus against a bare LibCST floor.

    python bench/converter/run_converter_bench.py            # writes bench/converter/results.txt

In one run, on the same generated corpus (make_corpus.py: every fixture and GPU benchmark
script in five variations, then generated ones up to --count):
  floor      a fresh Python that imports libcst and parse_module(...).code's every file,
             pinned to one core;
  -j 1       `python -m ddpify --check -q FILES` pinned to the same core;
  -j 2       `python -m ddpify --check -q -j 2 FILES`, not pinned (both cores);
each timed --repeats times, interleaved so that load from elsewhere hits them alike;
then one ~300-line file through the CLI as a pre-commit hook runs it (--single-runs
times), with `python -c pass` and `python -c "import libcst"` for scale; then, in this
process, parse+print against convert_source per file, without process start-up.
Wall time is what the targets are about; child CPU time (user+sys) is shown beside it
because this small machine is shared and CPU time is less disturbed by other load.
Targets: `-j 1` at most 2.0x the floor; one file at most 200 ms, shown beside the start-up
every such run pays before ddpify's own work (`python -c "import libcst"`). The children run
with Python's bytecode cache on (PYTHONDONTWRITEBYTECODE dropped; the untimed pass writes it),
as an installed ddpify has it: without it every run compiles ddpify's modules again.
--profile adds cProfile's top functions of convert_source over the corpus.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import platform
import pstats
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import make_corpus  # noqa: E402

FLOOR = r"""
import sys, time
t0 = time.perf_counter()
import libcst
t1 = time.perf_counter()
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        src = f.read().decode("utf-8")
    if libcst.parse_module(src).code != src:
        raise SystemExit(f"round trip differs: {path}")
t2 = time.perf_counter()
print(f"import_s={t1 - t0:.4f} parse_print_s={t2 - t1:.4f}")
"""


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), env.get("PYTHONPATH", "")])
    )
    env["NO_COLOR"] = "1"
    # an installed package has its bytecode compiled; a run that compiles ddpify's modules
    # every time measures the compiler
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def timed(cmd: list[str], cpu: int | None, env: dict, cwd: str) -> dict:
    """Run cmd; wall seconds, the child's user+sys CPU seconds, exit code, output."""
    pre = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=cwd, preexec_fn=pre
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "wall": wall,
        "cpu": cpu_s,
        "rc": r.returncode,
        "out": r.stdout,
        "err": r.stderr,
    }


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def machine() -> list[str]:
    model = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import importlib.metadata as md

    def ver(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return "not installed"

    rev = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--short", "--", "ddpify"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return [
        f"cpus: {os.cpu_count()} (affinity {sorted(os.sched_getaffinity(0))}), {model}",
        f"python: {sys.version.split()[0]} ({platform.python_implementation()}), {platform.platform()}",
        f"libcst: {ver('libcst')}, click: {ver('click')}",
        f"ddpify: git {rev or '(no commit)'}{' + uncommitted changes under ddpify/' if dirty else ''}",
        f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
    ]


def in_process(paths: list[Path], profile: bool) -> tuple[dict, str]:
    import libcst

    from ddpify import Options, convert_source

    import ddpify.pipeline as pipeline

    sources = [p.read_text() for p in paths]
    gate_check, gate_s = pipeline.gate.check, [0.0]

    def timed_gate(*args, **kwargs):
        t = time.perf_counter()
        try:
            return gate_check(*args, **kwargs)
        finally:
            gate_s[0] += time.perf_counter() - t

    for src in sources[:5]:  # warm imports and caches
        libcst.parse_module(src).code
        try:
            convert_source(src, Options())
        except Exception:
            pass
    t_parse, t_conv, errors, per_file = 0.0, 0.0, 0, []
    pipeline.gate.check = timed_gate  # the gate's share of the conversions
    for path, src in zip(paths, sources):
        t0 = time.perf_counter()
        libcst.parse_module(src).code
        t1 = time.perf_counter()
        try:
            convert_source(src, Options(), path=str(path))
        except Exception:
            errors += 1
        t2 = time.perf_counter()
        t_parse += t1 - t0
        t_conv += t2 - t1
        per_file.append(((t2 - t1) / (t1 - t0), path.name, src.count("\n")))
    pipeline.gate.check = gate_check
    res = {
        "parse_print_s": t_parse,
        "convert_s": t_conv,
        "gate_s": gate_s[0],
        "errors": errors,
        "slowest": sorted(per_file, reverse=True)[:5],
    }
    prof_text = ""
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        for path, src in zip(paths, sources):
            try:
                convert_source(src, Options(), path=str(path))
            except Exception:
                pass
        prof.disable()
        buf = io.StringIO()
        st = pstats.Stats(prof, stream=buf).strip_dirs()
        buf.write(
            "== cProfile of convert_source over the corpus, by cumulative time ==\n"
        )
        st.sort_stats("cumulative").print_stats(30)
        buf.write("== by own time ==\n")
        st.sort_stats("tottime").print_stats(20)
        prof_text = buf.getvalue()
    return res, prof_text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--corpus",
        type=Path,
        help="directory for the generated corpus (default: a temporary one)",
    )
    p.add_argument(
        "--count", type=int, default=240, help="scripts in the corpus (>= 200)"
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="timed repeats of floor, -j 1 and -j 2"
    )
    p.add_argument(
        "--single-runs",
        type=int,
        default=7,
        help="runs of the one-file pre-commit timing",
    )
    p.add_argument(
        "--profile", action="store_true", help="add a cProfile of convert_source"
    )
    p.add_argument(
        "--results",
        type=Path,
        default=HERE / "results.txt",
        help="where to write the record ('-': nowhere)",
    )
    a = p.parse_args(argv)
    command = "python " + " ".join(
        shlex.quote(x)
        for x in [os.path.relpath(__file__, REPO), *(argv or sys.argv[1:])]
    )
    started = time.strftime("%Y-%m-%d %H:%M:%S %z")

    tmp = None
    corpus_dir = a.corpus
    if corpus_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="ddpify-corpus-")
        corpus_dir = Path(tmp.name)
    summary = make_corpus.generate(corpus_dir, a.count)
    files = summary["paths"]
    big = summary["precommit"]
    floor_py = corpus_dir / "floor.py"
    floor_py.write_text(FLOOR)
    env = child_env()
    cwd = str(corpus_dir)
    cpu0 = min(os.sched_getaffinity(0))
    py = sys.executable
    ddpify = [py, "-m", "ddpify", "--check", "-q"]
    lines = [
        f"# ddpify converter-speed benchmark, {started}",
        "",
        f"command: {command}",
        *machine(),
        f"corpus: {summary['files']} scripts, {summary['lines']} lines, {summary['kinds']}; "
        f"one-file test: precommit_300.py, {summary['precommit_lines']} lines",
        "",
    ]

    # One untimed pass: does the converter work, and what does it say about the corpus?
    check = timed(ddpify + files, None, env, cwd)
    failed = [ln for ln in check["err"].splitlines() if ": error:" in ln]
    lines.append(
        f"untimed check pass: exit {check['rc']} (0: nothing to convert, 1: would convert, 2: some file failed); "
        f"{len(failed)} of {len(files)} files failed to convert"
    )
    lines += [f"  {ln}" for ln in failed[:10]]
    working = (
        check["rc"] in (0, 1, 2)
        and len(failed) < len(files)
        and "Traceback" not in check["err"]
    )
    if not working:
        lines += [
            "",
            "The converter does not work on this corpus yet; no timing taken.",
            check["err"][-2000:],
        ]
        print("\n".join(lines))
        if str(a.results) != "-":
            a.results.write_text("\n".join(lines) + "\n")
        return 1

    runs: dict[str, list[dict]] = {"floor": [], "j1": [], "j2": []}
    for _ in range(a.repeats):
        runs["floor"].append(timed([py, str(floor_py), *files], cpu0, env, cwd))
        runs["j1"].append(timed(ddpify + files, cpu0, env, cwd))
        runs["j2"].append(timed(ddpify + ["-j", "2"] + files, None, env, cwd))
    for name, rs in runs.items():
        for r in rs:
            if r["rc"] not in (0, 1, 2) or (name == "floor" and r["rc"] != 0):
                lines.append(f"WARNING: {name} run exited {r['rc']}: {r['err'][-500:]}")

    single = [timed(ddpify + [big], None, env, cwd) for _ in range(a.single_runs)]
    bare = [timed([py, "-c", "pass"], None, env, cwd) for _ in range(3)]
    imp = [timed([py, "-c", "import libcst"], None, env, cwd) for _ in range(3)]
    imp_ddpify = [
        timed([py, "-c", "import ddpify.cli, ddpify.pipeline"], None, env, cwd)
        for _ in range(3)
    ]
    inproc, prof_text = in_process([Path(f) for f in files], a.profile)

    w = {k: med([r["wall"] for r in v]) for k, v in runs.items()}
    c = {k: med([r["cpu"] for r in v]) for k, v in runs.items()}
    sw = [r["wall"] for r in single]
    ratio = w["j1"] / w["floor"]
    speedup = w["j1"] / w["j2"]
    one = statistics.mean(sw)
    inratio = inproc["convert_s"] / inproc["parse_print_s"]

    cratio = c["j1"] / c["floor"]
    import_libcst = med([r["wall"] for r in imp])
    ddpify_part = one - import_libcst
    cspeed = c["j1"] / c["j2"]

    def row(name, key):
        return f"| {name} | {med([r['wall'] for r in key]):.3f} | {med([r['cpu'] for r in key]):.3f} | | | |"

    table = [
        "| measure | wall s | CPU s | wall figure | CPU figure | target met (wall) |",
        "|---|---|---|---|---|---|",
        f"| floor: LibCST parse + print of every file, 1 core | {w['floor']:.2f} | {c['floor']:.2f} | 1.00x | 1.00x | |",
        f"| `ddpify --check -j 1`, 1 core | {w['j1']:.2f} | {c['j1']:.2f} | {ratio:.2f}x floor | {cratio:.2f}x floor | <= 2.0x: {'yes' if ratio <= 2.0 else 'NO'} |",
        f"| `ddpify --check -j 2` | {w['j2']:.2f} | {c['j2']:.2f} | {speedup:.2f}x faster than -j 1 | {cspeed:.2f}x less CPU than -j 1 | > 1x: {'yes' if speedup > 1 else 'NO'} |",
        f"| one {summary['precommit_lines']}-line file, `ddpify --check` (mean of {len(sw)}) | {one:.3f} | {statistics.mean(r['cpu'] for r in single):.3f} | min {min(sw):.3f}, max {max(sw):.3f}; {one / import_libcst:.2f}x `import libcst` | | <= 0.200 s: {'yes' if one <= 0.2 else 'NO'} |",
        f'| the same, less `python -c "import libcst"` (ddpify\'s own imports and work) | {ddpify_part:.3f} | | | | |',
        row("`python -c pass` (start-up, for scale)", bare),
        row('`python -c "import libcst"` (for scale)', imp),
        row('`python -c "import ddpify.cli, ddpify.pipeline"` (for scale)', imp_ddpify),
        f"| in-process, all files: parse + print | {inproc['parse_print_s']:.2f} | | | | |",
        f"| in-process, all files: `convert_source` | {inproc['convert_s']:.2f} | | {inratio:.2f}x parse + print | | |",
        f"| in-process: the invariant gate inside those conversions | {inproc['gate_s']:.2f} | | {100 * inproc['gate_s'] / inproc['convert_s']:.1f}% of convert_source | | < 15%: {'yes' if inproc['gate_s'] < 0.15 * inproc['convert_s'] else 'NO'} |",
    ]
    lines += [
        "",
        *table,
        "",
        f"Figures: median of {a.repeats} interleaved repeats (wall: elapsed; CPU: user+sys of the child and its workers).",
        f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        "",
        "raw (seconds):",
    ]
    for k, v in runs.items():
        lines.append(
            f"  {k}: wall {[round(r['wall'], 3) for r in v]} cpu {[round(r['cpu'], 3) for r in v]} rc {[r['rc'] for r in v]}"
        )
        if k == "floor":
            lines.append(f"  floor inside the child: {[r['out'].strip() for r in v]}")
    lines.append(
        f"  single file: wall {[round(x, 3) for x in sw]} rc {[r['rc'] for r in single]}"
    )
    lines.append(
        f"  python -c pass: {[round(r['wall'], 3) for r in bare]}; import libcst: {[round(r['wall'], 3) for r in imp]}; "
        f"import ddpify: {[round(r['wall'], 3) for r in imp_ddpify]}"
    )
    lines.append(
        f"  in-process convert_source errors: {inproc['errors']}; slowest files by convert/parse ratio: "
        + ", ".join(f"{n} ({l} lines) {x:.1f}x" for x, n, l in inproc["slowest"])
    )
    if prof_text:
        lines += ["", prof_text]
    text = "\n".join(lines) + "\n"
    print(text)
    if str(a.results) != "-":
        a.results.write_text(text)
        print(f"written to {a.results}")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
