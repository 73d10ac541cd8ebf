"""Training-speed benchmark of ddpify's output against hand-written DDP and Accelerate.

One command runs the comparison:  python bench/gpu/run_gpu_bench.py
(by default: the GPUs this machine has, 1 or 2, default precision, ddpify, hand-written DDP,
Accelerate and ddpify --optimize, 5 rounds of 100 timed steps after 10 untimed ones). Rounds can
be split over several calls (--part K/N runs the K-th of N shares of the rounds) and their
results merged:  python bench/gpu/run_gpu_bench.py merge DIR... --out DIR
A ratio is reported only where at least --min-rounds (5) rounds ran both variants.

For each model (cnn, gpt, text) it converts <model>_single.py with ddpify (--amp auto for the
default precision, --amp none for fp32), then launches, with torchrun, each variant
(ddpify's output, <model>_ddp_handwritten.py, <model>_accelerate.py) at each GPU count
and precision. Variants: ddpify-opt (ddpify --optimize) and opt-<name> (ddpify --optimize-only
<name>, each speed-up on its own; not launched where the conversion equals plain ddpify's).
Each script prints "BENCH samples_per_s=<global rate> ..." on rank 0 (see benchmodels.StepTimer).

Order matters: a machine that warms up during the run favours whatever runs last. So the GPUs
are first loaded with untimed matrix products (--warm-up seconds, while ddpify converts), and
with --rounds N every variant runs once per round, in an order that changes from round to round
(rows of a Williams Latin square: each variant takes each place once, and follows each other
variant once, every len(variants) rounds). Ratios are taken within a round and reported as the
median over rounds with their min and max. --rounds 1 is a single pass in order of importance.

Writes to --out (default $OUT, else bench/gpu/results/local/): gpu_results.md (tables, target
checks, command, machine), gpu_results.json (every run's parsed figures), raw_logs.txt
(every launch's full output, conversion logs included), converted.txt (the scripts
ddpify produced), machine.txt, and profiles.txt with --profile. A failing or hung
variant is recorded and the rest go on; --budget bounds the whole run: with --rounds, a round
starts only if the longest round so far still fits; with one pass, runs are ordered by importance
and those that no longer fit are listed as skipped. rounds.csv holds every launch's figures.
--dry-run prints the launch order and stops; --smoke runs tiny models on CPU (gloo).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MODELS = ("cnn", "gpt", "text")
BASE_VARIANTS = ("ddpify", "handwritten", "accelerate")
# ddpify --optimize: every speed-up together, then each on its own (--optimize-only).
OPTIMIZATIONS = (
    "channels-last",
    "fused-optimizer",
    "ddp-buckets",
    "static-graph",
    "cudnn-benchmark",
    "loader-workers",
)
OPT_VARIANTS = ("ddpify-opt",) + tuple(f"opt-{o}" for o in OPTIMIZATIONS)
VARIANTS = BASE_VARIANTS + OPT_VARIANTS
DDPIFY_VARIANTS = ("ddpify",) + OPT_VARIANTS
# Targets for the optimised output at the largest GPU count: ratio to hand-written DDP (none for text).
OPT_TARGET = {"cnn": 1.3, "gpt": 1.05}
# Scaling-efficiency targets at 4 GPUs.
SCALING_TARGET = {"cnn": 0.96, "gpt": 0.93}
SMOKE_ARGS = {
    "cnn": ["--smoke", "--batch-size", "4", "--workers", "1", "--dataset-size", "512"],
    "gpt": ["--smoke", "--batch-size", "2", "--workers", "1", "--dataset-size", "512"],
    "text": ["--smoke", "--batch-size", "4", "--workers", "1", "--dataset-size", "512"],
}
AMP_FOR = {"default": "auto", "fp32": "none"}
LABEL = {
    "ddpify": "ddpify",
    "handwritten": "hand-written DDP",
    "accelerate": "Accelerate",
    "original": "single-GPU script",
}


@dataclass
class Run:
    model: str
    variant: str  # ddpify | handwritten | accelerate | original | ddpify-opt | opt-<speed-up>
    precision: str  # default | fp32
    gpus: int
    round: int = 0  # 1..N with --rounds N >= 2; 0 in a single pass
    place: int = (
        0  # position among its configuration's variants in this round (0 = first)
    )
    status: str = "pending"  # ok | failed | timeout | no-bench-line | invalid | skipped
    reason: str = ""
    wall_s: float = 0.0
    started_s: float = 0.0  # seconds after the benchmark began
    command: str = ""
    figures: dict = field(default_factory=dict)
    phases: dict = field(default_factory=dict)

    @property
    def config(self) -> tuple[str, str, int]:
        return (self.model, self.precision, self.gpus)

    @property
    def name(self) -> str:
        return f"{self.model}-{self.variant}-{self.precision}-{self.gpus}gpu" + (
            f"-r{self.round}" if self.round else ""
        )

    @property
    def rate(self) -> float | None:
        return self.figures.get("samples_per_s") if self.status == "ok" else None


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--gpus",
        type=int,
        nargs="+",
        default=None,
        help="GPU counts (default precision; default: 1 where one GPU is visible, 2 where "
        "two are, 1 2 4 where more)",
    )
    p.add_argument(
        "--fp32-gpus",
        type=int,
        nargs="*",
        default=[1, 4],
        help="GPU counts also run in fp32",
    )
    p.add_argument(
        "--precisions",
        nargs="+",
        choices=["default", "fp32"],
        default=["default"],
    )
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=list(BASE_VARIANTS) + ["ddpify-opt"],
        help="ddpify-opt: ddpify --optimize; opt-<name>: ddpify --optimize-only <name> (launched only where it changes the conversion)",
    )
    p.add_argument(
        "--no-original",
        action="store_true",
        help="skip the unconverted script (fp32, 1 GPU)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="untimed steps per run (default 10; smoke 2)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="timed steps per run (default 100; smoke 4)",
    )
    p.add_argument(
        "--chunk", type=int, default=10, help="steps between synchronised time marks"
    )
    p.add_argument(
        "--timeout", type=float, default=150.0, help="seconds one launch may take"
    )
    p.add_argument(
        "--budget",
        type=float,
        default=450.0,
        help="seconds: with --rounds, no round starts that the longest round so far would carry past it "
        "(and no launch starts 60 s past it); in one pass, no launch starts past it",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="every variant once per round, order rotated between rounds (1: one pass in order "
        "of importance)",
    )
    p.add_argument(
        "--part",
        default="1/1",
        help="K/N: run the K-th of N shares of the rounds (rounds keep their numbers, and so "
        "their launch order); merge the parts' results with the merge command",
    )
    p.add_argument(
        "--min-rounds",
        type=int,
        default=5,
        help="a ratio is reported where at least this many rounds ran both variants "
        "(fewer with --rounds below it)",
    )
    p.add_argument(
        "--warm-up",
        type=float,
        default=None,
        dest="warm_up",
        help="seconds of untimed matrix products on every GPU before the first launch (default 30; 0: none)",
    )
    p.add_argument(
        "--warm-up-launch",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one untimed launch of each model's hand-written script before round 1 (default: on, off with --smoke)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the launch order and stop (no conversion, no launch)",
    )
    p.add_argument(
        "--out", default=os.environ.get("OUT") or str(HERE / "results" / "local")
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny models, few steps: a CPU check of the harness",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="profile a few timed steps of each run (timings then not comparable)",
    )
    p.add_argument(
        "--ddpify-cmd",
        default=f"{shlex.quote(sys.executable)} -m ddpify",
        help="how to call ddpify",
    )
    p.add_argument(
        "--script-args", default="", help="extra arguments for every training script"
    )
    args = p.parse_args(argv)
    if args.warmup is None:
        args.warmup = 2 if args.smoke else 10
    if args.steps is None:
        args.steps = 4 if args.smoke else 100
    if args.warm_up is None:
        args.warm_up = 0.0 if args.smoke else 30.0
    if args.warm_up_launch is None:
        args.warm_up_launch = not args.smoke
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    try:
        args.part = part_of(args.part, args.rounds)
    except ValueError as e:
        p.error(str(e))
    if args.gpus is None:
        args.gpus = default_gpus(visible_gpus())
    return args


def part_of(text: str, rounds: int) -> tuple[int, int]:
    """(K, N) of "K/N", checked against the rounds asked for."""
    try:
        k, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise ValueError(f"--part takes K/N (e.g. 2/3), not {text!r}") from None
    if not 1 <= k <= n or (n > rounds and rounds > 1) or (rounds == 1 and n != 1):
        raise ValueError(f"--part {text}: needs 1 <= K <= N <= --rounds ({rounds})")
    return k, n


def part_rounds(rounds: int, k: int, n: int) -> list[int]:
    """The rounds (0-based) of the K-th of N shares: consecutive, the earlier shares one
    longer where they do not divide evenly (5 rounds in 3: 0 1 | 2 3 | 4)."""
    base, extra = divmod(rounds, n)
    start = (k - 1) * base + min(k - 1, extra)
    return list(range(start, start + base + (1 if k <= extra else 0)))


def visible_gpus() -> int:
    """GPUs this machine shows (nvidia-smi; CUDA_VISIBLE_DEVICES narrows them), 0 without."""
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    if seen is not None and seen.strip() not in ("", "all"):
        return len([x for x in seen.split(",") if x.strip()])
    if not shutil.which("nvidia-smi"):
        return 0
    return sum(
        1 for ln in sh(["nvidia-smi", "-L"]).splitlines() if ln.startswith("GPU ")
    )


def default_gpus(visible: int) -> list[int]:
    """Report on 1 GPU where one is lent, on 2 where two are; 1, 2 and 4 on a larger host."""
    if visible <= 1:
        return [1]
    if visible == 2:
        return [2]
    return [n for n in (1, 2, 4) if n <= visible]


def sh(cmd: list[str] | str, timeout: float = 60) -> str:
    try:
        r = subprocess.run(
            cmd,
            shell=isinstance(cmd, str),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return (r.stdout + r.stderr).strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"({e})"


def machine_info(argv: list[str]) -> str:
    env_py = "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count(), 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else '-')"
    lines = [
        f"date: {time.strftime('%Y-%m-%d %H:%M:%S %z')}",
        f"command: {' '.join(shlex.quote(a) for a in argv)}",
        f"cwd: {os.getcwd()}",
        f"host: {platform.node()}  cpus: {os.cpu_count()}  platform: {platform.platform()}",
        f"python: {sys.version.split()[0]} ({sys.executable})",
        f"{sh([sys.executable, '-c', env_py])}",
    ]
    for pkg in ("accelerate", "libcst", "ddpify"):
        ver = sh(
            [
                sys.executable,
                "-c",
                f"import importlib.metadata as m; print(m.version('{pkg}'))",
            ]
        )
        lines.append(f"{pkg}: {ver.splitlines()[-1] if ver else '?'}")
    lines.append(
        f"git: {sh(['git', '-C', str(REPO), 'rev-parse', 'HEAD'])} {sh(['git', '-C', str(REPO), 'status', '--short', '--', 'ddpify', 'bench'])[:2000]}"
    )
    if (
        REPO / "REVISION"
    ).is_file():  # a copy of the tree without .git says which commit it is
        lines.append(f"tree copied from: {(REPO / 'REVISION').read_text().strip()}")
    for k in (
        "NCCL_NVLS_ENABLE",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST",
        "OMP_NUM_THREADS",
        "CUDA_VISIBLE_DEVICES",
    ):
        lines.append(f"env {k}={os.environ.get(k, '')}")
    if shutil.which("nvidia-smi"):
        lines.append(
            sh(
                [
                    "nvidia-smi",
                    "--query-gpu=index,name,memory.total,driver_version,clocks.max.sm,power.limit",
                    "--format=csv",
                ]
            )
        )
        lines.append(sh(["nvidia-smi", "topo", "-m"]))
    else:
        lines.append("nvidia-smi: not found (no NVIDIA GPU here)")
    return "\n".join(lines) + "\n"


class Log:
    """Everything any launch printed, in one text file (a remote machine may return few files)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_text("")

    def add(self, title: str, body: str) -> None:
        with self.path.open("a") as f:
            f.write(f"\n===== {title} =====\n{body.rstrip()}\n")


def optimize_flags(variant: str) -> str:
    if variant == "ddpify-opt":
        return " --optimize"
    if variant.startswith("opt-"):
        return f" --optimize-only {variant[4:]}"
    return ""


def convert(
    args, model: str, amp: str, work: Path, log: Log, variant: str = "ddpify"
) -> tuple[Path | None, str, list[str], tuple[str, str]]:
    """Copy <model>_single.py and convert it in place with the ddpify CLI; None if that failed.
    The last item is the log entry (title, output), written by the caller: conversions run in parallel."""
    # One folder per conversion: conversions run in parallel, and each converts its own benchmodels.py.
    dst = work / variant / model / f"{model}_ddpify_{amp}.py"
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / f"{model}_single.py", dst)
    # --optimize reads the model's class from the module beside the script.
    shutil.copy(HERE / "benchmodels.py", dst.parent / "benchmodels.py")
    cmd = f"{args.ddpify_cmd} --amp {amp}{optimize_flags(variant)} {shlex.quote(str(dst))}"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])
        ),
    )
    try:
        r = subprocess.run(
            cmd, shell=True, capture_output=True, text=True, timeout=120, env=env
        )
        out, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired:
        out, rc = "(timed out after 120 s)", -1
    entry = (f"convert {model} --amp {amp} ({variant}): {cmd} (rc={rc})", out)
    # Findings without [*] are ones ddpify could not fix: the output may be incomplete.
    manual = [
        ln.split(": ", 1)[-1]
        for ln in out.splitlines()
        if re.search(r": DDP\d+ ", ln) and "[*]" not in ln
    ]
    text = dst.read_text()
    if rc != 0:
        return (
            None,
            f"ddpify exited {rc}: {out.strip().splitlines()[-1] if out.strip() else ''}",
            manual,
            entry,
        )
    if text == (HERE / f"{model}_single.py").read_text():
        return None, "ddpify left the script unchanged", manual, entry
    if "ddp_in_place(" not in text and "DistributedDataParallel(" not in text:
        # Would run as N independent trainings: fast and meaningless; save the GPU time.
        return (
            None,
            "ddpify's output makes no model distributed (see its findings)",
            manual,
            entry,
        )
    return dst, "", manual, entry


def latin_row(k: int, r: int) -> list[int]:
    """Row r of a Williams design over k items: over k rows (2k if k is odd) each item takes each
    place once and directly follows each other item once, so neither place nor predecessor favours one."""
    first, lo, hi = [0], 1, k - 1
    while len(first) < k:
        first.append(lo if len(first) % 2 else hi)
        lo, hi = (lo + 1, hi) if len(first) % 2 == 0 else (lo, hi - 1)
    row = [(x + r) % k for x in first]
    return row[::-1] if k % 2 and (r // k) % 2 else row


def plan(args) -> list[Run]:
    def ordered(counts):
        # 1 GPU and the largest count first: they carry the ratio and scaling targets.
        counts = sorted(set(counts))
        first = [c for c in (1, counts[-1]) if c in counts] if counts else []
        return list(dict.fromkeys(first + counts))

    groups = []
    if "default" in args.precisions:
        groups += [("default", n) for n in ordered(args.gpus)]
    if "fp32" in args.precisions:
        groups += [("fp32", n) for n in ordered(args.fp32_gpus or [])]

    def variants_of(precision, n):
        return list(args.variants) + (
            ["original"]
            if precision == "fp32" and n == 1 and not args.no_original
            else []
        )

    runs: list[Run] = []
    if args.rounds > 1:
        for r in part_rounds(args.rounds, *args.part):
            for precision, n in groups:
                # The models take turns going first too.
                models = (
                    args.models[r % len(args.models) :]
                    + args.models[: r % len(args.models)]
                )
                for model in models:
                    vs = variants_of(precision, n)
                    for place, i in enumerate(latin_row(len(vs), r)):
                        runs.append(
                            Run(model, vs[i], precision, n, round=r + 1, place=place)
                        )
        return runs
    for precision, n in groups:
        for model in args.models:
            for place, variant in enumerate(variants_of(precision, n)):
                runs.append(Run(model, variant, precision, n, place=place))
    # Each speed-up on its own (opt-<name>) after every comparison of the others, at the largest count first.
    return sorted(
        runs,
        key=lambda r: (
            r.variant.startswith("opt-"),
            -r.gpus if r.variant.startswith("opt-") else 0,
        ),
    )


WARM_UP_CODE = r"""
import sys, time, torch
secs, n = float(sys.argv[1]), torch.cuda.device_count()
mats = [torch.randn(8192, 8192, device=f"cuda:{d}", dtype=torch.bfloat16) for d in range(n)]
first, last, t0 = [None] * n, [0.0] * n, time.time()
while time.time() - t0 < secs:
    evs = []
    for d, a in enumerate(mats):  # queue work on every GPU before waiting on any
        with torch.cuda.device(d):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(20):
                torch.mm(a, a)
            e1.record()
            evs.append((e0, e1))
    for d, (e0, e1) in enumerate(evs):
        e1.synchronize()
        tflops = 20 * 2 * 8192**3 / (e0.elapsed_time(e1) / 1e3) / 1e12
        first[d] = tflops if first[d] is None else first[d]
        last[d] = tflops
for d in range(n):
    print(f"WARM gpu={d} name={torch.cuda.get_device_name(d).replace(' ', '_')} first_tflops={first[d] or 0:.0f} last_tflops={last[d]:.0f}")
"""


def start_warm_up(args) -> subprocess.Popen | None:
    """Untimed bf16 matrix products on every GPU, so that clocks and temperatures settle before round 1."""
    if args.smoke or args.warm_up <= 0 or not shutil.which("nvidia-smi"):
        return None
    return subprocess.Popen(
        [sys.executable, "-c", WARM_UP_CODE, str(args.warm_up)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish_warm_up(args, proc: subprocess.Popen | None, log: "Log") -> str:
    if proc is None:
        why = (
            "--smoke"
            if args.smoke
            else "--warm-up 0"
            if args.warm_up <= 0
            else "no nvidia-smi: no NVIDIA GPU"
        )
        return f"GPU warm-up: none ({why})."
    try:
        out, _ = proc.communicate(timeout=args.warm_up + 120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += "\n(killed: the warm-up ran over its time)"
    clocks = sh(
        [
            "nvidia-smi",
            "--query-gpu=index,clocks.sm,clocks.mem,temperature.gpu,power.draw",
            "--format=csv",
        ]
    )
    log.add(
        f"GPU warm-up, {args.warm_up:.0f} s of bf16 8192x8192 matrix products (rc={proc.returncode})",
        out + "\n" + clocks,
    )
    figs = [
        dict(re.findall(r"(\w+)=(\S+)", ln))
        for ln in out.splitlines()
        if ln.startswith("WARM ")
    ]
    per = "; ".join(
        f"GPU {f['gpu']}: {f['first_tflops']} TFLOP/s at the start, {f['last_tflops']} at the end"
        for f in figs
    )
    return f"GPU warm-up: {args.warm_up:.0f} s of bf16 8192x8192 matrix products on every GPU before round 1 ({per or 'no figures: see raw_logs.txt'})."


def script_args(args, run: Run) -> list[str]:
    extra = (SMOKE_ARGS[run.model] if args.smoke else []) + shlex.split(
        args.script_args
    )
    if run.variant in ("handwritten", "accelerate"):
        extra += ["--precision", run.precision]
    return extra


def warm_up_launches(
    args, runs: list[Run], env: dict, log: "Log", t_start: float
) -> list[Run]:
    """One untimed launch of each model's hand-written script per configuration, before round 1.

    The first launch of a model on a fresh machine runs its first steps slowly (seen on 2x H200:
    GPT's first step 1.6-2.2 s instead of 0.7 s; the text model's warm-up steps 5x slower and a
    timed chunk at less than half the rate), whichever variant it is; later launches of the same
    model do not pay it, and matrix products on the GPUs beforehand did not remove it. So a model's
    first launch is an untimed one. Its figures go in no ratio."""
    if not args.warm_up_launch:
        return []
    warm_runs = []
    for m, p, n in dict.fromkeys(r.config for r in runs):
        run = Run(m, "handwritten", p, n, place=-1)
        run.started_s = round(time.monotonic() - t_start, 1)
        launch(
            args,
            run,
            HERE / f"{m}_ddp_handwritten.py",
            script_args(args, run),
            env,
            log,
            args.timeout,
        )
        figure = (
            f"{run.rate:.1f} samples/s"
            if run.rate
            else f"{run.status} {run.reason}"[:200]
        )
        print(
            f"[warm-up {time.monotonic() - t_start:5.0f}s] {run.name}: {figure} ({run.wall_s} s, not in any ratio)",
            flush=True,
        )
        warm_runs.append(run)
    return warm_runs


def launch(
    args, run: Run, script: Path, extra: list[str], env: dict, log: Log, timeout: float
) -> None:
    if run.variant == "original":
        cmd = [sys.executable, str(script), *extra]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={run.gpus}",
            str(script),
            *extra,
        ]
    run.command = " ".join(shlex.quote(c) for c in cmd)
    t0 = time.monotonic()
    launched_at = time.time()
    with tempfile.TemporaryFile(mode="w+") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=str(HERE),
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # The whole process group: torchrun, its workers and their DataLoader workers.
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=wait)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
            rc = None
        run.wall_s = round(time.monotonic() - t0, 1)
        exited_at = time.time()
        out.seek(0)
        text = out.read()
    log.add(f"{run.name}: {run.command} (rc={rc}, {run.wall_s} s)", text)
    bench = [
        ln for ln in text.splitlines() if ln.startswith("BENCH ") and " rank=0" in ln
    ]
    if bench:
        run.figures = parse_bench(bench[-1])
        run.phases = phases(run.figures, launched_at, exited_at)
    if rc is None:
        run.status, run.reason = "timeout", f"killed after {timeout:.0f} s"
    elif rc != 0:
        err = [ln for ln in text.splitlines() if "Error" in ln or "error" in ln]
        run.status, run.reason = (
            "failed",
            f"exit {rc}: {(err[-1] if err else text.strip()[-300:])[:300]}",
        )
    elif "samples_per_s" not in run.figures:
        run.status, run.reason = (
            "no-bench-line",
            (bench[-1] if bench else "no BENCH line from rank 0"),
        )
    elif run.figures.get("ddp_modules") == 0 and (
        run.gpus > 1 or run.variant in DDPIFY_VARIANTS + ("handwritten",)
    ):
        # Accelerate alone skips DDP on one process; elsewhere no DDP means no gradient sync (or no like-for-like).
        run.status, run.reason = (
            "invalid",
            "no DistributedDataParallel module in rank 0: the model was not wrapped",
        )
    else:
        run.status = "ok"


def parse_bench(line: str) -> dict:
    figs: dict = {}
    for key, val in re.findall(r"(\w+)=(\S+)", line):
        if key == "chunk_rates":
            figs[key] = [float(v) for v in val.split(",") if v]
        else:
            try:
                figs[key] = float(val) if "." in val or "e" in val else int(val)
            except ValueError:
                figs[key] = val
    return figs


PHASES = ("start", "set-up", "first step", "warm-up", "timed", "exit")


def phases(f: dict, launched_at: float, exited_at: float) -> dict:
    """Where a launch's wall time went, from rank 0's wall-clock marks (benchmodels.StepTimer)."""
    marks = (
        [launched_at]
        + [f.get(k) for k in ("t_import", "t_timer", "t_step1", "t_timed", "t_end")]
        + [exited_at]
    )
    if not all(isinstance(m, (int, float)) and m > 0 for m in marks):
        return {}
    # start: launcher and torch import; set-up: process group, data, model, DDP; first step: loader
    # start and first kernels; warm-up: the other untimed steps; exit: teardown after the last mark.
    return {name: round(b - a, 2) for name, a, b in zip(PHASES, marks, marks[1:])}


def spread(run: Run) -> float | None:
    c = run.figures.get("chunk_rates") or []
    if run.status != "ok" or len(c) < 2:
        return None
    return (max(c) - min(c)) / 2 / (sum(c) / len(c))


def fmt_rate(run: Run | None) -> str:
    if run is None:
        return "-"
    if run.rate is None:
        return f"{run.status}"
    s = spread(run)
    return f"{run.rate:.1f}" + (f" (±{100 * s:.1f}%)" if s is not None else "")


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.3f}" if a and b else "-"


def stats(values: list[float]) -> tuple[float, float, float, int] | None:
    """(median, min, max, count) or None."""
    return (
        (statistics.median(values), min(values), max(values), len(values))
        if values
        else None
    )


def reading(st) -> str:
    """Whether the rounds' spread allows saying on which side of 1 a ratio lies."""
    if st is None:
        return "-"
    med, lo, hi, k = st
    if k < 2:
        return "one round: no spread"
    half = (hi - lo) / 2
    if abs(med - 1) < half:
        return f"spread wider than the effect (|median-1| {abs(med - 1):.3f} < half-spread {half:.3f})"
    side = "above" if med > 1 else "below"
    every = " in every round" if (lo > 1 if med > 1 else hi < 1) else ""
    return f"{side} 1{every} (|median-1| {abs(med - 1):.3f} >= half-spread {half:.3f})"


def part_note(args) -> str:
    if getattr(args, "merged", False):
        return "from the merged calls"
    k, n = getattr(args, "part", (1, 1))
    if n == 1:
        return "all in this call"
    mine = [r + 1 for r in part_rounds(args.rounds, k, n)]
    return f"this call: part {k} of {n}, rounds {', '.join(map(str, mine))}"


def need_rounds(args) -> int:
    """Rounds a ratio needs before it is reported (--min-rounds; all of them with fewer)."""
    return max(1, min(args.min_rounds, args.rounds))


def fmt_ratio(st, need: int, digits: int = 3) -> str:
    """fmt_stats where the ratio has its rounds; else how many it has."""
    if st is not None and st[3] < need:
        return f"{st[3]} of {need} rounds: not reported"
    return fmt_stats(st, digits)


def fmt_stats(st, digits: int = 3) -> str:
    if st is None:
        return "not measured"
    med, lo, hi, k = st
    return f"{med:.{digits}f}" + (
        f" [{lo:.{digits}f}, {hi:.{digits}f}]" if k > 1 else ""
    )


RATIOS = (
    ("ddpify", "handwritten"),
    ("ddpify", "accelerate"),
    ("ddpify-opt", "handwritten"),
    ("ddpify-opt", "ddpify"),
)


class Results:
    """The runs indexed by (model, variant, precision, GPUs), and figures over rounds."""

    def __init__(self, runs: list[Run]) -> None:
        self.runs = runs
        self.by: dict[tuple, list[Run]] = {}
        for r in runs:
            self.by.setdefault((r.model, r.variant, r.precision, r.gpus), []).append(r)

    def rates(self, m, v, p, n) -> list[float]:
        return [r.rate for r in self.by.get((m, v, p, n), []) if r.rate]

    def rate(self, m, v, p, n) -> float | None:
        xs = self.rates(m, v, p, n)
        return statistics.median(xs) if xs else None

    def per_round(self, m, a, b, p, n) -> dict[int, float]:
        """a/b within each round where both ran."""
        ra = {r.round: r.rate for r in self.by.get((m, a, p, n), []) if r.rate}
        rb = {r.round: r.rate for r in self.by.get((m, b, p, n), []) if r.rate}
        return {k: ra[k] / rb[k] for k in sorted(ra.keys() & rb.keys())}

    def ratio_stats(self, m, a, b, p, n):
        return stats(list(self.per_round(m, a, b, p, n).values()))

    def cell(self, m, v, p, n) -> str:
        rs = self.by.get((m, v, p, n), [])
        if not rs:
            return "-"
        if len(rs) == 1:
            return fmt_rate(rs[0])
        st = stats(self.rates(m, v, p, n))
        if st is None:
            return "/".join(sorted({r.status for r in rs}))
        return f"{st[0]:.1f} [{st[1]:.1f}, {st[2]:.1f}]" + (
            f" ({st[3]} of {len(rs)})" if st[3] < len(rs) else ""
        )


def report(
    args,
    runs: list[Run],
    machine: str,
    started: str,
    elapsed: float,
    notes: list[str],
    warm: str = "",
    warm_runs: list[Run] = (),
) -> str:
    res = Results(runs)
    rate = res.rate
    rounds = sorted({r.round for r in runs if r.status == "ok"} - {0})
    need = need_rounds(args)

    def eff(m, v, p, n):
        a, b = rate(m, v, p, n), rate(m, v, p, 1)
        return a / (n * b) if a and b else None

    unit = {
        "cnn": "images/s",
        "gpt": "sequences/s (1024 tokens)",
        "text": "sequences/s (8-512 tokens, padded per batch)",
    }
    title = {
        "cnn": "ResNet-50 (BatchNorm, 224x224, 256 images per GPU)",
        "gpt": "GPT (12 layers, width 1024, seq 1024, 8 sequences per GPU)",
        "text": "Text classifier (6-layer transformer encoder, width 512, variable-length padded batches, 64 sequences per GPU)",
    }
    if args.smoke:
        title = {m: f"{m} (SMOKE: tiny model, figures mean nothing)" for m in MODELS}
    out = [f"# GPU training-speed benchmark ({started})", ""]
    if args.profile:
        out += [
            "**Profiled run: the profiler slows the timed steps; these figures are not comparable.**",
            "",
        ]
    out += [
        f"Global samples/s over {args.steps} timed steps after {args.warmup} warm-up steps, per-process batch unchanged "
        f"from the single-GPU script. "
        + (
            f"{args.rounds} rounds requested ({part_note(args)}), {len(rounds)} ran: every variant once per round, in an order rotated between "
            "rounds (Williams Latin square); a rate is the median over rounds [min, max], a ratio the median of the "
            f"per-round ratios [min, max], reported where at least {need} rounds ran both variants. "
            if args.rounds > 1
            else f"(±x%) is half the range of the per-{args.chunk}-step rates. "
        )
        + "Scaling = rate at N GPUs / (N x rate at 1 GPU) of the same variant. Ratios > 1 mean ddpify's output is faster.",
        "",
    ]
    if warm:
        out += [warm, ""]
    if warm_runs:
        out += [
            "Warm-up launches before round 1 (untimed for the comparison: in no ratio): "
            + "; ".join(f"{r.name} {fmt_rate(r)}" for r in warm_runs)
            + ".",
            "",
        ]
    elif args.warm_up_launch is False:
        out += [
            "No warm-up launch (--no-warm-up-launch): the first launch of each model pays its cold start.",
            "",
        ]
    for m in args.models:
        out += [f"## {title[m]}: {unit[m]}", ""]
        for p in args.precisions:
            counts = sorted(
                {
                    r.gpus
                    for r in runs
                    if r.model == m and r.precision == p and r.variant != "original"
                }
            )
            if not counts:
                continue
            out += [
                f"### precision: {p} ({'bf16 autocast where the GPU has it' if p == 'default' else 'fp32, TF32 matmuls'})",
                "",
            ]
            out += [
                "| GPUs | ddpify | hand-written DDP | Accelerate | ddpify / hand-written | ddpify / Accelerate | scaling ddpify | scaling hand-written | scaling Accelerate |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for n in counts:
                cells = [res.cell(m, v, p, n) for v in BASE_VARIANTS]
                effs = [eff(m, v, p, n) for v in BASE_VARIANTS]
                out.append(
                    f"| {n} | "
                    + " | ".join(cells)
                    + f" | {fmt_ratio(res.ratio_stats(m, 'ddpify', 'handwritten', p, n), need).replace('not measured', '-')}"
                    f" | {fmt_ratio(res.ratio_stats(m, 'ddpify', 'accelerate', p, n), need).replace('not measured', '-')} | "
                    + " | ".join(
                        "-" if e is None or n == 1 else f"{100 * e:.1f}%" for e in effs
                    )
                    + " |"
                )
            if res.by.get((m, "original", p, 1)):
                orig = rate(m, "original", p, 1)
                out += [
                    "",
                    f"Unconverted single-GPU script (plain `python`, fp32, 1 GPU): {res.cell(m, 'original', p, 1)}"
                    + (
                        f"; ddpify's fp32 output at 1 GPU / it: {ratio(rate(m, 'ddpify', 'fp32', 1), orig)}"
                        if orig
                        else ""
                    ),
                ]
            out.append("")
            opt_rows = [
                (n, v) for n in counts for v in OPT_VARIANTS if res.by.get((m, v, p, n))
            ]
            if opt_rows:
                out += [
                    f"ddpify --optimize, {p} precision: all speed-ups (ddpify-opt) and each on its own (opt-<name>)",
                    "",
                    "| GPUs | variant | samples/s | / hand-written | / ddpify | / Accelerate | scaling | scaling hand-written |",
                    "|---|---|---|---|---|---|---|---|",
                ]
                for n, v in opt_rows:
                    e, eh = eff(m, v, p, n), eff(m, "handwritten", p, n)
                    rs = [
                        fmt_ratio(res.ratio_stats(m, v, ref, p, n), need).replace(
                            "not measured", "-"
                        )
                        for ref in ("handwritten", "ddpify", "accelerate")
                    ]
                    out.append(
                        f"| {n} | {v} | {res.cell(m, v, p, n)} | "
                        + " | ".join(rs)
                        + f" | {'-' if e is None or n == 1 else f'{100 * e:.1f}%'} | {'-' if eh is None or n == 1 else f'{100 * eh:.1f}%'} |"
                    )
                out.append("")
            if args.rounds > 1:
                out += rounds_section(args, res, m, p, counts)
    # Targets.
    out += [
        "## Targets",
        "",
        "| target | figure | met | reading |",
        "|---|---|---|---|",
    ]

    def row(name, value, ok, fmt="{:.3f}", note="-"):
        out.append(
            f"| {name} | {fmt.format(value) if value is not None else 'not measured'} | {('yes' if ok else 'NO') if value is not None else '-'} | {note} |"
        )

    def row_st(name, st, target):
        if st is not None and st[3] < need:  # too few rounds: no verdict either way
            out.append(f"| {name} | {fmt_ratio(st, need)} | - | - |")
            return
        ok = st is not None and st[0] >= target
        out.append(
            f"| {name} | {fmt_stats(st)} | {('yes' if ok else 'NO') if st else '-'} | {reading(st) if st and st[3] > 1 else '-'} |"
        )

    for m in args.models:
        for n in sorted(
            {
                r.gpus
                for r in runs
                if r.model == m and r.precision == "default" and r.variant == "ddpify"
            }
        ):
            for ref in ("handwritten", "accelerate"):
                row_st(
                    f"{m}, {n} GPU(s), default precision: ddpify / {LABEL[ref]} >= 1.00",
                    res.ratio_stats(m, "ddpify", ref, "default", n),
                    1.0,
                )
        if 4 in args.gpus:
            e = eff(m, "ddpify", "default", 4)
            row(
                f"{m}: scaling of ddpify's output at 4 GPUs >= {SCALING_TARGET.get(m, 0):.0%}",
                None if e is None else 100 * e,
                e is not None and e >= SCALING_TARGET.get(m, 0),
                "{:.1f}%",
            )
        a, b = rate(m, "ddpify", "default", 1), rate(m, "ddpify", "fp32", 1)
        if a and b:
            row(
                f"{m}: ddpify default precision / fp32 at 1 GPU >= 1.5",
                a / b,
                a / b >= 1.5,
            )
    for m in args.models:  # the optimised output
        opt_counts = sorted(
            {
                r.gpus
                for r in runs
                if r.model == m
                and r.precision == "default"
                and r.variant == "ddpify-opt"
            }
        )
        if not opt_counts:
            continue
        n = opt_counts[-1]
        st = res.ratio_stats(m, "ddpify-opt", "handwritten", "default", n)
        if m in OPT_TARGET:
            row_st(
                f"{m}, {n} GPU(s), default precision: ddpify --optimize / hand-written DDP >= {OPT_TARGET[m]:.2f}",
                st,
                OPT_TARGET[m],
            )
        else:
            out.append(
                f"| {m}, {n} GPU(s), default precision: ddpify --optimize / hand-written DDP (no target) | {fmt_ratio(st, need)} | - | {reading(st) if st and need <= st[3] > 1 else '-'} |"
            )
        if n > 1 and 1 in opt_counts:
            e, eh = (
                eff(m, "ddpify-opt", "default", n),
                eff(m, "handwritten", "default", n),
            )
            row(
                f"{m}: scaling of ddpify --optimize at {n} GPUs >= hand-written's ({'-' if eh is None else f'{100 * eh:.1f}%'})",
                None if e is None else 100 * e,
                e is not None and eh is not None and e >= eh,
                "{:.1f}%",
            )
    if notes:
        out += [
            "",
            "## ddpify findings it did not fix itself (notes, or parts its output lacks)",
            "",
        ] + [f"- {n}" for n in notes]
    problems = [r for r in runs if r.status != "ok"]
    if problems:
        out += ["", "## Runs without a figure", ""] + [
            f"- {r.name}: {r.status}: {r.reason}" for r in problems
        ]
    out += phase_section(runs, warm_runs)
    out += [
        "",
        "## Runs",
        "",
        "| run | started s | wall s | steps | seconds timed | peak GiB | chunk rates |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        f = r.figures
        out.append(
            f"| {r.name} | {r.started_s} | {r.wall_s} | {f.get('steps', '-')} | {f.get('seconds', '-')} | {f.get('peak_mem_gib', '-')} | {', '.join(map(str, f.get('chunk_rates', [])))} |"
        )
    out += [
        "",
        f"Whole benchmark: {elapsed:.0f} s.",
        "",
        "## Machine",
        "",
        "```",
        machine.rstrip(),
        "```",
        "",
    ]
    return "\n".join(out)


def rounds_section(args, res: Results, m: str, p: str, counts: list[int]) -> list[str]:
    """Ratio medians with their spread, then every round's raw figures, for one model and precision."""
    out = []
    need = need_rounds(args)
    for n in counts:
        variants = [
            v for v in list(args.variants) + ["original"] if res.by.get((m, v, p, n))
        ]
        pairs = [(a, b) for a, b in RATIOS if a in variants and b in variants]
        pairs += [
            (v, "handwritten")
            for v in variants
            if v.startswith("opt-") and "handwritten" in variants
        ]
        out += [
            f"Ratios at {n} GPU(s), {p} precision: median of the per-round ratios [min, max]",
            "",
            "| ratio | median | min | max | half-spread | rounds | reading |",
            "|---|---|---|---|---|---|---|",
        ]
        for a, b in pairs:
            st = res.ratio_stats(m, a, b, p, n)
            if st is None:
                out.append(f"| {a} / {b} | - | - | - | - | 0 | not measured |")
                continue
            if st[3] < need:
                out.append(
                    f"| {a} / {b} | - | - | - | - | {st[3]} | {st[3]} of {need} rounds: not reported |"
                )
                continue
            out.append(
                f"| {a} / {b} | {st[0]:.3f} | {st[1]:.3f} | {st[2]:.3f} | {(st[2] - st[1]) / 2:.3f} | {st[3]} | {reading(st)} |"
            )
        rounds = sorted({r.round for v in variants for r in res.by[(m, v, p, n)]})
        out += [
            "",
            f"Every round at {n} GPU(s), {p} precision (samples/s; order = launch order within the round)",
            "",
            "| round | order | "
            + " | ".join(variants)
            + " | "
            + " | ".join(f"{a} / {b}" for a, b in pairs)
            + " |",
            "|---|---|" + "---|" * (len(variants) + len(pairs)),
        ]
        for k in rounds:
            these = sorted(
                (r for v in variants for r in res.by[(m, v, p, n)] if r.round == k),
                key=lambda r: r.place,
            )
            order = (
                " > ".join(r.variant for r in these if r.status != "skipped")
                or "(skipped)"
            )
            by_v = {r.variant: r for r in these}
            cells = [
                f"{by_v[v].rate:.1f}"
                if v in by_v and by_v[v].rate
                else (by_v[v].status if v in by_v else "-")
                for v in variants
            ]
            rs = [res.per_round(m, a, b, p, n).get(k) for a, b in pairs]
            out.append(
                f"| {k} | {order} | "
                + " | ".join(cells)
                + " | "
                + " | ".join("-" if x is None else f"{x:.3f}" for x in rs)
                + " |"
            )
        out.append("")
    return out


def phase_section(runs: list[Run], warm_runs=()) -> list[str]:
    """Mean seconds per phase of a launch, per model and variant: what a run's length is made of."""
    groups: dict[tuple, list[Run]] = {}
    for r in warm_runs:
        if r.phases:
            groups.setdefault(
                (r.model, "(warm-up launch)", r.precision, r.gpus), []
            ).append(r)
    for r in runs:
        if r.phases:
            groups.setdefault((r.model, r.variant, r.precision, r.gpus), []).append(r)
    if not groups:
        return []
    out = [
        "",
        "## Where a launch's time goes (rank 0's clock; mean seconds over the launches)",
        "",
        "start: launcher and imports up to benchmodels; set-up: process group, data set, model, DDP, optimizer; "
        "first step: DataLoader start and first kernels; warm-up: the other untimed steps; timed: the timed steps; "
        "exit: from the last timed step to the end of the launch.",
        "",
        "| model | variant | precision | GPUs | launches | "
        + " | ".join(PHASES)
        + " | wall |",
        "|---|---|---|---|---|" + "---|" * (len(PHASES) + 1),
    ]
    for (m, v, p, n), rs in groups.items():
        means = [statistics.mean(r.phases[ph] for r in rs) for ph in PHASES]
        out.append(
            f"| {m} | {v} | {p} | {n} | {len(rs)} | "
            + " | ".join(f"{x:.1f}" for x in means)
            + f" | {statistics.mean(r.wall_s for r in rs):.1f} |"
        )
    return out


def write_csv(path: Path, runs: list[Run]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "round",
                "place",
                "model",
                "variant",
                "precision",
                "gpus",
                "status",
                "samples_per_s",
                "chunk_rates",
                "started_s",
                "wall_s",
                "peak_mem_gib",
                *PHASES,
                "reason",
                "steps",
                "seconds",
            ]
        )
        for r in runs:
            fig = r.figures
            w.writerow(
                [
                    r.round,
                    r.place,
                    r.model,
                    r.variant,
                    r.precision,
                    r.gpus,
                    r.status,
                    r.rate or "",
                    " ".join(map(str, fig.get("chunk_rates", []))),
                    r.started_s,
                    r.wall_s,
                    fig.get("peak_mem_gib", ""),
                    *[r.phases.get(ph, "") for ph in PHASES],
                    r.reason,
                    fig.get("steps", ""),
                    fig.get("seconds", ""),
                ]
            )


def read_csv(path: Path) -> tuple[list[Run], list[Run]]:
    """(runs, warm-up launches) of a rounds.csv that write_csv wrote (older files lack the
    steps and seconds columns)."""

    def num(x: str):
        if x in ("", None):
            return None
        return float(x) if any(c in x for c in ".e") else int(x)

    runs, warm = [], []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            run = Run(
                row["model"],
                row["variant"],
                row["precision"],
                int(row["gpus"]),
                round=int(row["round"]),
                place=int(row["place"]),
                status=row["status"],
                reason=row.get("reason") or "",
                wall_s=float(row.get("wall_s") or 0.0),
                started_s=float(row.get("started_s") or 0.0),
            )
            figures = {
                "samples_per_s": num(row.get("samples_per_s") or ""),
                "chunk_rates": [
                    float(x) for x in (row.get("chunk_rates") or "").split()
                ],
                "peak_mem_gib": num(row.get("peak_mem_gib") or ""),
                "steps": num(row.get("steps") or ""),
                "seconds": num(row.get("seconds") or ""),
            }
            run.figures = {k: v for k, v in figures.items() if v not in (None, [])}
            run.phases = {ph: float(row[ph]) for ph in PHASES if row.get(ph)}
            (warm if run.place < 0 else runs).append(run)
    return runs, warm


def merge(dirs: list[Path]) -> tuple[list[Run], list[Run], dict, list[str]]:
    """The runs of several calls (each a --part of the same rounds): (runs, warm-up launches,
    the first call's gpu_results.json, notes). Refuses a round that two calls both ran."""
    runs: list[Run] = []
    warm: list[Run] = []
    first: dict = {}
    notes: list[str] = []
    seen: dict[tuple, Path] = {}
    for d in dirs:
        got, w = read_csv(d / "rounds.csv")
        doc = (
            json.loads((d / "gpu_results.json").read_text())
            if (d / "gpu_results.json").exists()
            else {}
        )
        if not first:
            first = doc
        else:
            for key in ("steps", "warmup", "chunk", "rounds", "models", "precisions"):
                a, b = first.get("args", {}).get(key), doc.get("args", {}).get(key)
                if a != b:
                    notes.append(f"{d}: --{key} {b} differs from the first call's {a}")
        for r in got:
            key = (r.round, r.model, r.variant, r.precision, r.gpus)
            if r.status != "skipped" and key in seen and seen[key] != d:
                raise ValueError(
                    f"round {r.round} of {r.name} ran in both {seen[key]} and {d}: "
                    "merge the parts of one schedule (--part K/N)"
                )
            if r.status != "skipped":
                seen[key] = d
        ran = sorted({r.round for r in got if r.status == "ok"})
        notes.append(f"{d}: rounds {', '.join(map(str, ran)) or 'none'} ran")
        runs += got
        warm += w
    # a round one call skipped (its budget) and another ran: keep the run that happened
    done = {
        (r.round, r.model, r.variant, r.precision, r.gpus)
        for r in runs
        if r.status != "skipped"
    }
    runs = [
        r
        for r in runs
        if r.status != "skipped"
        or (r.round, r.model, r.variant, r.precision, r.gpus) not in done
    ]
    runs.sort(key=lambda r: (r.round, r.precision, r.gpus, r.model, r.place))
    return runs, warm, first, notes


def merge_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="run_gpu_bench.py merge",
        description="Merge the results of several calls (--part K/N of one schedule) into one report.",
    )
    p.add_argument("dirs", nargs="+", type=Path, help="the calls' --out folders")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--min-rounds", type=int, default=None, help="default: the calls' own"
    )
    a = p.parse_args(argv)
    runs, warm, first, notes = merge(a.dirs)
    saved = first.get("args", {})
    args = parse_args(["--gpus", "1"])  # the defaults, then the calls' own settings
    for key, value in saved.items():
        if hasattr(args, key):
            setattr(args, key, tuple(value) if key == "part" else value)
    args.part, args.merged = (1, 1), True
    args.rounds = max([args.rounds] + [r.round for r in runs])
    if a.min_rounds is not None:
        args.min_rounds = a.min_rounds
    args.gpus = sorted({r.gpus for r in runs}) or args.gpus
    machine = "\n".join(
        f"== {d} ==\n"
        + (
            (d / "machine.txt").read_text()
            if (d / "machine.txt").exists()
            else "(no machine.txt)\n"
        )
        for d in a.dirs
    )
    a.out.mkdir(parents=True, exist_ok=True)
    elapsed = sum(
        json.loads((d / "gpu_results.json").read_text()).get("elapsed_s", 0.0)
        for d in a.dirs
        if (d / "gpu_results.json").exists()
    )
    md = save(
        args,
        a.out,
        runs,
        machine,
        time.strftime("%Y-%m-%d %H:%M:%S"),
        elapsed,
        [],
        "",
        warm,
    )
    # where the rounds come from, under the title
    head, rest = md.split("\n", 1)
    merged = f"Merged from {len(a.dirs)} calls: " + "; ".join(notes) + "."
    md = f"{head}\n\n{merged}\n{rest}"
    (a.out / "gpu_results.md").write_text(md)
    print(md.split("## Runs\n")[0])
    print(f"results in {a.out}")
    return 0


def save(
    args,
    out_dir: Path,
    runs: list[Run],
    machine: str,
    started: str,
    elapsed: float,
    notes: list[str],
    warm: str,
    warm_runs: list[Run],
) -> str:
    md = report(args, runs, machine, started, elapsed, notes, warm, warm_runs)
    (out_dir / "gpu_results.md").write_text(md)
    write_csv(out_dir / "rounds.csv", warm_runs + runs)
    res = Results(runs)
    summary = [
        {
            "model": m,
            "precision": p,
            "gpus": n,
            "ratio": f"{a}/{b}",
            "median": st[0],
            "min": st[1],
            "max": st[2],
            "rounds": st[3],
            "reported": st[3] >= need_rounds(args),
            "per_round": res.per_round(m, a, b, p, n),
            "reading": reading(st),
        }
        for (m, p, n) in dict.fromkeys(r.config for r in runs)
        for a, b in RATIOS
        if (st := res.ratio_stats(m, a, b, p, n)) is not None
    ]
    (out_dir / "gpu_results.json").write_text(
        json.dumps(
            {
                "args": vars(args),
                "machine": machine,
                "warm_up": warm,
                "elapsed_s": elapsed,
                "ratios": summary,
                "warm_up_launches": [asdict(r) | {"name": r.name} for r in warm_runs],
                "runs": [asdict(r) | {"name": r.name} for r in runs],
            },
            indent=1,
        )
    )
    return md


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["merge"]:
        return merge_main(argv[1:])
    args = parse_args(argv)
    if args.dry_run:
        runs = plan(args)
        for i, run in enumerate(runs, 1):
            print(f"[{i}/{len(runs)}] round {run.round} place {run.place}: {run.name}")
        print(f"{len(runs)} launches planned; --dry-run: nothing converted or launched")
        return 0
    t_start = time.monotonic()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = Log(out_dir / "raw_logs.txt")
    machine = machine_info([sys.executable, *sys.argv])
    (out_dir / "machine.txt").write_text(machine)
    print(machine, flush=True)
    work = Path(tempfile.mkdtemp(prefix="ddpify-gpubench-"))
    prof_root = work / "profiles"

    runs = plan(args)
    warm_proc = start_warm_up(args)  # on the GPUs while ddpify converts on the CPU
    scripts: dict[tuple[str, str, str], Path | None] = {}
    unavailable: dict[tuple[str, str, str], str] = {}
    have_accelerate = importlib.util.find_spec("accelerate") is not None
    converted_txt = []
    notes: list[str] = []
    jobs = [
        (m, p, v)
        for m in args.models
        for p in args.precisions
        for v in DDPIFY_VARIANTS
        if v in args.variants
        and any(r.model == m and r.precision == p and r.variant == v for r in runs)
    ]
    pool = ThreadPoolExecutor(max_workers=max(1, min(8, (os.cpu_count() or 2) // 2)))
    futures = {
        j: pool.submit(convert, args, j[0], AMP_FOR[j[1]], work, log, j[2])
        for j in jobs
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(HERE), str(REPO), env.get("PYTHONPATH", "")])
    )
    env.update(
        PYTHONUNBUFFERED="1",
        BENCH_WARMUP=str(args.warmup),
        BENCH_STEPS=str(args.steps),
        BENCH_CHUNK=str(args.chunk),
    )
    # NVLink multicast stays off on the shared GPU hosts.
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    if args.smoke:
        env.setdefault(
            "OMP_NUM_THREADS", "1"
        )  # tiny CPU runs: no thread oversubscription

    warm = finish_warm_up(args, warm_proc, log)
    print(warm, flush=True)
    warm_runs = warm_up_launches(args, runs, env, log, t_start)
    done = {j: f.result() for j, f in futures.items()}
    pool.shutdown()
    for m in args.models:
        for p in args.precisions:
            plain_text = None
            for v in DDPIFY_VARIANTS:
                if (m, p, v) not in done:
                    continue
                path, why, manual, entry = done[(m, p, v)]
                log.add(*entry)
                if v == "ddpify":
                    notes += [f"{m}_single.py --amp {AMP_FOR[p]}: {x}" for x in manual]
                scripts[(m, v, p)] = path
                if path is None:
                    unavailable[(m, v, p)] = f"conversion failed: {why}"
                    continue
                text = path.read_text()
                if (
                    v.startswith("opt-")
                    and plain_text is not None
                    and text == plain_text
                ):
                    # This speed-up does not apply to this model (its finding says why): nothing new to time.
                    unavailable[(m, v, p)] = (
                        "not applied to this model: the conversion equals plain ddpify's"
                    )
                    continue
                if v == "ddpify":
                    plain_text = text
                converted_txt.append(
                    f"# ===== ddpify --amp {AMP_FOR[p]}{optimize_flags(v)} {m}_single.py =====\n{text}"
                )
            scripts[(m, "handwritten", p)] = HERE / f"{m}_ddp_handwritten.py"
            scripts[(m, "accelerate", p)] = HERE / f"{m}_accelerate.py"
            if not have_accelerate:
                unavailable[(m, "accelerate", p)] = "accelerate is not installed"
            scripts[(m, "original", p)] = HERE / f"{m}_single.py"
    (out_dir / "converted.txt").write_text(
        "\n\n".join(converted_txt) or "(no conversion succeeded)\n"
    )

    round_began: dict[int, float] = {}
    round_took: dict[int, float] = {}
    stop_rounds_from = None
    for i, run in enumerate(runs, 1):
        key = (run.model, run.variant, run.precision)
        elapsed = time.monotonic() - t_start
        if run.round and run.round not in round_began:
            if run.round - 1 in round_began:
                round_took[run.round - 1] = elapsed - round_began[run.round - 1]
            # A round starts only if the longest one so far would still end inside the budget.
            longest = max(round_took.values(), default=0.0)
            if (
                stop_rounds_from is None
                and round_took
                and elapsed + longest > args.budget
            ):
                stop_rounds_from = run.round
            round_began[run.round] = elapsed
        if key in unavailable:
            run.status, run.reason = "skipped", unavailable[key]
        elif stop_rounds_from is not None and run.round >= stop_rounds_from:
            run.status, run.reason = (
                "skipped",
                f"budget: round {stop_rounds_from} would end past {args.budget:.0f} s",
            )
        elif elapsed > args.budget + (60 if run.round else 0):
            run.status, run.reason = "skipped", f"budget of {args.budget:.0f} s spent"
        else:
            extra = script_args(args, run)
            run_env = env
            if args.profile:
                run_env = dict(env, BENCH_PROFILE=str(prof_root / run.name))
            # Keep the whole command inside budget + 90 s.
            timeout = max(20.0, min(args.timeout, args.budget + 90 - elapsed))
            run.started_s = round(elapsed, 1)
            launch(args, run, scripts[key], extra, run_env, log, timeout)
        figure = (
            f"{run.rate:.1f} samples/s"
            if run.rate
            else f"{run.status} {run.reason}"[:200]
        )
        print(
            f"[{i}/{len(runs)} {time.monotonic() - t_start:5.0f}s] {run.name}: {figure} ({run.wall_s} s)",
            flush=True,
        )
        if run.status != "skipped":
            # What has run so far survives a command killed at its time limit.
            save(
                args,
                out_dir,
                runs,
                machine,
                started,
                time.monotonic() - t_start,
                notes,
                warm,
                warm_runs,
            )

    elapsed = time.monotonic() - t_start
    md = save(args, out_dir, runs, machine, started, elapsed, notes, warm, warm_runs)
    if args.profile:
        tables = [
            f"##### {p.relative_to(prof_root)}\n{p.read_text()}"
            for p in sorted(prof_root.rglob("*.txt"))
        ]
        (out_dir / "profiles.txt").write_text(
            "\n".join(tables) or "(no profile written)\n"
        )
    shutil.rmtree(work, ignore_errors=True)
    print(md.split("## Runs\n")[0])
    print(f"results in {out_dir}")
    return 0 if all(r.status == "ok" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
