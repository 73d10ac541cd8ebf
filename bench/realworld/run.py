"""Run ddpify over the real-world corpus (bench/realworld/manifest.toml) and class each outcome.

Per entry: extract the pinned sources from a local mirror into a fresh temp dir (never into the
repository), write the fake data, convert a copy with `python -m ddpify`, check it compiles and
that a second conversion changes nothing, run the original as one process and the output under
torchrun (2 processes; gloo on CPU, NCCL with --gpu), and run `ddpify verify --no-convert` on it.

Outcomes: correct, refused, wrong, untouched (distributed entries left as they were),
gpu-only (CPU mode: the script needs CUDA; only the conversion was checked), harness-error
(the original does not run here: fake data or arguments to fix).

    python bench/realworld/run.py --setup                 # deps + CPU torchvision, once
    python bench/realworld/run.py [--only NAME[,NAME]] [--gpu] [--mirrors DIR]
    python bench/realworld/run.py --export DIR            # sources + fake data, for a GPU box
    python bench/realworld/run.py --gpu --from-export DIR
    python bench/realworld/run.py --table                 # markdown table of results.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import hashlib
import json
import os
import py_compile
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SHIM = HERE / "shim"
DEPS = ROOT / ".realworld_deps"
MPLCONFIG = ROOT / ".realworld_out" / "mplconfig"
sys.path.insert(0, str(HERE))
# The fake-data makers need numpy/PIL: from the corpus's own deps when --setup installed them.
sys.path[1:1] = sorted(glob.glob(str(DEPS / "site*")))
import fakedata  # noqa: E402

# Packages the corpus imports besides torch/torchvision; installed with --setup into DEPS/site.
# pandas < 3: pytorch-template's MetricTracker writes through `df[col].values[:]` (read-only under
# pandas 3's copy-on-write); gym 0.25: the last gym with the old reset()/step()/seed() API that the RL
# entries call.
CPU_PACKAGES = ["numpy", "pillow", "scipy", "matplotlib", "pandas<3", "tensorboard", "progress", "six",
                "unidecode", "imageio", "seaborn", "pyyaml", "requests", "tqdm", "scikit-learn", "gym==0.25.2",
                "sacred", "opencv-python-headless"]
# Pure-Python ones that an offline GPU box may lack; carried by --export, put after site-packages.
# (sacred runs without GitPython: it only records the repository state when git is importable.)
FALLBACK_PACKAGES = ["six", "unidecode", "progress", "imageio", "seaborn", "gym==0.25.2", "gym_notices",
                     "cloudpickle", "sacred", "docopt-ng", "jsonpickle", "munch", "wrapt", "py-cpuinfo", "colorama"]
LOG_HEAD, LOG_TAIL = 40, 80


# ----------------------------------------------------------------------------- setup
def setup() -> None:
    """Install the corpus's third-party packages and torchvision's Python parts for CPU torch."""
    pip = [sys.executable, "-m", "pip"]
    site = DEPS / "site"
    subprocess.run([*pip, "install", "--target", str(site), *CPU_PACKAGES], check=True)
    subprocess.run([*pip, "install", "--no-deps", "--target", str(DEPS / "fallback"), *FALLBACK_PACKAGES],
                   check=True)
    import torch

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    tv = f"torchvision==0.{minor + 15}.*" if major == 2 else "torchvision"
    whl = DEPS / "whl"
    subprocess.run([*pip, "download", "--no-deps", "-d", str(whl), tv], check=True)
    install_cpu_torchvision(sorted(whl.glob("torchvision-*.whl"))[-1], DEPS / "tv")


def install_cpu_torchvision(wheel: Path, dest: Path) -> None:
    """Unpack the wheel's Python parts; its compiled ops (a CUDA build) are left out. The
    registrations that need them are replaced by empty modules in shim/sitecustomize.py."""
    import zipfile

    shutil.rmtree(dest, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("torchvision/") and not name.endswith((".so", ".pyd")) and ".so." not in name:
                z.extract(name, dest)
    print(f"torchvision Python parts in {dest}")


# ----------------------------------------------------------------------------- helpers
def load_manifest(path: Path) -> tuple[dict, list[dict]]:
    data = tomllib.loads(path.read_text())
    return data.get("defaults", {}), data["entry"]


HELDBACK = HERE / "heldback" / "manifest.toml"
SPLITS = ("dev", "heldback")


def load_entries(manifest: Path, split: str) -> list[dict]:
    """The entries of SPLIT (dev, heldback or all), each with its split and its manifest's defaults.

    dev: the main manifest's entries (less any marked `split = "heldback"`); heldback: those marked
    so plus bench/realworld/heldback/manifest.toml when it exists (its fake-data makers load from
    heldback/fakedata_*.py, see fakedata.py)."""
    out = []
    sources = [manifest] + ([HELDBACK] if HELDBACK.exists() and manifest.resolve() != HELDBACK.resolve() else [])
    for src in sources:
        defaults, entries = load_manifest(src)
        for e in entries:
            e = dict(e)
            e.setdefault("split", "heldback" if src == HELDBACK else "dev")
            if e["split"] not in SPLITS:
                raise ValueError(f"{src}: entry {e['name']}: split must be one of {SPLITS}")
            e["_defaults"] = defaults
            e["_manifest"] = str(src)
            out.append(e)
    names = [e["name"] for e in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"duplicate entry names across the manifests: {', '.join(dup)}")
    return [e for e in out if split == "all" or e["split"] == split]


def setting(entry: dict, key: str, fallback):
    """An entry's own value, else its manifest's [defaults], else FALLBACK."""
    return entry.get(key, entry.get("_defaults", {}).get(key, fallback))


def git_dir(mirrors: Path, repo: str) -> Path:
    base = mirrors / repo.replace("/", "+") / "repo"
    for cand in (base, base / ".git", mirrors / repo.replace("/", "+"), mirrors / repo):
        if (cand / "objects").is_dir():
            return cand
    raise FileNotFoundError(f"no mirror of {repo} under {mirrors} (fetch it first: see README)")


def extract(entry: dict, mirrors: Path, dest: Path) -> None:
    """`git archive` of the script and its siblings at the pinned commit into DEST."""
    gd = git_dir(mirrors, entry["repo"])
    paths = [entry["path"], *entry.get("siblings", []), *entry.get("convert", [])]
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "--git-dir", str(gd), "archive", entry["commit"], "--", *sorted(set(paths))],
                             capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


def make_data(entry: dict, tree: Path, home: Path) -> None:
    cwd = tree / Path(entry["path"]).parent
    for spec in entry.get("fakedata", []):
        maker, _, rel = spec.partition(":")
        if rel.startswith("~/"):
            fakedata.make(f"{maker}:{rel[2:]}", home)
        else:
            fakedata.make(spec, cwd)


def sha(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes() if p.exists() else b"<missing>")
    return h.hexdigest()


def trim(text: str) -> str:
    lines = text.splitlines()
    if len(lines) > LOG_HEAD + LOG_TAIL:
        lines = lines[:LOG_HEAD] + [f"[... {len(lines) - LOG_HEAD - LOG_TAIL} lines cut ...]"] + lines[-LOG_TAIL:]
    return "\n".join(line[:400] for line in lines)


def run(cmd: list[str], cwd: Path, env: dict, timeout: float) -> dict:
    """Run CMD in its own process group; on timeout kill the group. Returns rc/alive/out/secs."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    alive = False
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        alive = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers (dataloader workers, torchrun children)
        except ProcessLookupError:
            pass
    return {"rc": proc.returncode, "alive": alive, "secs": round(time.monotonic() - start, 1),
            "out": out.decode(errors="replace")}


def last_error(out: str) -> str:
    """The most telling line of a failed run: the last exception line, else the last line."""
    lines = [l.strip() for l in out.splitlines() if l.strip()]
    pat = re.compile(r"^(\[rank\d+\]:\s*)?([A-Za-z_.]*(Error|Exception|Interrupt)|AssertionError|FAIL\b)")
    for line in reversed(lines):
        if pat.search(line):
            return line[:200]
    return lines[-1][:200] if lines else "(no output)"


def finding_codes(out: str) -> list[str]:
    return sorted(set(re.findall(r"\bDDP\d{3}\b", out)))


def verify_summary(out: str) -> str:
    fails = [l.strip() for l in out.splitlines() if re.search(r"\bFAIL", l)]
    return "; ".join(fails)[:300] if fails else last_error(out)


# ----------------------------------------------------------------------------- one entry
class Ctx:
    def __init__(self, args):
        self.gpu = args.gpu
        self.mirrors = Path(args.mirrors)
        # absolute: each entry runs in a folder of its own, where a relative path finds nothing
        self.from_export = Path(args.from_export).resolve() if args.from_export else None
        self.keep = args.keep
        self._local = threading.local()  # entry_env is per entry, and --jobs runs entries in threads
        self.full = args.full
        self.convert_only = args.convert_only
        self.original_only = args.original_only
        # verify's one-process baseline (its loss check compares against it): on by default with
        # --gpu/--full; off on the shared 2-core CPU machine, where it would double the run time.
        self.baseline = args.baseline if args.baseline is not None else (args.full or args.gpu)
        self.diffs = Path(args.diffs) if args.diffs else None

    @property
    def entry_env(self) -> dict[str, str]:
        return getattr(self._local, "entry_env", {})

    @entry_env.setter
    def entry_env(self, value: dict[str, str]) -> None:
        self._local.entry_env = value

    def env(self, home: Path, extra_path: list[str]) -> dict:
        env = dict(os.environ)
        parts = [str(SHIM), str(SHIM / "stubs")]
        if not self.gpu and (DEPS / "tv").is_dir():
            parts.append(str(DEPS / "tv"))
            env["RW_TV_NO_OPS"] = "1"
        parts += sorted(glob.glob(str(DEPS / "site*")))
        parts += extra_path + [str(ROOT)]
        if env.get("PYTHONPATH"):
            parts.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(parts)
        for fb in (DEPS / "fallback", self.from_export / "_fallback" if self.from_export else None):
            if fb and fb.is_dir():
                env["RW_FALLBACK_SITE"] = str(fb)
        env["PATH"] = f"{SHIM / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env.update(self.entry_env)
        env.update(HOME=str(home), MPLBACKEND="Agg", WANDB_MODE="disabled", PYTHONUNBUFFERED="1",
                   PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", TQDM_DISABLE="1")
        # A font cache built once before the runs: else every rank writes ~/.cache/matplotlib on
        # first import, which verify's rank0-writes check rightly reports but is no script write.
        env["MPLCONFIGDIR"] = str(MPLCONFIG)
        if not self.gpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def warm_caches(self, tmp: Path) -> None:
        MPLCONFIG.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], env=self.env(tmp, []),
                       capture_output=True, timeout=300)


def prepare(entry: dict, ctx: Ctx, base: Path) -> Path:
    """A pristine tree (sources + fake data + home) at BASE/pristine."""
    pristine = base / "pristine"
    if ctx.from_export:
        shutil.copytree(ctx.from_export / entry["name"], pristine, symlinks=True)
        unshare(pristine, ctx.from_export)
    else:
        extract(entry, ctx.mirrors, pristine / "src")
        (pristine / "home").mkdir(parents=True)
        make_data(entry, pristine / "src", pristine / "home")
    return pristine


def clone(pristine: Path, dest: Path) -> Path:
    shutil.copytree(pristine, dest, symlinks=True)
    return dest


def fresh_output(pristine: Path, conv: Path, conv_rel: list[str], dest: Path) -> Path:
    """Pristine sources and data with the converted files put in."""
    clone(pristine, dest)
    for p in conv_rel:
        shutil.copy2(conv / "src" / p, dest / "src" / p)
    return dest


def convert(files: list[Path], cwd: Path, env: dict, given: list[Path] | None = None) -> dict:
    """ddpify on `given` (default: files); `files`: every file it may change."""
    before = sha(files)
    res = run([sys.executable, "-m", "ddpify", "--json", *map(str, given or files)], cwd, env, 300)
    res["changed"] = sha(files) != before
    res["blocking"] = []
    out = res["out"]
    try:
        doc = json.loads(out[out.index("{"):out.rindex("}") + 1])
        for f in doc.get("files", []):
            res["blocking"] += [f"{x['code']}@{Path(f['path']).name}:{x['line']}" for x in f.get("findings", [])
                                if x.get("severity") == "blocking"]
    except ValueError:
        pass  # older ddpify without --json: the text findings are read by finding_codes
    return res


# ----------------------------------------------------------------------------- independent judgement
# A line that reports training progress: one of these words and a number.
PROGRESS = re.compile(r"(?i)\b(loss|losses|epoch|epochs|iter|iters|iteration|step|steps|batch|acc|accuracy|"
                      r"reward|episode|train|training|prec@?\d?|top1|top5|psnr|lr)\b")
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def read_writes(wlog: Path, root: Path) -> list[dict]:
    """The write log's records for files inside ROOT (the run's tree), script writes only."""
    out = []
    root = root.resolve()
    for f in sorted(wlog.glob("writes-*.jsonl")):
        for line in f.read_text(errors="replace").splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            path = Path(r["path"])
            if path == Path(os.devnull) or "__pycache__" in path.parts:
                continue
            try:
                r["rel"] = str(path.resolve().relative_to(root))
            except (ValueError, OSError):
                continue
            out.append(r)
    return out


def rank_stdout(tlogs: Path, nproc: int) -> dict[int, list[str]]:
    """Each local rank's stdout, from torchrun's --log-dir/--tee files."""
    out: dict[int, list[str]] = {}
    for r in range(nproc):
        lines: list[str] = []
        for f in sorted(tlogs.glob(f"**/attempt_*/{r}/stdout.log")):
            lines += f.read_text(errors="replace").splitlines()
        out[r] = lines
    return out


def progress_shapes(lines: list[str]) -> set[str]:
    """Progress lines with their numbers blanked out (epoch 3 loss 0.41 -> epoch # loss #)."""
    shapes = set()
    for line in lines:
        if NUMBER.search(line) and PROGRESS.search(line) and "Warning" not in line:
            shapes.add(re.sub(r"\s+", " ", NUMBER.sub("#", line)).strip())
    return shapes


def norm_rel(rel: str) -> str:
    """A saved file's place with its numbers blanked (epochs, steps, timestamps, run ids)."""
    return re.sub(r"\d+", "#", rel)


def load_signatures(tree_cwd: Path, env: dict, files: list[Path], out: Path) -> dict[str, dict]:
    """rw_loadsig.py in a plain process (no torchrun variables, no process group)."""
    if not files:
        return {}
    env = {k: v for k, v in env.items() if k not in ("RW_WRITE_LOG", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                                                      "MASTER_ADDR", "MASTER_PORT")}
    r = run([sys.executable, str(SHIM / "rw_loadsig.py"), str(out), *map(str, files)], tree_cwd, env, 300)
    try:
        return json.loads(out.read_text())
    except (OSError, ValueError):
        return {str(f): {"ok": False, "error": f"loader failed: {last_error(r['out'])}"} for f in files}


def sig_diff(a, b, where: str = "") -> str:
    """The first place where two signatures differ, in words ('' if equal)."""
    if a == b:
        return ""
    if isinstance(a, list) and isinstance(b, list) and a and b and a[0] == b[0]:
        if a[0] == "dict":
            ka, kb = set(a[1]), set(b[1])
            if ka != kb:
                miss, extra = sorted(kb - ka)[:3], sorted(ka - kb)[:3]
                return f"{where or 'top level'}: keys differ (output lacks {miss}, has extra {extra})"
            for k in sorted(ka):
                d = sig_diff(a[1][k], b[1][k], f"{where}[{k.split(':', 1)[1]!r}]")
                if d:
                    return d
        if a[0] in ("module", "optimizer", "object") and len(a) == 3 and len(b) == 3:
            if a[1] != b[1]:
                return f"{where or 'top level'}: class {a[1]} (the original saved {b[1]})"
            if isinstance(a[2], dict) and isinstance(b[2], dict) and a[0] == "module":
                return sig_diff(["dict", a[2]], ["dict", b[2]], where + ".state_dict()")
            return sig_diff(a[2], b[2], where)
        if a[0] in ("list", "tuple") and len(a) == 2 and len(b) == 2:
            if len(a[1]) != len(b[1]):
                return f"{where or 'top level'}: {len(a[1])} items (the original saved {len(b[1])})"
            for i, (x, y) in enumerate(zip(a[1], b[1])):
                d = sig_diff(x, y, f"{where}[{i}]")
                if d:
                    return d
    return f"{where or 'top level'}: {json.dumps(a)[:120]} (the original saved {json.dumps(b)[:120]})"


def judge_run(entry: dict, smoke: bool, d: dict, orig: Path, owlog: Path, run_tree: Path, dwlog: Path,
              tlogs: Path, nproc: int, base: Path, tree_env) -> dict:
    """The harness's verdict on the output's torchrun run, from the outside: every rank exits 0
    (a smoke entry: still running at its time limit), only rank 0 writes, no other rank prints a
    progress line rank 0 prints, and every file it saved with torch.save loads in a plain process
    and holds what the original's file holds (keys, types, tensor dtypes and shapes)."""
    failures, lines, checks = [], [], {}

    ran = (d["alive"] and smoke) or (d["rc"] == 0 and not d["alive"])
    checks["exit"] = ran
    if not ran:
        failures.append("timed out (hang?)" if d["alive"] else f"exit {d['rc']}: {last_error(d['out'])}")

    writes = read_writes(dwlog, run_tree)
    others = sorted({f"rank {w['rank']}: {w['rel']}" for w in writes if w["rank"] not in ("0", "single")})
    checks["rank0_writes"] = not others
    lines.append("writes by rank: " + json.dumps({r: len({w['rel'] for w in writes if w['rank'] == r})
                                                   for r in sorted({w['rank'] for w in writes})}))
    if others:
        failures.append(f"{len(others)} file(s) written by another rank than 0: {', '.join(others[:3])}")

    outs = rank_stdout(tlogs, nproc)
    shared = set()
    shapes0 = progress_shapes(outs.get(0, []))
    for r in range(1, nproc):
        shared |= progress_shapes(outs.get(r, [])) & shapes0
    checks["rank0_prints"] = not shared
    lines.append(f"stdout lines per rank: {[len(outs.get(r, [])) for r in range(nproc)]}")
    if shared:
        failures.append(f"rank 1 prints rank 0's progress lines: {sorted(shared)[0][:100]!r}")

    # files torch.save wrote: the output's (rank 0) and the original's, loaded without a group
    def saved(wlog: Path, tree: Path, rank_ok) -> dict[str, Path]:
        return {w["rel"]: tree / w["rel"] for w in read_writes(wlog, tree)
                if w["kind"] == "torch.save" and rank_ok(w["rank"]) and (tree / w["rel"]).is_file()}

    out_files = saved(dwlog, run_tree, lambda r: r == "0")
    orig_files = saved(owlog, orig, lambda r: True)
    (dcwd, denv), (ocwd, oenv) = tree_env(run_tree), tree_env(orig)
    sig_out = load_signatures(dcwd, denv, list(out_files.values()), base / "sig-ddp.json")
    sig_orig = load_signatures(ocwd, oenv, list(orig_files.values()), base / "sig-orig.json")
    by_norm: dict[str, list[str]] = {}
    for rel in orig_files:
        by_norm.setdefault(norm_rel(rel), []).append(rel)
    file_fail, notes = [], []
    for rel, path in sorted(out_files.items()):
        s = sig_out.get(str(path), {"ok": False, "error": "not loaded"})
        if not s["ok"]:
            msg = f"{rel} does not load without a process group: {s['error'][:160]}"
            (notes if smoke else file_fail).append(msg + (" (smoke entry: killed mid-write?)" if smoke else ""))
            continue
        refs = by_norm.get(norm_rel(rel), [])
        if not refs:
            (notes if smoke else file_fail).append(f"{rel}: the original saved no such file")
            continue
        diffs = []
        for ref in refs:
            so = sig_orig.get(str(orig_files[ref]), {})
            if not so.get("ok"):
                continue
            diffs.append(sig_diff(s["sig"], so["sig"]))
        if diffs and all(diffs):
            file_fail.append(f"{rel}: {diffs[0]}")
        elif not diffs:
            notes.append(f"{rel}: the original's file does not load here either")
    out_norm = {norm_rel(rel) for rel in out_files}
    for n, rels in sorted(by_norm.items()):
        if n not in out_norm:
            (notes if smoke else file_fail).append(f"the output never saved {rels[0]} (the original did)")
    checks["saved_files"] = {"output": len(out_files), "original": len(orig_files), "ok": not file_fail}
    lines.append(f"torch.save files: output {sorted(out_files)[:8]}, original {sorted(orig_files)[:8]}")
    lines += [f"file: {m}" for m in file_fail] + [f"note: {m}" for m in notes]
    failures += file_fail
    lines.append("verdict: " + ("pass" if not failures else "FAIL: " + "; ".join(failures)))
    return {"ok": not failures, "failures": failures, "lines": lines, "checks": checks}


def run_entry(entry: dict, ctx: Ctx, log: list[str]) -> dict:
    rec = {"name": entry["name"], "repo": entry["repo"], "path": entry["path"], "kind": entry["kind"],
           "mode": "gpu" if ctx.gpu else "cpu"}
    timeout = float(setting(entry, "timeout", 180))
    smoke = bool(entry.get("smoke"))
    args = [*entry.get("args", []), *(entry.get("gpu_args", []) if ctx.gpu else entry.get("cpu_args", []))]
    conv_rel = entry.get("convert", [entry["path"]])
    cmd_rel = conv_rel  # what ddpify is given; conv_rel: the files it may change
    if entry.get("project"):
        # project mode: ddpify is given the entry alone and converts the local modules it imports
        cmd_rel = [entry["path"]]
        conv_rel = None
    script = entry["path"].split("/")[-1]
    smoke_secs = float(setting(entry, "smoke_secs", 45))

    def section(title: str, res: dict | None = None, text: str = "") -> None:
        log.append(f"\n===== {title}")
        if res is not None:
            log.append(f"rc={res['rc']} alive_at_timeout={res['alive']} secs={res['secs']}")
            text = res["out"]
        if text:
            log.append(trim(text))

    with tempfile.TemporaryDirectory(prefix=f"rw-{entry['name']}-") as tmp:
        base = Path(tmp)
        pristine = prepare(entry, ctx, base)
        script_dir = Path(entry["path"]).parent

        ctx.entry_env = {k: str(v) for k, v in entry.get("env", {}).items()}

        def tree_env(tree: Path) -> tuple[Path, dict]:
            cwd = tree / "src" / script_dir
            extra = [str((cwd / p).resolve()) for p in entry.get("pythonpath", [])]
            return cwd, ctx.env(tree / "home", extra)

        if conv_rel is None:
            conv_rel = sorted(str(p.relative_to(pristine / "src")) for p in (pristine / "src").rglob("*.py"))
        # 0. the original must be Python 3 (some old tutorials are not): else nothing to measure
        for p in conv_rel:
            try:
                compile((pristine / "src" / p).read_bytes(), p, "exec")
            except SyntaxError as e:
                rec.update(outcome="harness-error", cause=f"original is not valid Python 3: {p}:{e.lineno} {e.msg}")
                return rec

        if ctx.original_only:  # checking a new entry's fake data and arguments
            o = run([sys.executable, script, *args], *tree_env(clone(pristine, base / "orig")),
                    smoke_secs if smoke else timeout)
            section("original (1 process)", o)
            ok = (o["alive"] and smoke) or (o["rc"] == 0 and not o["alive"])
            rec.update(outcome="original-runs" if ok else "harness-error",
                       cause=f"{o['secs']} s" if ok else ("timed out" if o["alive"] else last_error(o["out"])))
            return rec

        # 1. convert. ddpify follows the entry's local imports, so any .py file of the tree may
        # change: every changed one goes into the runs below, not only the entry.
        conv = clone(pristine, base / "conv")
        cwd, env = tree_env(conv)
        all_rel = sorted(str(p.relative_to(pristine / "src")) for p in (pristine / "src").rglob("*.py"))
        c = convert([conv / "src" / p for p in all_rel], cwd, env, [conv / "src" / p for p in cmd_rel])
        changed_rel = [p for p in all_rel if (conv / "src" / p).read_bytes() != (pristine / "src" / p).read_bytes()]
        conv_rel = sorted(set(conv_rel) | set(changed_rel))
        rec["changed_files"] = changed_rel
        files = [conv / "src" / p for p in conv_rel]
        section(f"ddpify {' '.join(cmd_rel)}", c)
        rec.update(ddpify_rc=c["rc"], changed=c["changed"], findings=finding_codes(c["out"]), blocking=c["blocking"])
        if c["changed"] and ctx.diffs:
            # Diffs quote the repository's code: they go to an ignored folder, never to logs/.
            diff = subprocess.run(["diff", "-ru", str(pristine / "src"), str(conv / "src")], capture_output=True, text=True)
            ctx.diffs.mkdir(parents=True, exist_ok=True)
            (ctx.diffs / f"{entry['name']}.diff").write_text(diff.stdout.replace(str(base), ""))

        if entry["kind"] == "distributed":
            rec["outcome"] = "untouched" if not c["changed"] else "wrong"
            rec["cause"] = "left as it was" if not c["changed"] else "rewrote an already-distributed script"
            return rec
        if c["rc"] != 0:
            if c["changed"]:
                rec.update(outcome="wrong", cause=f"ddpify exited {c['rc']} but changed the file")
            elif rec["blocking"] or rec["findings"]:
                named = rec["blocking"] or rec["findings"]
                rec.update(outcome="refused", cause=f"ddpify exited {c['rc']}: blocking {', '.join(named)}")
            else:
                rec.update(outcome="wrong", cause=f"ddpify exited {c['rc']} without a finding: {last_error(c['out'])}")
            return rec
        if not c["changed"]:
            rec.update(outcome="wrong", cause="ddpify exited 0 and converted nothing")
            return rec

        # 2. compiles, idempotent
        bad = []
        for f in files:
            try:
                py_compile.compile(str(f), cfile=str(base / "pyc"), doraise=True)
            except py_compile.PyCompileError as e:
                bad.append(str(e).splitlines()[-1][:200])
        rec["compiles"] = not bad
        idem = clone(conv, base / "idem")
        icwd, ienv = tree_env(idem)
        c2 = convert([idem / "src" / p for p in all_rel], icwd, ienv, [idem / "src" / p for p in cmd_rel])
        rec["idempotent"] = c2["rc"] == 0 and not c2["changed"]
        section("ddpify again (idempotency)", c2)
        if bad:
            rec.update(outcome="wrong", cause=f"output does not compile: {bad[0]}")
            return rec

        if ctx.convert_only:
            rec.update(outcome="converted", cause="not run (--convert-only)")
            if not rec["idempotent"]:
                rec.update(outcome="wrong", cause="not idempotent (second conversion changes the output)")
            return rec
        if entry.get("gpu_only") and not ctx.gpu:
            rec.update(outcome="gpu-only", cause="needs a GPU (gpu_only): conversion checked, runs with --gpu")
            if not rec["idempotent"]:
                rec.update(outcome="wrong", cause="not idempotent (second conversion changes the output)")
            return rec

        # 3. ddpify verify on the output: its baseline (if on) runs the output as one process,
        # its candidate under torchrun (on a fresh copy: nothing left over from another run).
        nproc = 2
        ver = fresh_output(pristine, conv, conv_rel, base / "ver")
        vcwd, venv = tree_env(ver)
        steps = int(setting(entry, "verify_steps", 20))
        vjson = base / "verify.json"
        v = run([sys.executable, "-m", "ddpify", "verify", "--no-convert", "--nproc", str(nproc),
                 "--steps", str(steps), "--timeout", str(int(timeout)), "--json", str(vjson),
                 *([] if entry.get("baseline", ctx.baseline) else ["--no-baseline"]), script, "--", *args], vcwd, venv, 3 * timeout + 120)
        section("ddpify verify --no-convert (output)", v)
        rec["verify"] = {"rc": v["rc"], "alive": v["alive"], "secs": v["secs"]}
        ver_ok = v["rc"] == 0 and not v["alive"]
        rec["verify_verdict"] = "pass" if ver_ok else "fail"
        rec["verify_cause"] = "" if ver_ok else ("timed out" if v["alive"] else verify_summary(v["out"]))

        # 4. the original, one process, to its end, with the write log: whether it runs here at
        # all (else a harness error), and what it saves (the reference for the files below).
        orig = clone(pristine, base / "orig")
        ocwd, oenv = tree_env(orig)
        owlog = base / "wlog-orig"
        owlog.mkdir()
        o = run([sys.executable, script, *args], ocwd, {**oenv, "RW_WRITE_LOG": str(owlog)},
                smoke_secs if smoke else timeout)
        section("original (1 process, write log)", o)
        rec["orig"] = {"rc": o["rc"], "alive": o["alive"], "secs": o["secs"]}
        if not ((o["alive"] and smoke) or (o["rc"] == 0 and not o["alive"])):
            why = "timed out" if o["alive"] else last_error(o["out"])
            rec.update(outcome="harness-error", cause=f"original fails here: {why}")
            rec.pop("verify_verdict", None)
            return rec

        # 5. the harness's own judgement, independent of verify: the whole small run of the
        # output under torchrun (not stopped at --steps), every rank's writes and stdout logged,
        # then every file it saved loaded in a plain process and compared with the original's.
        run_tree = fresh_output(pristine, conv, conv_rel, base / "ddp")
        dcwd, denv = tree_env(run_tree)
        dwlog, tlogs = base / "wlog-ddp", base / "torchrun-logs"
        dwlog.mkdir()
        d = run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                 "--max-restarts=0", "--log-dir", str(tlogs), "--tee", "3", script, *args], dcwd,
                {**denv, "RW_WRITE_LOG": str(dwlog)}, (smoke_secs if smoke else timeout) + 60)
        section(f"output under torchrun ({nproc} processes, write log)", d)
        rec["ddp"] = {"rc": d["rc"], "alive": d["alive"], "secs": d["secs"]}
        judge = judge_run(entry, smoke, d, orig, owlog, run_tree, dwlog, tlogs, nproc, base, tree_env)
        rec["harness_checks"] = judge["checks"]
        section("harness judgement", text="\n".join(judge["lines"]))
        rec["harness_verdict"] = "pass" if judge["ok"] else "fail"
        rec["harness_cause"] = "; ".join(judge["failures"])[:400]
        rec["disagree"] = ver_ok != judge["ok"]

        if not rec["idempotent"]:
            rec.update(outcome="wrong", cause="not idempotent (second conversion changes the output)")
        elif ver_ok and judge["ok"]:
            rec.update(outcome="correct", cause="")
        else:
            parts = []
            if not ver_ok:
                parts.append(f"verify fails: {rec['verify_cause']}")
            if not judge["ok"]:
                parts.append(f"harness: {rec['harness_cause']}")
            if rec["disagree"]:
                parts.insert(0, "DISAGREE (verify " + rec["verify_verdict"] + ", harness " + rec["harness_verdict"] + ")")
            rec.update(outcome="wrong", cause="; ".join(parts)[:500])
        if ctx.keep:
            keep = Path(ctx.keep) / entry["name"]
            shutil.rmtree(keep, ignore_errors=True)
            shutil.copytree(base, keep, symlinks=True, ignore=shutil.ignore_patterns("pristine"))
        return rec


# ----------------------------------------------------------------------------- export, table
def export(entries: list[dict], ctx: Ctx, dest: Path) -> None:
    """Sources + fake data per entry (DEST/NAME/{src,home}), for a machine without the mirrors."""
    dest.mkdir(parents=True, exist_ok=True)
    for e in entries:
        out = dest / e["name"]
        shutil.rmtree(out, ignore_errors=True)
        extract(e, ctx.mirrors, out / "src")
        (out / "home").mkdir(parents=True, exist_ok=True)
        if e["kind"] != "distributed":
            make_data(e, out / "src", out / "home")
        print(f"exported {e['name']}")
    if (DEPS / "fallback").is_dir():
        shutil.rmtree(dest / "_fallback", ignore_errors=True)
        shutil.copytree(DEPS / "fallback", dest / "_fallback")
    share_duplicates(dest)
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"{dest}: {size / 2**20:.1f} MiB")


SHARED, SHARED_SUFFIX = "_shared", ".rwshared"


def share_duplicates(dest: Path, min_size: int = 64 * 1024) -> None:
    """Store each large file that several entries hold (the same fake MNIST/CIFAR files, the same
    sources) once under DEST/_shared/<sha256>; each place keeps a small NAME.rwshared note naming
    it, which prepare() turns back into the file. Keeps the export small enough to carry."""
    by_sha: dict[str, list[Path]] = {}
    for f in sorted(dest.rglob("*")):
        if f.is_file() and not f.is_symlink() and f.stat().st_size >= min_size and SHARED not in f.parts \
                and "_fallback" not in f.relative_to(dest).parts[:1]:
            by_sha.setdefault(hashlib.sha256(f.read_bytes()).hexdigest(), []).append(f)
    shared = dest / SHARED
    for digest, files in by_sha.items():
        if len(files) < 2:
            continue
        shared.mkdir(exist_ok=True)
        if not (shared / digest).exists():
            shutil.copy2(files[0], shared / digest)
        for f in files:
            f.unlink()
            f.with_name(f.name + SHARED_SUFFIX).write_text(digest + "\n")


def unshare(tree: Path, export_root: Path) -> None:
    """Put the shared files of an exported entry back in place (see share_duplicates)."""
    for note in sorted(tree.rglob("*" + SHARED_SUFFIX)):
        digest = note.read_text().strip()
        shutil.copy2(export_root / SHARED / digest, note.with_name(note.name[: -len(SHARED_SUFFIX)]))
        note.unlink()


SUMMARY_KINDS = ("correct", "refused", "wrong", "harness-error", "gpu-only")


def split_summary(results: dict, entries: list[dict]) -> str:
    """Per split: single-GPU entries correct / refused / wrong / harness-error (/ gpu-only on the
    CPU), distributed entries left untouched, and the entries where verify and the harness's
    own judgement disagree."""
    rows = ["| split | single-GPU entries | correct | refused | wrong | harness-error | gpu-only | "
            "distributed untouched | verify/harness disagree |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for split in SPLITS:
        mine = [results[e["name"]] for e in entries if e["split"] == split and e["name"] in results]
        if not mine:
            continue
        single = [r for r in mine if r["kind"] != "distributed"]
        dist = [r for r in mine if r["kind"] == "distributed"]
        n = {k: sum(r["outcome"] == k for r in single) for k in SUMMARY_KINDS}
        runs = len(single) - n["harness-error"] - n["gpu-only"]
        pct = f" ({100 * n['correct'] / runs:.1f}% of {runs} that run here)" if runs else ""
        disagree = sorted(r["name"] for r in single if r.get("disagree"))
        rows.append(f"| {split} | {len(single)} | **{n['correct']}**{pct} | {n['refused']} | **{n['wrong']}** | "
                    f"{n['harness-error']} | {n['gpu-only']} | "
                    f"{sum(r['outcome'] == 'untouched' for r in dist)} / {len(dist)} | "
                    f"{len(disagree)}{': ' + ', '.join(disagree) if disagree else ''} |")
    return "\n".join(rows) + "\n"


def table(results: dict, entries: list[dict]) -> str:
    rows = ["| entry | split | repo | kind | outcome | verify | harness | cause |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    counts: dict[str, int] = {}
    for e in entries:
        r = results.get(e["name"])
        if not r:
            continue
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        cause = r.get("cause", "").replace("|", "\\|")
        flag = " **DISAGREE**" if r.get("disagree") else ""
        rows.append(f"| {e['name']} | {e['split']} | {r['repo']} | {r['kind']} | **{r['outcome']}** | "
                    f"{r.get('verify_verdict', '')} | {r.get('harness_verdict', '')}{flag} | {cause} |")
    total = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    return (split_summary(results, entries) + "\n" + "\n".join(rows)
            + f"\n\nTotals ({sum(counts.values())} entries): {total}\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated entry names")
    ap.add_argument("--split", choices=["dev", "heldback", "all"], default="dev",
                    help="dev: the development split (manifest.toml); heldback: the held-back split "
                         "(heldback/manifest.toml and entries marked split = \"heldback\"); all: both")
    ap.add_argument("--gpu", action="store_true", help="NCCL on 2 GPUs; native torchvision, gpu_only entries run")
    ap.add_argument("--shard", help="I/N: every N-th entry from the I-th (to split a run over several sessions)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="entries at once (GPU machines: their ranks share the GPUs; keep 1 on the shared 2-core CPU machine)")
    ap.add_argument("--cache", "--mirrors", dest="mirrors", default=os.environ.get("RW_MIRRORS", "/work/.mirror"),
                    help="folder of repository mirrors, OWNER+NAME/repo (bare or with .git)")
    ap.add_argument("--from-export", help="use sources + fake data written by --export instead of mirrors")
    ap.add_argument("--export", help="write sources + fake data of the entries into this folder and stop")
    ap.add_argument("--setup", action="store_true", help="install the corpus's packages and CPU torchvision")
    ap.add_argument("--manifest", default=str(HERE / "manifest.toml"))
    ap.add_argument("--results", default=str(HERE / "results.json"))
    ap.add_argument("--logs", default=str(HERE / "logs"))
    ap.add_argument("--full", action="store_true",
                    help="let verify run its one-process baseline too (the original and the output's whole "
                         "run under torchrun are always run for a converted entry: the harness's own judgement)")
    ap.add_argument("--diffs", default=str(ROOT / ".realworld_out" / "diffs"),
                    help="write each conversion's diff here (not committed: it quotes the sources)")
    ap.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=None,
                    help="let verify run its one-process baseline (default: with --gpu or --full)")
    ap.add_argument("--convert-only", action="store_true",
                    help="stop after converting (exit code, blocking findings, compiles, idempotent)")
    ap.add_argument("--original-only", action="store_true",
                    help="only run each original as one process (to check a new entry's fake data and arguments)")
    ap.add_argument("--keep", help="copy each entry's run folders here (debugging)")
    ap.add_argument("--table", action="store_true", help="print the results table (markdown) and stop")
    args = ap.parse_args()

    if args.jobs < 1:
        ap.error("--jobs: at least 1")
    if args.setup:
        setup()
        return 0
    all_entries = load_entries(Path(args.manifest), "all")
    entries = [e for e in all_entries if args.split == "all" or e["split"] == args.split]
    if args.only:
        want = args.only.split(",")
        unknown = set(want) - {e["name"] for e in entries}
        if unknown:
            ap.error(f"unknown entries in split {args.split}: {', '.join(sorted(unknown))}")
        entries = [e for e in entries if e["name"] in want]
    if args.shard:
        i, n = (int(x) for x in args.shard.split("/"))
        entries = entries[i - 1::n]
    results_path = Path(args.results)
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    if args.table:
        print(table(results, [e for e in all_entries if args.split == "all" or e["split"] == args.split]))
        return 0
    ctx = Ctx(args)
    if args.export:
        export(entries, ctx, Path(args.export))
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        ctx.warm_caches(Path(tmp))
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    def one(e: dict) -> tuple[dict, list[str]]:
        log: list[str] = [f"# {e['name']}: {e['repo']}@{e['commit'][:12]} {e['path']} (ddpify {rev[:12]})"]
        start = time.monotonic()
        try:
            rec = run_entry(e, ctx, log)
        except Exception as exc:  # a harness bug must not stop the corpus
            rec = {"name": e["name"], "repo": e["repo"], "path": e["path"], "kind": e["kind"],
                   "outcome": "harness-error", "cause": f"harness: {type(exc).__name__}: {exc}"[:200]}
        rec["split"] = e["split"]
        rec["secs"] = round(time.monotonic() - start, 1)
        rec["ddpify_rev"] = rev
        return rec, log

    # Entries run in threads (each waits on its subprocesses); results are written by this thread only.
    disagreements = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(one, e) for e in entries]
        for fut in concurrent.futures.as_completed(futures):
            rec, log = fut.result()
            log.append(f"\n===== outcome: {rec['outcome']} {rec.get('cause', '')}")
            (logs / f"{rec['name']}.log").write_text("\n".join(log) + "\n")
            results[rec["name"]] = rec
            results_path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
            print(f"{rec['name']:32s} {rec['outcome']:13s} {rec['secs']:6.1f}s  {rec.get('cause', '')}", flush=True)
            if rec.get("disagree"):
                disagreements.append(rec)
    for rec in disagreements:
        print(f"DISAGREE {rec['name']}: verify {rec['verify_verdict']} ({rec.get('verify_cause') or 'ok'}), "
              f"harness {rec['harness_verdict']} ({rec.get('harness_cause') or 'ok'})", flush=True)
    if disagreements:
        print(f"{len(disagreements)} entries where verify and the harness disagree: each is a verify bug "
              "(or a harness bug) to look at", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
