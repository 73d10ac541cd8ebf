"""Run the ORIGINAL of held-back entries (split 2) as one process, the way run.py would (pinned sources,
fake data, the harness's environment and shims), to check that each one runs here before ddpify
is measured on it. Prints one line per entry: ok / smoke-ok (alive at smoke_secs) / FAIL.

    python bench/realworld/heldback/check_originals.py [--only NAME,...] [--keep DIR] [--gpu --from-export DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import run as rw  # noqa: E402  (the harness: same extraction, fake data and environment)


def _cuda_failure(line: str) -> bool:
    """The error a CPU-only torch raises at a script's first CUDA call."""
    return any(m in line for m in ("Torch not compiled with CUDA", "No CUDA GPUs are available",
                                   "Found no NVIDIA driver", "Attempting to deserialize object on a CUDA device"))


class _Defaults(argparse.Namespace):
    """run.py's options as Ctx reads them: any option this script does not set is None (off), so
    that a harness that gains options keeps working here."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--manifest", default=str(HERE / "manifest.toml"))
    ap.add_argument("--only")
    ap.add_argument("--mirrors", default="/work/.mirror")
    ap.add_argument("--keep", help="copy each run folder here")
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--gpu-only-on-cpu", action="store_true",
                    help="also run gpu_only entries here: 'to-cuda' when the only failure is the first CUDA call "
                         "(data, imports and arguments all worked up to it)")
    ap.add_argument("--from-export", help="sources + fake data from run.py --export DIR (a machine without mirrors)")
    a = ap.parse_args()
    defaults, entries = rw.load_manifest(Path(a.manifest))
    if a.only:
        want = a.only.split(",")
        entries = [e for e in entries if e["name"] in want]
    ns = _Defaults(gpu=a.gpu, mirrors=a.mirrors, from_export=a.from_export, keep=None, full=False,
                   convert_only=False, baseline=False, diffs=None)
    ctx = rw.Ctx(ns, defaults)
    bad = 0
    for e in entries:
        if e["kind"] == "distributed":
            continue
        if e.get("gpu_only") and not a.gpu and not a.gpu_only_on_cpu:
            print(f"{e['name']:32s} skipped (gpu_only)", flush=True)
            continue
        with tempfile.TemporaryDirectory(prefix=f"h2-{e['name']}-") as tmp:
            base = Path(tmp)
            pristine = rw.prepare(e, ctx, base)
            ctx.entry_env = {k: str(v) for k, v in e.get("env", {}).items()}
            cwd = pristine / "src" / Path(e["path"]).parent
            extra = [str((cwd / p).resolve()) for p in e.get("pythonpath", [])]
            env = ctx.env(pristine / "home", extra)
            smoke = bool(e.get("smoke"))
            timeout = float(e.get("smoke_secs", defaults.get("smoke_secs", 45))) if smoke else \
                float(e.get("timeout", defaults.get("timeout", 180)))
            args = [*e.get("args", []), *(e.get("gpu_args", []) if a.gpu else e.get("cpu_args", []))]
            o = rw.run([sys.executable, Path(e["path"]).name, *args], cwd, env, timeout)
            ok = (o["alive"] and smoke) or (o["rc"] == 0 and not o["alive"])
            what = ("smoke-ok" if o["alive"] else "ok") if ok else "FAIL"
            if not ok and e.get("gpu_only") and not a.gpu and _cuda_failure(rw.last_error(o["out"])):
                ok, what = True, "to-cuda"
            bad += not ok
            why = "" if ok else ("timed out" if o["alive"] else rw.last_error(o["out"]))
            print(f"{e['name']:32s} {what:8s} {o['secs']:6.1f}s {why}", flush=True)
            if a.keep:
                dest = Path(a.keep) / e["name"]
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(base, dest, symlinks=True)
                (dest / "out.txt").write_text(o["out"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
