"""verify on planted wrong conversions: six single-process scripts, each with a hand-made
conversion that is wrong in one way a user would not see at the default steps of a CPU run, and
its control (the same conversion with that one thing right). A planted conversion is flagged when
verify fails the check that names its cause; a control passes when verify exits 0.

    python bench/verify_planted/run.py [--out bench/verify_planted/results.md]

The scripts are tests/verify_cases/late/ and tests/verify_cases/projects/shared_load*/ (the tests
in tests/test_verify_late.py run the same pairs). Each run is `ddpify verify`'s default length
(two passes over each rank's shard), 2 gloo processes, the one-process baseline.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
CASES = ROOT / "tests" / "verify_cases"
LATE = CASES / "late"

# (name, original, conversion, its wrong line(s), the right ones, the check that must fail, what it plants)
PLANTED = [
    (
        "progress-bar counter",
        "pbar_single.py",
        "pbar_ddp.py",
        "        epoch_loss = total / pbar.n\n",
        "        epoch_loss = total / len(loader)\n",
        "ranks",
        "a rank divides by the counter of the progress bar it disabled, at the end of the epoch (24 batches a rank)",
    ),
    (
        "triton kernel",
        "triton_single.py",
        "triton_ddp.py",
        "        if RANK == 0:\n            tl.store(out_ptr + offs, x * scale, mask=mask)\n",
        "        tl.store(out_ptr + offs, x * scale, mask=mask)\n",
        "gpu-paths",
        "a rank-0 guard inside a @triton.jit kernel; the CPU run takes the torch path (no triton)",
    ),
    (
        "momentum encoder",
        "momentum_single.py",
        "momentum_ddp.py",
        "            if rank == 0:\n                momentum_update(key_encoder, query_encoder, 0.9)\n                if step % 4 == 0:\n",
        "            momentum_update(key_encoder, query_encoder, 0.9)\n            if rank == 0:\n                if step % 4 == 0:\n",
        "model-state",
        "the momentum encoder updated on rank 0 only; the trained encoder stays in sync",
    ),
    (
        "torchrun only",
        "setup_single.py",
        "torchrun_only_ddp.py",
        '    local_rank = int(os.environ["LOCAL_RANK"])\n    dist.init_process_group("gloo")\n',
        '    local_rank = int(os.environ.get("LOCAL_RANK", 0))\n    if "RANK" in os.environ:\n        dist.init_process_group("gloo")\n'
        '    else:  # plain python: a world of one\n        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)\n',
        "one-process",
        "the set-up reads LOCAL_RANK unconditionally: only torchrun can start it",
    ),
    (
        "end-of-epoch evaluation",
        "eval_single.py",
        "eval_rank0_ddp.py",
        "            acc = evaluate(ddp_model, DataLoader(val, batch_size=8))\n",
        "            acc = evaluate(model, DataLoader(val, batch_size=8))\n",
        "no-hang",
        "rank 0 evaluates through the DDP model at the end of each epoch (24 batches a rank)",
    ),
]
BARRIER_BUG = "    dist.barrier()  # rank 0 saved the checkpoint: wait for it\n"
BARRIER_FIX = "    if dist.is_initialized():\n        dist.barrier()  # rank 0 saved the checkpoint: wait for it\n"


def _verify(original: Path, converted: str, out: Path, timeout: float = 120.0) -> tuple:
    from ddpify import Result
    from ddpify.verify import run_verify

    def converter(source, options, path):
        return Result(source=converted, changed=True, status="converted")

    lines: list[str] = []
    outcome = run_verify(str(original), ["--out", str(out)], nproc=2, backend="gloo", timeout=timeout,
                         echo=lines.append, converter=converter)  # fmt: skip
    return outcome, "\n".join(lines)


def _project(model_text: str, work: Path) -> tuple:
    """The project with the hand-made conversion of its train.py and model.py."""
    import ddpify.project
    from ddpify.project import FileResult, ProjectResult
    from ddpify.verify import run_verify

    root = work / "repo"
    shutil.copytree(CASES / "projects" / "shared_load", root)
    converted = {
        "train.py": (
            CASES / "projects" / "shared_load_converted" / "train.py"
        ).read_text(),
        "model.py": model_text,
    }

    def convert_project(entry, options=None, read=None):
        files = [FileResult(str(root / n), (root / n).read_text(), converted.get(n, (root / n).read_text()))
                 for n in ("train.py", "model.py", "infer.py")]  # fmt: skip
        return ProjectResult(str(root / "train.py"), str(root), "converted", files)

    saved, ddpify.project.convert_project = (
        ddpify.project.convert_project,
        convert_project,
    )
    here = os.getcwd()
    os.chdir(root)
    try:
        lines: list[str] = []
        outcome = run_verify(str(root / "train.py"), ["--out", str(work)], nproc=2, backend="gloo", timeout=120.0,
                             echo=lines.append)  # fmt: skip
    finally:
        os.chdir(here)
        ddpify.project.convert_project = saved
    return outcome, "\n".join(lines)


def _row(name, what, expect, planted, control, seconds) -> dict:
    failed = [c for c in planted.checks if c.status == "FAIL"]
    hit = next((c for c in failed if c.name == expect), None)
    return {
        "name": name,
        "what": what,
        "expect": expect,
        "flagged": hit is not None,
        "failed": ", ".join(c.name for c in failed) or "none",
        "cause": ((hit or (failed[0] if failed else None)).cause or "")
        if failed
        else "",
        "control": "pass"
        if control.exit_code == 0
        else "FAIL " + ", ".join(c.name for c in control.checks if c.status == "FAIL"),
        "seconds": round(seconds),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent / "results.md"))
    args = ap.parse_args()
    rows = []
    for name, original, planted, bug, fix, expect, what in PLANTED:
        text = (LATE / planted).read_text()
        assert bug in text, name
        t0 = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            os.chdir(tmp)
            bad, _ = _verify(
                LATE / original, text, Path(tmp), 30.0 if expect == "no-hang" else 120.0
            )
            good, _ = _verify(LATE / original, text.replace(bug, fix), Path(tmp))
            os.chdir(ROOT)
        rows.append(_row(name, what, expect, bad, good, time.time() - t0))
        print(rows[-1], flush=True)
    model = (CASES / "projects" / "shared_load_converted" / "model.py").read_text()
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        bad, _ = _project(model, Path(tmp) / "bad")
        good, _ = _project(model.replace(BARRIER_BUG, BARRIER_FIX), Path(tmp) / "good")
    rows.append(_row("inference script", "a shared load() helper gets an unconditional dist.barrier(); infer.py --dry-run "
                     "calls it in a plain python process", "other-scripts", bad, good, time.time() - t0))  # fmt: skip
    print(rows[-1], flush=True)
    flagged = sum(r["flagged"] for r in rows)
    passed = sum(r["control"] == "pass" for r in rows)
    out = [
        "# verify on planted wrong conversions",
        "",
        "`python bench/verify_planted/run.py` (2 gloo processes on a 2-core CPU machine, default length)",
        "",
        f"- planted conversions flagged by the check that names their cause: {flagged}/{len(rows)}",
        f"- controls (the same conversion with that one thing right) passing: {passed}/{len(rows)}",
        "",
        "| case | planted | must fail | failed | cause | control | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cause = r["cause"].replace("|", "/").replace("\n", " ")[:300]
        out.append(
            f"| {r['name']} | {r['what']} | {r['expect']} | {r['failed']} | {cause} | {r['control']} | {r['seconds']} |"
        )
    Path(args.out).write_text("\n".join(out) + "\n")
    print(
        f"flagged {flagged}/{len(rows)}, controls passing {passed}/{len(rows)} -> {args.out}"
    )


if __name__ == "__main__":
    main()
