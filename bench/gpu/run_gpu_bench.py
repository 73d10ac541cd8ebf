"""Training-speed benchmark of ddpify's output against hand-written DDP and Accelerate.

One command runs every configuration:  python bench/gpu/run_gpu_bench.py --gpus 1 2 4

For each model (cnn, gpt) it converts <model>_single.py with ddpify (--amp auto for the
default precision, --amp none for fp32), then launches, with torchrun, each variant
(ddpify's output, <model>_ddp_handwritten.py, <model>_accelerate.py) at each GPU count
and precision, one launch per (model, variant, precision, GPU count), variants of one
configuration back to back so that drift hits them alike. Issue 20's variants: ddpify-opt
(ddpify --optimize) and opt-<name> (ddpify --optimize-only <name>, each speed-up on its own;
not launched where the conversion equals plain ddpify's), run after the others. Each script prints
"BENCH samples_per_s=<global rate> ..." on rank 0 (see benchmodels.StepTimer).

Writes to --out (default $OUT, else bench/gpu/results/local/): gpu_results.md (tables, target
checks, command, machine), gpu_results.json (every run's parsed figures), raw_logs.txt
(every launch's full output, conversion logs included), converted.txt (the scripts
ddpify produced), machine.txt, and profiles.txt with --profile. A failing or hung
variant is recorded and the rest go on; --budget bounds the whole run: runs are ordered
by importance and those that no longer fit are listed as skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MODELS = ("cnn", "gpt")
BASE_VARIANTS = ("ddpify", "handwritten", "accelerate")
# ddpify --optimize (issue 20): every speed-up together, then each on its own (--optimize-only).
OPTIMIZATIONS = ("channels-last", "fused-optimizer", "ddp-buckets", "static-graph", "cudnn-benchmark", "loader-workers")
OPT_VARIANTS = ("ddpify-opt",) + tuple(f"opt-{o}" for o in OPTIMIZATIONS)
VARIANTS = BASE_VARIANTS + OPT_VARIANTS
DDPIFY_VARIANTS = ("ddpify",) + OPT_VARIANTS
# Issue 20's targets for the optimised output at the largest GPU count: ratio to hand-written DDP.
OPT_TARGET = {"cnn": 1.3, "gpt": 1.03}
# Scaling-efficiency targets at 4 GPUs, from issue 5.
SCALING_TARGET = {"cnn": 0.96, "gpt": 0.93}
SMOKE_ARGS = {
    "cnn": ["--smoke", "--batch-size", "4", "--workers", "1", "--dataset-size", "512"],
    "gpt": ["--smoke", "--batch-size", "2", "--workers", "1", "--dataset-size", "512"],
}
AMP_FOR = {"default": "auto", "fp32": "none"}
LABEL = {"ddpify": "ddpify", "handwritten": "hand-written DDP", "accelerate": "Accelerate", "original": "single-GPU script"}


@dataclass
class Run:
    model: str
    variant: str  # ddpify | handwritten | accelerate | original | ddpify-opt | opt-<speed-up>
    precision: str  # default | fp32
    gpus: int
    status: str = "pending"  # ok | failed | timeout | no-bench-line | invalid | skipped
    reason: str = ""
    wall_s: float = 0.0
    command: str = ""
    figures: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.model}-{self.variant}-{self.precision}-{self.gpus}gpu"

    @property
    def rate(self) -> float | None:
        return self.figures.get("samples_per_s") if self.status == "ok" else None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4], help="GPU counts (default precision)")
    p.add_argument("--fp32-gpus", type=int, nargs="*", default=[1, 4], help="GPU counts also run in fp32")
    p.add_argument("--precisions", nargs="+", choices=["default", "fp32"], default=["default", "fp32"])
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                   help="ddpify-opt: ddpify --optimize; opt-<name>: ddpify --optimize-only <name> (launched only where it changes the conversion)")
    p.add_argument("--no-original", action="store_true", help="skip the unconverted script (fp32, 1 GPU)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps per run (default 10; smoke 2)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per run (default 40; smoke 4)")
    p.add_argument("--chunk", type=int, default=10, help="steps between synchronised time marks")
    p.add_argument("--timeout", type=float, default=150.0, help="seconds one launch may take")
    p.add_argument("--budget", type=float, default=450.0, help="seconds after which no new launch starts")
    p.add_argument("--out", default=os.environ.get("OUT") or str(HERE / "results" / "local"))
    p.add_argument("--smoke", action="store_true", help="tiny models, few steps: a CPU check of the harness")
    p.add_argument("--profile", action="store_true", help="profile a few timed steps of each run (timings then not comparable)")
    p.add_argument("--ddpify-cmd", default=f"{shlex.quote(sys.executable)} -m ddpify", help="how to call ddpify")
    p.add_argument("--script-args", default="", help="extra arguments for every training script")
    args = p.parse_args(argv)
    if args.warmup is None:
        args.warmup = 2 if args.smoke else 10
    if args.steps is None:
        args.steps = 4 if args.smoke else 40
    return args


def sh(cmd: list[str] | str, timeout: float = 60) -> str:
    try:
        r = subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True, timeout=timeout)
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
        ver = sh([sys.executable, "-c", f"import importlib.metadata as m; print(m.version('{pkg}'))"])
        lines.append(f"{pkg}: {ver.splitlines()[-1] if ver else '?'}")
    lines.append(f"git: {sh(['git', '-C', str(REPO), 'rev-parse', 'HEAD'])} {sh(['git', '-C', str(REPO), 'status', '--short', '--', 'ddpify', 'bench'])[:2000]}")
    for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"):
        lines.append(f"env {k}={os.environ.get(k, '')}")
    if shutil.which("nvidia-smi"):
        lines.append(sh(["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version,clocks.max.sm,power.limit", "--format=csv"]))
        lines.append(sh(["nvidia-smi", "topo", "-m"]))
    else:
        lines.append("nvidia-smi: not found (no NVIDIA GPU here)")
    return "\n".join(lines) + "\n"


class Log:
    """Everything any launch printed, in one text file (the device tool returns few files)."""

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


def convert(args, model: str, amp: str, work: Path, log: Log, variant: str = "ddpify") -> tuple[Path | None, str, list[str]]:
    """Copy <model>_single.py and convert it in place with the ddpify CLI; None if that failed."""
    dst = work / variant / f"{model}_ddpify_{amp}.py"
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / f"{model}_single.py", dst)
    # --optimize reads the model's class from the module beside the script.
    shutil.copy(HERE / "benchmodels.py", dst.parent / "benchmodels.py")
    cmd = f"{args.ddpify_cmd} --amp {amp}{optimize_flags(variant)} {shlex.quote(str(dst))}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])))
    try:
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=120, env=env)
        out, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired:
        out, rc = "(timed out after 120 s)", -1
    log.add(f"convert {model} --amp {amp} ({variant}): {cmd} (rc={rc})", out)
    # Findings without [*] are ones ddpify could not fix: the output may be incomplete.
    manual = [ln.split(": ", 1)[-1] for ln in out.splitlines() if re.search(r": DDP\d+ ", ln) and "[*]" not in ln]
    text = dst.read_text()
    if rc != 0:
        return None, f"ddpify exited {rc}: {out.strip().splitlines()[-1] if out.strip() else ''}", manual
    if text == (HERE / f"{model}_single.py").read_text():
        return None, "ddpify left the script unchanged", manual
    if "DistributedDataParallel" not in text:
        # Would run as N independent trainings: fast and meaningless; save the GPU time.
        return None, "ddpify's output wraps no model in DistributedDataParallel (see its findings)", manual
    return dst, "", manual


def plan(args) -> list[Run]:
    def ordered(counts):
        # 1 GPU and the largest count first: they carry the ratio and scaling targets.
        counts = sorted(set(counts))
        first = [c for c in (1, counts[-1]) if c in counts] if counts else []
        return list(dict.fromkeys(first + counts))

    runs: list[Run] = []
    groups = []
    if "default" in args.precisions:
        groups += [("default", n) for n in ordered(args.gpus)]
    if "fp32" in args.precisions:
        groups += [("fp32", n) for n in ordered(args.fp32_gpus or [])]
    for precision, n in groups:
        for model in args.models:
            for variant in args.variants:
                runs.append(Run(model, variant, precision, n))
            if precision == "fp32" and n == 1 and not args.no_original:
                runs.append(Run(model, "original", "fp32", 1))
    # Each speed-up on its own (opt-<name>) after every comparison of the others, at the largest count first.
    return sorted(runs, key=lambda r: (r.variant.startswith("opt-"), -r.gpus if r.variant.startswith("opt-") else 0))


def launch(args, run: Run, script: Path, extra: list[str], env: dict, log: Log, timeout: float) -> None:
    if run.variant == "original":
        cmd = [sys.executable, str(script), *extra]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={run.gpus}", str(script), *extra]
    run.command = " ".join(shlex.quote(c) for c in cmd)
    t0 = time.monotonic()
    with tempfile.TemporaryFile(mode="w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=str(HERE))
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
        out.seek(0)
        text = out.read()
    log.add(f"{run.name}: {run.command} (rc={rc}, {run.wall_s} s)", text)
    bench = [ln for ln in text.splitlines() if ln.startswith("BENCH ") and " rank=0" in ln]
    if bench:
        run.figures = parse_bench(bench[-1])
    if rc is None:
        run.status, run.reason = "timeout", f"killed after {timeout:.0f} s"
    elif rc != 0:
        err = [ln for ln in text.splitlines() if "Error" in ln or "error" in ln]
        run.status, run.reason = "failed", f"exit {rc}: {(err[-1] if err else text.strip()[-300:])[:300]}"
    elif "samples_per_s" not in run.figures:
        run.status, run.reason = "no-bench-line", (bench[-1] if bench else "no BENCH line from rank 0")
    elif run.figures.get("ddp_modules") == 0 and (run.gpus > 1 or run.variant in DDPIFY_VARIANTS + ("handwritten",)):
        # Accelerate alone skips DDP on one process; elsewhere no DDP means no gradient sync (or no like-for-like).
        run.status, run.reason = "invalid", "no DistributedDataParallel module in rank 0: the model was not wrapped"
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


def report(args, runs: list[Run], machine: str, started: str, elapsed: float, notes: list[str]) -> str:
    by = {(r.model, r.variant, r.precision, r.gpus): r for r in runs}

    def rate(m, v, p, n):
        r = by.get((m, v, p, n))
        return r.rate if r else None

    def eff(m, v, p, n):
        a, b = rate(m, v, p, n), rate(m, v, p, 1)
        return a / (n * b) if a and b else None

    unit = {"cnn": "images/s", "gpt": "sequences/s (1024 tokens)"}
    title = {"cnn": "ResNet-50 (BatchNorm, 224x224, 256 images per GPU)", "gpt": "GPT (12 layers, width 1024, seq 1024, 8 sequences per GPU)"}
    if args.smoke:
        title = {m: f"{m} (SMOKE: tiny model, figures mean nothing)" for m in MODELS}
    out = [f"# GPU training-speed benchmark ({started})", ""]
    if args.profile:
        out += ["**Profiled run: the profiler slows the timed steps; these figures are not comparable.**", ""]
    out += [
        f"Global samples/s over {args.steps} timed steps after {args.warmup} warm-up steps, per-process batch unchanged "
        f"from the single-GPU script; (±x%) is half the range of the per-{args.chunk}-step rates. "
        "Scaling = rate at N GPUs / (N x rate at 1 GPU) of the same variant. Ratios > 1 mean ddpify's output is faster.",
        "",
    ]
    for m in args.models:
        out += [f"## {title[m]}: {unit[m]}", ""]
        for p in args.precisions:
            counts = sorted({r.gpus for r in runs if r.model == m and r.precision == p and r.variant != "original"})
            if not counts:
                continue
            out += [f"### precision: {p} ({'bf16 autocast where the GPU has it' if p == 'default' else 'fp32, TF32 matmuls'})", ""]
            out += ["| GPUs | ddpify | hand-written DDP | Accelerate | ddpify / hand-written | ddpify / Accelerate | scaling ddpify | scaling hand-written | scaling Accelerate |",
                    "|---|---|---|---|---|---|---|---|---|"]
            for n in counts:
                cells = [fmt_rate(by.get((m, v, p, n))) for v in BASE_VARIANTS]
                effs = [eff(m, v, p, n) for v in BASE_VARIANTS]
                out.append(
                    f"| {n} | " + " | ".join(cells) + f" | {ratio(rate(m, 'ddpify', p, n), rate(m, 'handwritten', p, n))}"
                    f" | {ratio(rate(m, 'ddpify', p, n), rate(m, 'accelerate', p, n))} | "
                    + " | ".join("-" if e is None or n == 1 else f"{100 * e:.1f}%" for e in effs) + " |"
                )
            orig = by.get((m, "original", p, 1))
            if orig:
                out += ["", f"Unconverted single-GPU script (plain `python`, fp32, 1 GPU): {fmt_rate(orig)}"
                        + (f"; ddpify's fp32 output at 1 GPU / it: {ratio(rate(m, 'ddpify', 'fp32', 1), orig.rate)}" if orig.rate else "")]
            out.append("")
            opt_rows = [(n, v) for n in counts for v in OPT_VARIANTS if by.get((m, v, p, n))]
            if opt_rows:
                out += [f"ddpify --optimize (issue 20), {p} precision: all speed-ups (ddpify-opt) and each on its own (opt-<name>)", "",
                        "| GPUs | variant | samples/s | / hand-written | / ddpify | / Accelerate | scaling | scaling hand-written |",
                        "|---|---|---|---|---|---|---|---|"]
                for n, v in opt_rows:
                    e, eh = eff(m, v, p, n), eff(m, "handwritten", p, n)
                    out.append(f"| {n} | {v} | {fmt_rate(by.get((m, v, p, n)))} | {ratio(rate(m, v, p, n), rate(m, 'handwritten', p, n))}"
                               f" | {ratio(rate(m, v, p, n), rate(m, 'ddpify', p, n))} | {ratio(rate(m, v, p, n), rate(m, 'accelerate', p, n))}"
                               f" | {'-' if e is None or n == 1 else f'{100 * e:.1f}%'} | {'-' if eh is None or n == 1 else f'{100 * eh:.1f}%'} |")
                out.append("")
    # Targets of issue 5.
    out += ["## Targets", "", "| target | figure | met |", "|---|---|---|"]

    def row(name, value, ok, fmt="{:.3f}"):
        out.append(f"| {name} | {fmt.format(value) if value is not None else 'not measured'} | {('yes' if ok else 'NO') if value is not None else '-'} |")

    for m in args.models:
        for n in sorted({r.gpus for r in runs if r.model == m and r.precision == "default" and r.variant == "ddpify"}):
            for ref in ("handwritten", "accelerate"):
                a, b = rate(m, "ddpify", "default", n), rate(m, ref, "default", n)
                v = a / b if a and b else None
                row(f"{m}, {n} GPU(s), default precision: ddpify / {LABEL[ref]} >= 1.00", v, v is not None and v >= 1.0)
        if 4 in args.gpus:
            e = eff(m, "ddpify", "default", 4)
            row(f"{m}: scaling of ddpify's output at 4 GPUs >= {SCALING_TARGET[m]:.0%}", None if e is None else 100 * e,
                e is not None and e >= SCALING_TARGET[m], "{:.1f}%")
        a, b = rate(m, "ddpify", "default", 1), rate(m, "ddpify", "fp32", 1)
        v = a / b if a and b else None
        row(f"{m}: ddpify default precision / fp32 at 1 GPU >= 1.5", v, v is not None and v >= 1.5)
    for m in args.models:  # issue 20: the optimised output
        opt_counts = sorted({r.gpus for r in runs if r.model == m and r.precision == "default" and r.variant == "ddpify-opt"})
        if not opt_counts:
            continue
        n = opt_counts[-1]
        a, b = rate(m, "ddpify-opt", "default", n), rate(m, "handwritten", "default", n)
        v = a / b if a and b else None
        row(f"{m}, {n} GPU(s), default precision: ddpify --optimize / hand-written DDP >= {OPT_TARGET[m]:.2f} (issue 20 asks it at 4 GPUs)", v, v is not None and v >= OPT_TARGET[m])
        if n > 1:
            e, eh = eff(m, "ddpify-opt", "default", n), eff(m, "handwritten", "default", n)
            row(f"{m}: scaling of ddpify --optimize at {n} GPUs >= hand-written's ({'-' if eh is None else f'{100 * eh:.1f}%'})",
                None if e is None else 100 * e, e is not None and eh is not None and e >= eh, "{:.1f}%")
    if notes:
        out += ["", "## ddpify findings it did not fix itself (notes, or parts its output lacks)", ""] + [f"- {n}" for n in notes]
    problems = [r for r in runs if r.status != "ok"]
    if problems:
        out += ["", "## Runs without a figure", ""] + [f"- {r.name}: {r.status}: {r.reason}" for r in problems]
    out += ["", "## Runs", "", "| run | wall s | steps | seconds timed | peak GiB | chunk rates |", "|---|---|---|---|---|---|"]
    for r in runs:
        f = r.figures
        out.append(f"| {r.name} | {r.wall_s} | {f.get('steps', '-')} | {f.get('seconds', '-')} | {f.get('peak_mem_gib', '-')} | {', '.join(map(str, f.get('chunk_rates', [])))} |")
    out += ["", f"Whole benchmark: {elapsed:.0f} s.", "", "## Machine", "", "```", machine.rstrip(), "```", ""]
    return "\n".join(out)


def main(argv=None) -> int:
    args = parse_args(argv)
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
    scripts: dict[tuple[str, str, str], Path | None] = {}
    unavailable: dict[tuple[str, str, str], str] = {}
    have_accelerate = importlib.util.find_spec("accelerate") is not None
    converted_txt = []
    notes: list[str] = []
    for m in args.models:
        for p in args.precisions:
            plain_text = None
            for v in DDPIFY_VARIANTS:
                if v not in args.variants or not any(r.model == m and r.precision == p and r.variant == v for r in runs):
                    continue
                path, why, manual = convert(args, m, AMP_FOR[p], work, log, v)
                if v == "ddpify":
                    notes += [f"{m}_single.py --amp {AMP_FOR[p]}: {x}" for x in manual]
                scripts[(m, v, p)] = path
                if path is None:
                    unavailable[(m, v, p)] = f"conversion failed: {why}"
                    continue
                text = path.read_text()
                if v.startswith("opt-") and plain_text is not None and text == plain_text:
                    # This speed-up does not apply to this model (its finding says why): nothing new to time.
                    unavailable[(m, v, p)] = "not applied to this model: the conversion equals plain ddpify's"
                    continue
                if v == "ddpify":
                    plain_text = text
                converted_txt.append(f"# ===== ddpify --amp {AMP_FOR[p]}{optimize_flags(v)} {m}_single.py =====\n{text}")
            scripts[(m, "handwritten", p)] = HERE / f"{m}_ddp_handwritten.py"
            scripts[(m, "accelerate", p)] = HERE / f"{m}_accelerate.py"
            if not have_accelerate:
                unavailable[(m, "accelerate", p)] = "accelerate is not installed"
            scripts[(m, "original", p)] = HERE / f"{m}_single.py"
    (out_dir / "converted.txt").write_text("\n\n".join(converted_txt) or "(no conversion succeeded)\n")

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), str(REPO), env.get("PYTHONPATH", "")]))
    env.update(PYTHONUNBUFFERED="1", BENCH_WARMUP=str(args.warmup), BENCH_STEPS=str(args.steps), BENCH_CHUNK=str(args.chunk))
    # NVLink multicast stays off on the shared GPU hosts.
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    if args.smoke:
        env.setdefault("OMP_NUM_THREADS", "1")  # tiny CPU runs: no thread oversubscription

    for i, run in enumerate(runs, 1):
        key = (run.model, run.variant, run.precision)
        elapsed = time.monotonic() - t_start
        if key in unavailable:
            run.status, run.reason = "skipped", unavailable[key]
        elif elapsed > args.budget:
            run.status, run.reason = "skipped", f"budget of {args.budget:.0f} s spent"
        else:
            extra = (SMOKE_ARGS[run.model] if args.smoke else []) + shlex.split(args.script_args)
            if run.variant in ("handwritten", "accelerate"):
                extra += ["--precision", run.precision]
            run_env = env
            if args.profile:
                run_env = dict(env, BENCH_PROFILE=str(prof_root / run.name))
            # Keep the whole command inside budget + 90 s.
            timeout = max(20.0, min(args.timeout, args.budget + 90 - elapsed))
            launch(args, run, scripts[key], extra, run_env, log, timeout)
        figure = f"{run.rate:.1f} samples/s" if run.rate else f"{run.status} {run.reason}"[:200]
        print(f"[{i}/{len(runs)} {time.monotonic() - t_start:5.0f}s] {run.name}: {figure} ({run.wall_s} s)", flush=True)

    elapsed = time.monotonic() - t_start
    md = report(args, runs, machine, started, elapsed, notes)
    (out_dir / "gpu_results.md").write_text(md)
    (out_dir / "gpu_results.json").write_text(json.dumps(
        {"args": vars(args), "machine": machine, "elapsed_s": elapsed, "runs": [asdict(r) | {"name": r.name} for r in runs]}, indent=1))
    if args.profile:
        tables = [f"##### {p.relative_to(prof_root)}\n{p.read_text()}" for p in sorted(prof_root.rglob("*.txt"))]
        (out_dir / "profiles.txt").write_text("\n".join(tables) or "(no profile written)\n")
    shutil.rmtree(work, ignore_errors=True)
    print(md.split("## Runs\n")[0])
    print(f"results in {out_dir}")
    return 0 if all(r.status == "ok" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
