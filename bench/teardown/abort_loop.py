"""Consecutive torchrun runs (2 gloo ranks on CPU) of converted scripts, counting the runs that end
with a non-zero exit code or print `terminate called` (the SIGABRT at teardown:
bench/teardown/results.txt).

The scripts come from one git revision of this repository (`--rev`, default: the working tree):
the README's try-it conversion of examples/train.py made by that revision's ddpify, and the
expected outputs of the fixtures named with --fixture. Kinds run round-robin, one torchrun at a
time, so a change in the machine's load hits every kind alike.

    python bench/teardown/abort_loop.py --runs 100 --rev 5a90351 --out bench/teardown/before.json
    python bench/teardown/abort_loop.py --every-path --no-tryit --runs 60 --out bench/teardown/every_path.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import io
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = [
    "01_toplevel_regression",
    "38_dict_batches_early_stop",
    "03_trainer_dataclass",
]
# --every-path: one output of each path the converter can emit: a fresh conversion, a
# modernised legacy script that keeps its own process group (apex SyncBN, --sync-bn), a single-GPU
# apex script (torch.amp, three losses), a project (entry + trainer module) and --optimize
EVERY_PATH = {
    "fresh": "01_toplevel_regression",
    "legacy": "225_legacy_syncbn_own_group",
    "apex": "222_dcgan_three_losses",
    "project": "213_apex_project_trainer_module/expected/train.py",
    "optimize": "160_optimize_cnn_applied",
}


def sources(rev: str | None, tmp: Path) -> Path:
    """A copy of the repository at `rev` (the working tree when None)."""
    if rev is None:
        return ROOT
    dest = tmp / "src"
    dest.mkdir()
    blob = subprocess.run(
        ["git", "archive", rev], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def scripts(
    src: Path, fixtures: list[str], tmp: Path
) -> dict[str, tuple[Path, list[str]]]:
    out = {}
    # the README's try-it: ddpify - < examples/train.py > /tmp/train_ddp.py
    tryit = tmp / "train_ddp.py"
    env = dict(os.environ, PYTHONPATH=str(src))
    with open(src / "examples/train.py") as fin, open(tryit, "w") as fout:
        subprocess.run(
            [sys.executable, "-m", "ddpify", "-"],
            stdin=fin,
            stdout=fout,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=src,
            check=True,
        )
    out["tryit"] = (tryit, [])
    for kind, name in (
        fixtures.items() if isinstance(fixtures, dict) else ((n, n) for n in fixtures)
    ):
        # NAME (its expected.py) or NAME/path/to/entry.py (a project fixture's converted entry)
        fixture, _, entry = name.partition("/")
        d = src / "fixtures" / fixture
        args = (d / "args.txt").read_text().split() if (d / "args.txt").exists() else []
        out[kind] = (d / (entry or "expected.py"), args)
    return out


def run_once(
    script: Path, args: list[str], cwd: Path, timeout: int, diagnose: bool
) -> tuple[int, int, str]:
    env = dict(
        os.environ,
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    if diagnose:  # Python stacks of every thread on SIGABRT; core files in cwd (core_pattern "core")
        env["PYTHONFAULTHANDLER"] = "1"
    for var in (
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
    ):
        env.pop(var, None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        *args,
    ]
    try:
        p = subprocess.run(
            cmd,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            preexec_fn=(
                lambda: resource.setrlimit(
                    resource.RLIMIT_CORE,
                    (resource.getrlimit(resource.RLIMIT_CORE)[1],) * 2,
                )
            )
            if diagnose
            else None,
        )
    except subprocess.TimeoutExpired as e:
        text = (
            (e.stdout or b"").decode()
            if isinstance(e.stdout, bytes)
            else (e.stdout or "")
        )
        return -999, 0, "TIMEOUT\n" + text[-2000:]
    text = p.stdout + p.stderr
    return p.returncode, text.count("terminate called"), text


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=10, help="runs of each kind")
    ap.add_argument(
        "--rev",
        default=None,
        help="git revision whose ddpify and fixtures to run (default: working tree)",
    )
    ap.add_argument(
        "--fixture",
        action="append",
        help=f"fixture directory name (default: {' '.join(FIXTURES)})",
    )
    ap.add_argument(
        "--no-tryit",
        action="store_true",
        help="skip the try-it conversion of examples/train.py",
    )
    ap.add_argument(
        "--every-path",
        action="store_true",
        help=f"one output of each converter path: {', '.join(f'{k}={v}' for k, v in EVERY_PATH.items())}",
    )
    ap.add_argument(
        "--out",
        type=Path,
        required=True,
        help="JSON result file, rewritten after every run",
    )
    ap.add_argument("--timeout", type=int, default=180)
    ap.add_argument(
        "--keep-logs",
        type=Path,
        default=None,
        help="folder for the full output (and cores) of failed runs",
    )
    ap.add_argument(
        "--diagnose",
        action="store_true",
        help="PYTHONFAULTHANDLER=1 and core dumps (kept for failed runs)",
    )
    ap.add_argument(
        "--export",
        type=Path,
        default=None,
        help="write the scripts (KIND.py, KIND.args) into this folder and stop: for a machine without git or ddpify",
    )
    ap.add_argument(
        "--scripts",
        type=Path,
        default=None,
        help="run the scripts of an --export folder instead",
    )
    ap.add_argument("--only", action="append", help="run only these kinds")
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="abort_loop_") as t:
        tmp = Path(t)
        if ns.scripts:
            kinds = {
                p.stem: (
                    p,
                    (
                        p.with_suffix(".args").read_text().split()
                        if p.with_suffix(".args").exists()
                        else []
                    ),
                )
                for p in sorted(ns.scripts.resolve().glob("*.py"))
            }
        else:
            src = sources(ns.rev, tmp)
            kinds = scripts(
                src, EVERY_PATH if ns.every_path else (ns.fixture or FIXTURES), tmp
            )
        if ns.no_tryit:
            kinds.pop("tryit", None)
        if ns.only:
            kinds = {k: v for k, v in kinds.items() if k in ns.only}
        if ns.export:
            ns.export.mkdir(parents=True, exist_ok=True)
            for kind, (script, args) in kinds.items():
                shutil.copy(script, ns.export / f"{kind}.py")
                (ns.export / f"{kind}.args").write_text(" ".join(args) + "\n")
            print(f"{len(kinds)} scripts in {ns.export}")
            return
        result = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "rev": ns.rev or "working tree",
            "head": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                cwd=ROOT,
                capture_output=True,
                text=True,
            ).stdout.strip()
            if (ROOT / ".git").exists()
            else "(no git)",
            "kinds": {
                k: {
                    "runs": 0,
                    "nonzero_exit": 0,
                    "terminate_called": 0,
                    "exit_codes": {},
                }
                for k in kinds
            },
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        }
        for i in range(ns.runs):
            for kind, (script, args) in kinds.items():
                cwd = tmp / "cwd"
                shutil.rmtree(cwd, ignore_errors=True)
                cwd.mkdir()
                t0 = time.monotonic()
                rc, terminates, text = run_once(
                    script, args, cwd, ns.timeout, ns.diagnose
                )
                r = result["kinds"][kind]
                r["runs"] += 1
                r["nonzero_exit"] += rc != 0
                r["terminate_called"] += terminates > 0
                r["exit_codes"][str(rc)] = r["exit_codes"].get(str(rc), 0) + 1
                bad = rc != 0 or terminates
                print(
                    f"{i + 1:4d} {kind:32s} rc={rc} terminate={terminates} {time.monotonic() - t0:5.1f}s{'  <-- FAIL' if bad else ''}",
                    flush=True,
                )
                if bad and ns.keep_logs:
                    ns.keep_logs.mkdir(parents=True, exist_ok=True)
                    (ns.keep_logs / f"{kind}_{i + 1}.log").write_text(text)
                    for core in list(cwd.glob("core*"))[:2]:
                        shutil.move(core, ns.keep_logs / f"{kind}_{i + 1}.{core.name}")
                result["finished"] = time.strftime(
                    "%Y-%m-%d %H:%M:%S UTC", time.gmtime()
                )
                ns.out.parent.mkdir(parents=True, exist_ok=True)
                ns.out.write_text(json.dumps(result, indent=1) + "\n")
        total = sum(r["runs"] for r in result["kinds"].values())
        failed = sum(r["nonzero_exit"] for r in result["kinds"].values())
        print(f"{total} runs, {failed} with a non-zero exit code")
        sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
