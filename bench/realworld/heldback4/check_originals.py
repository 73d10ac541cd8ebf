"""Run the ORIGINAL of each entry of held-back split 4 as one process, the way run.py would (pinned
sources, fake data, the harness's environment and shims), to check that it runs here before
ddpify is measured on it. Prints one line per entry: ok / smoke-ok (alive at smoke_secs) /
to-cuda (gpu_only entry that got as far as its first CUDA call) / FAIL.

    python bench/realworld/heldback4/check_originals.py [--only NAME,...] [--keep DIR] [--gpu-only-on-cpu]
    python bench/realworld/heldback4/check_originals.py --gpu --from-export DIR     # on a GPU machine
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

CUDA_ERRORS = ("Torch not compiled with CUDA", "No CUDA GPUs are available", "Found no NVIDIA driver",
               "Attempting to deserialize object on a CUDA device", "CUDA is not available")


class _Options(argparse.Namespace):
    """run.py's options as its Ctx reads them: any option not set here is None (off), so that a
    harness that gains options keeps working with this script."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--manifest", default=str(HERE / "manifest.toml"))
    ap.add_argument("--only")
    ap.add_argument("--mirrors", default="/work/.mirror")
    ap.add_argument("--keep", help="copy each run folder (and the output, out.txt) here")
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--gpu-only-on-cpu", action="store_true",
                    help="also run gpu_only entries: 'to-cuda' when the only failure is the first CUDA call")
    ap.add_argument("--from-export", help="sources + fake data from run.py --export DIR (a machine without mirrors)")
    a = ap.parse_args()
    defaults, entries = rw.load_manifest(Path(a.manifest))
    if a.only:
        want = a.only.split(",")
        unknown = set(want) - {e["name"] for e in entries}
        if unknown:
            ap.error(f"unknown entries: {', '.join(sorted(unknown))}")
        entries = [e for e in entries if e["name"] in want]
    ctx = rw.Ctx(_Options(gpu=a.gpu, mirrors=a.mirrors, from_export=a.from_export, keep=None, full=False,
                          convert_only=False, original_only=True, baseline=False, diffs=None))
    with tempfile.TemporaryDirectory() as tmp:
        ctx.warm_caches(Path(tmp))
    bad = 0
    for e in entries:
        e = {**e, "_defaults": defaults}
        if e["kind"] == "distributed":
            continue
        if e.get("gpu_only") and not a.gpu and not a.gpu_only_on_cpu:
            print(f"{e['name']:34s} skipped (gpu_only)", flush=True)
            continue
        with tempfile.TemporaryDirectory(prefix=f"h4-{e['name']}-") as tmp:
            base = Path(tmp)
            pristine = rw.prepare(e, ctx, base)
            ctx.entry_env = {k: str(v) for k, v in e.get("env", {}).items()}
            cwd = pristine / "src" / Path(e["path"]).parent
            extra = [str((cwd / p).resolve()) for p in e.get("pythonpath", [])]
            env = ctx.env(pristine / "home", extra)
            smoke = bool(e.get("smoke"))
            timeout = float(rw.setting(e, "smoke_secs", 45) if smoke else rw.setting(e, "timeout", 180))
            args = [*e.get("args", []), *(e.get("gpu_args", []) if a.gpu else e.get("cpu_args", []))]
            o = rw.run([sys.executable, Path(e["path"]).name, *args], cwd, env, timeout)
            ok = (o["alive"] and smoke) or (o["rc"] == 0 and not o["alive"])
            what = ("smoke-ok" if o["alive"] else "ok") if ok else "FAIL"
            if not ok and e.get("gpu_only") and not a.gpu and not o["alive"] \
                    and any(m in rw.last_error(o["out"]) for m in CUDA_ERRORS):
                ok, what = True, "to-cuda"
            bad += not ok
            why = "" if ok else ("timed out" if o["alive"] else rw.last_error(o["out"]))
            print(f"{e['name']:34s} {what:8s} {o['secs']:6.1f}s {why}", flush=True)
            if a.keep:
                dest = Path(a.keep) / e["name"]
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(base, dest, symlinks=True)
                (dest / "out.txt").write_text(o["out"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
