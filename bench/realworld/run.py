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
CPU_PACKAGES = ["numpy", "pillow", "scipy", "matplotlib", "pandas", "tensorboard", "progress", "six",
                "unidecode", "imageio", "seaborn", "pyyaml", "requests", "tqdm"]
# Pure-Python ones that an offline GPU box may lack; carried by --export, put after site-packages.
FALLBACK_PACKAGES = ["six", "unidecode", "progress", "imageio", "seaborn"]
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
    def __init__(self, args, defaults):
        self.gpu = args.gpu
        self.mirrors = Path(args.mirrors)
        self.from_export = Path(args.from_export) if args.from_export else None
        self.defaults = defaults
        self.keep = args.keep
        self._local = threading.local()  # entry_env is per entry, and --jobs runs entries in threads
        self.full = args.full
        self.convert_only = args.convert_only
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


def run_entry(entry: dict, ctx: Ctx, log: list[str]) -> dict:
    rec = {"name": entry["name"], "repo": entry["repo"], "path": entry["path"], "kind": entry["kind"],
           "mode": "gpu" if ctx.gpu else "cpu"}
    timeout = float(entry.get("timeout", ctx.defaults.get("timeout", 180)))
    smoke = bool(entry.get("smoke"))
    args = [*entry.get("args", []), *([] if ctx.gpu else entry.get("cpu_args", []))]
    conv_rel = entry.get("convert", [entry["path"]])
    cmd_rel = conv_rel  # what ddpify is given; conv_rel: the files it may change
    if entry.get("project"):
        # project mode: ddpify is given the entry alone and converts the local modules it imports
        cmd_rel = [entry["path"]]
        conv_rel = None
    script = entry["path"].split("/")[-1]
    smoke_secs = float(entry.get("smoke_secs", ctx.defaults.get("smoke_secs", 45)))

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
        steps = int(entry.get("verify_steps", ctx.defaults.get("verify_steps", 20)))
        vjson = base / "verify.json"
        v = run([sys.executable, "-m", "ddpify", "verify", "--no-convert", "--nproc", str(nproc),
                 "--steps", str(steps), "--timeout", str(int(timeout)), "--json", str(vjson),
                 *([] if entry.get("baseline", ctx.baseline) else ["--no-baseline"]), script, "--", *args], vcwd, venv, 3 * timeout + 120)
        section("ddpify verify --no-convert (output)", v)
        rec["verify"] = {"rc": v["rc"], "alive": v["alive"], "secs": v["secs"]}
        ver_ok = v["rc"] == 0 and not v["alive"]

        # 4. the original, one process: always with --full, else only to tell a harness error
        # (the original fails here too) from a wrong output when verify failed.
        if ctx.full or not ver_ok:
            orig = clone(pristine, base / "orig")
            ocwd, oenv = tree_env(orig)
            o = run([sys.executable, script, *args], ocwd, oenv, smoke_secs if smoke else timeout)
            section("original (1 process)", o)
            rec["orig"] = {"rc": o["rc"], "alive": o["alive"], "secs": o["secs"]}
            if not ((o["alive"] and smoke) or (o["rc"] == 0 and not o["alive"])):
                why = "timed out" if o["alive"] else last_error(o["out"])
                rec.update(outcome="harness-error", cause=f"original fails here: {why}")
                return rec

        # 5. --full: the whole small run of the output under torchrun, not stopped at --steps
        ddp_ok = True
        if ctx.full:
            run_tree = fresh_output(pristine, conv, conv_rel, base / "ddp")
            dcwd, denv = tree_env(run_tree)
            d = run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                     "--max-restarts=0", script, *args], dcwd, denv, (smoke_secs if smoke else timeout) + 60)
            section(f"output under torchrun ({nproc} processes)", d)
            rec["ddp"] = {"rc": d["rc"], "alive": d["alive"], "secs": d["secs"]}
            ddp_ok = (d["alive"] and smoke) or (d["rc"] == 0 and not d["alive"])

        if not rec["idempotent"]:
            rec.update(outcome="wrong", cause="not idempotent (second conversion changes the output)")
        elif not ver_ok:
            why = "timed out" if v["alive"] else verify_summary(v["out"])
            rec.update(outcome="wrong", cause=f"verify fails: {why}")
        elif not ddp_ok:
            why = "timed out (hang?)" if d["alive"] else last_error(d["out"])
            rec.update(outcome="wrong", cause=f"output fails under torchrun: {why}")
        else:
            rec.update(outcome="correct", cause="")
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
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"{dest}: {size / 2**20:.1f} MiB")


def table(results: dict, entries: list[dict]) -> str:
    order = [e["name"] for e in entries]
    rows = ["| entry | repo | kind | outcome | cause |", "| --- | --- | --- | --- | --- |"]
    counts: dict[str, int] = {}
    for name in order:
        r = results.get(name)
        if not r:
            continue
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        cause = r.get("cause", "").replace("|", "\\|")
        rows.append(f"| {name} | {r['repo']} | {r['kind']} | **{r['outcome']}** | {cause} |")
    total = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    return "\n".join(rows) + f"\n\nTotals ({sum(counts.values())} entries): {total}\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated entry names")
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
                    help="also run the original and the whole small run of the output under torchrun "
                         "(else the original runs only when verify fails, to tell a harness error)")
    ap.add_argument("--diffs", default=str(ROOT / ".realworld_out" / "diffs"),
                    help="write each conversion's diff here (not committed: it quotes the sources)")
    ap.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=None,
                    help="let verify run its one-process baseline (default: with --gpu or --full)")
    ap.add_argument("--convert-only", action="store_true",
                    help="stop after converting (exit code, blocking findings, compiles, idempotent)")
    ap.add_argument("--keep", help="copy each entry's run folders here (debugging)")
    ap.add_argument("--table", action="store_true", help="print the results table (markdown) and stop")
    args = ap.parse_args()

    if args.jobs < 1:
        ap.error("--jobs: at least 1")
    if args.setup:
        setup()
        return 0
    defaults, entries = load_manifest(Path(args.manifest))
    names = [e["name"] for e in entries]
    assert len(set(names)) == len(names), "duplicate entry names"
    if args.only:
        want = args.only.split(",")
        unknown = set(want) - set(names)
        if unknown:
            ap.error(f"unknown entries: {', '.join(sorted(unknown))}")
        entries = [e for e in entries if e["name"] in want]
    if args.shard:
        i, n = (int(x) for x in args.shard.split("/"))
        entries = entries[i - 1::n]
    results_path = Path(args.results)
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    if args.table:
        print(table(results, load_manifest(Path(args.manifest))[1]))
        return 0
    ctx = Ctx(args, defaults)
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
        rec["secs"] = round(time.monotonic() - start, 1)
        rec["ddpify_rev"] = rev
        return rec, log

    # Entries run in threads (each waits on its subprocesses); results are written by this thread only.
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(one, e) for e in entries]
        for fut in concurrent.futures.as_completed(futures):
            rec, log = fut.result()
            log.append(f"\n===== outcome: {rec['outcome']} {rec.get('cause', '')}")
            (logs / f"{rec['name']}.log").write_text("\n".join(log) + "\n")
            results[rec["name"]] = rec
            results_path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
            print(f"{rec['name']:32s} {rec['outcome']:13s} {rec['secs']:6.1f}s  {rec.get('cause', '')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
