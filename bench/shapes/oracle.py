"""The oracle: converts a generated program with the ddpify CLI, runs the original as one process
and the conversion as 2 gloo ranks under torchrun (CUDA hidden), each with the recorder
(recorder/sitecustomize.py) on PYTHONPATH, and judges the conversion from what the processes did.
It does not import ddpify and does not read what the scripts print; ddpify is only a subprocess
(`python -m ddpify`, whichever is on the path), for the conversion and for verify's verdict.

Verdicts: correct, wrong (ddpify exited 0 and a check failed), refused (ddpify exited 2 with a
blocking finding), crash (ddpify exited 2 with an error of its own, or produced no JSON),
invalid (the original itself failed: a generator bug, not the converter's)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECORDER = HERE / "recorder"
NPROC = 2

# How the original and the ranks are started: forked from a server that imported torch once
# (launcher.py: the ranks get torchrun's environment), or with the real torchrun.
USE_TORCHRUN = False
_local = threading.local()
_launchers: list = []


def _launcher():
    from launcher import Launcher

    if getattr(_local, "launcher", None) is None or _local.launcher.closed:
        _local.launcher = Launcher(_clean_env())
        _launchers.append(_local.launcher)
    return _local.launcher


def close_launchers() -> None:
    while _launchers:
        _launchers.pop().close()


def _start(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    nproc: int,
    timeout: float,
    logdir: Path,
) -> tuple[int | None, str]:
    """(exit status, None on a hang; stderr of the ranks): `python ARGV` or NPROC ranks."""
    if USE_TORCHRUN:
        if nproc == 1:
            rc, out, err, _ = _run([sys.executable, *argv], cwd, env, timeout)
            return rc, err
        launch = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
        ]
        args = ["--module", *argv[1:]] if argv[0] == "-m" else list(argv)
        rc, out, err, _ = _run(launch + args, cwd, env, timeout)
        return rc, err
    reply = _launcher().run(argv, cwd, env, nproc, timeout, logdir)
    if reply.get("error"):
        return 1, reply["error"]
    err = "".join(
        f"[rank{i}] {r['stderr']}" if nproc > 1 else r["stderr"]
        for i, r in enumerate(reply["ranks"])
    )
    if reply["timed_out"]:
        return None, err
    rc = next((r["rc"] for r in reply["ranks"] if r["rc"] != 0), 0)
    return rc, err


# the checks, in the order a reason lists them (the first failing one names the failure)
CHECKS = [
    "exit",
    "hang",
    "params",
    "steps",
    "batches",
    "datasets",
    "coverage",
    "writers",
    "saved",
    "load",
]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            (
                "SHAPES_",
                "TORCHELASTIC",
                "RANK",
                "LOCAL_RANK",
                "WORLD_SIZE",
                "MASTER_",
                "GROUP_",
                "ROLE_",
            )
        )
    }
    env.pop("PYTHONPATH", None)
    env.update(
        CUDA_VISIBLE_DEVICES="",
        PYTHONDONTWRITEBYTECODE="1",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PYTHONWARNINGS="ignore",
    )
    env.update(extra)
    return env


def _run(
    cmd: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> tuple[int | None, str, str, float]:
    """(exit status or None on timeout, stdout, stderr, seconds); the whole process group is
    killed on timeout."""
    t0 = time.time()
    p = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err, time.time() - t0
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
        return None, out, err, time.time() - t0


def _records(d: Path) -> list[dict]:
    out = []
    for f in sorted(d.glob("*.json")):
        try:
            out.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            pass
    return out


def convert(conv: Path, entry_file: str, timeout: float = 300) -> dict:
    """Runs `python -m ddpify --json ENTRY` in place; returns exit code, outcome, codes."""
    rc, out, err, secs = _run(
        [sys.executable, "-m", "ddpify", "--json", entry_file],
        conv,
        dict(os.environ),
        timeout,
    )
    res: dict = {
        "exit": rc,
        "seconds": round(secs, 1),
        "codes": [],
        "blocking": [],
        "outcomes": {},
        "errors": [],
    }
    try:
        doc = json.loads(out)
    except ValueError:
        res["errors"].append((err or out or "no output")[-2000:])
        return res
    for f in doc.get("files", []):
        rel = os.path.relpath(f.get("path", ""), conv)
        res["outcomes"][rel] = f.get("outcome")
        for fd in f.get("findings", []):
            res["codes"].append(fd.get("code"))
            if fd.get("severity") == "blocking":
                res["blocking"].append(
                    f"{fd.get('code')} {rel}:{fd.get('line')}: {fd.get('message', '')[:300]}"
                )
        for e in f.get("errors", []) or []:
            res["errors"].append(str(e)[:2000])
    res["codes"] = sorted(set(c for c in res["codes"] if c))
    return res


def _rel(p: str, root: Path) -> str | None:
    try:
        r = os.path.relpath(p, root)
    except ValueError:
        return None
    if r.startswith("..") or "__pycache__" in r:
        return None
    return r


def _norm(rel: str) -> str:
    """Paths that differ only by numbers (a time-named run folder, an epoch) are the same file."""
    return re.sub(r"\d+", "#", rel)


def _files_written(rec: dict, root: Path) -> set[str]:
    out = set()
    for p, _how in rec.get("writes", []):
        if p == os.devnull:
            continue
        r = _rel(p, root)
        if r is not None:
            out.add(r)
    return out


def _walk_flags(s, path="") -> list[str]:
    """`module.` prefixes and DDP classes anywhere in a loadcheck summary."""
    bad = []
    if isinstance(s, dict) and "D" in s:
        for k, v in s["D"].items():
            if k.startswith("module."):
                bad.append(f"key {k!r} has the `module.` prefix")
                break
        for k, v in s["D"].items():
            bad += _walk_flags(v, f"{path}[{k!r}]")
    elif isinstance(s, list) and s and s[0] == "M":
        if "DistributedDataParallel" in s[1] or "parallel.distributed" in s[1]:
            bad.append(f"{path or 'the file'} holds a pickled {s[1]}")
        bad += _walk_flags(s[2], path)
    elif isinstance(s, list) and s and s[0] == "L":
        for i, v in enumerate(s[1]):
            bad += _walk_flags(v, f"{path}[{i}]")
    return bad


def _loadcheck(
    jobs: list[tuple[Path, list[str]]], logdir: Path, timeout: float = 120
) -> list[dict]:
    """Each (project folder, files) loaded in a plain process of its own, all in one run."""
    if not any(files for _, files in jobs):
        return [{} for _ in jobs]
    cmd = [str(HERE / "loadcheck.py")]
    for root, files in jobs:
        cmd += ["--root", str(root), *files]
    if USE_TORCHRUN:
        rc, out, err, _ = _run([sys.executable, *cmd], HERE, _clean_env(), timeout)
    else:
        _start(cmd, HERE, _clean_env(), 1, timeout, logdir)
        out, err = (
            (logdir / "rank0.out").read_text(),
            (logdir / "rank0.err").read_text(),
        )
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [
            {
                f: {"ok": False, "error": f"loadcheck failed: {(err or '')[-300:]}"}
                for f in files
            }
            for _, files in jobs
        ]


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


def run_program(
    prog, work: Path, verify: bool = True, timeout: float = 150, converter=None
) -> dict:
    """Everything about one generated program; `work` is an empty folder it may fill.
    `converter(conv_dir, entry_file)` replaces ddpify (the oracle's own tests plant conversions)."""
    work = Path(work)
    src, orig, conv = work / "src", work / "orig", work / "conv"
    prog.write(src)
    shutil.copytree(src, orig)
    shutil.copytree(src, conv)
    res: dict = {
        "dims": prog.dims,
        "argv": prog.argv,
        "entry": prog.entry_file,
        "expect_steps": prog.steps,
        "loop": prog.loop,
    }

    # the original, one process
    rec_o = work / "rec_orig"
    rec_o.mkdir()
    env = _clean_env(
        PYTHONPATH=str(RECORDER), SHAPES_RECORD_DIR=str(rec_o), SHAPES_ROLE="single"
    )
    t0 = time.time()
    rc, err = _start(prog.argv, orig, env, 1, timeout, work / "logs_orig")
    res["original"] = {"exit": rc, "seconds": round(time.time() - t0, 1)}
    orecs = _records(rec_o)
    if rc != 0 or len(orecs) != 1:
        res.update(
            verdict="invalid",
            reason=f"the original failed (exit {rc}): {err[-1500:]}",
            failed=["original"],
        )
        return res
    orec = orecs[0]

    # the conversion
    c = (converter or convert)(conv, prog.entry_file)
    res["ddpify"] = c
    if c["exit"] == 2 and c["blocking"]:
        res.update(verdict="refused", reason="; ".join(c["blocking"])[:2000], failed=[])
        return res
    if c["exit"] != 0:
        why = "; ".join(c["errors"]) or f"exit {c['exit']}"
        res.update(
            verdict="crash", reason=f"ddpify failed: {why}"[:3000], failed=["ddpify"]
        )
        return res
    if verify:
        shutil.copytree(conv, work / "verify_src")

    # the conversion, 2 gloo ranks under torchrun
    rec_c = work / "rec_conv"
    rec_c.mkdir()
    env = _clean_env(
        PYTHONPATH=str(RECORDER), SHAPES_RECORD_DIR=str(rec_c), SHAPES_ROLE="ranks"
    )
    t0 = time.time()
    rc, err = _start(prog.argv, conv, env, NPROC, timeout, work / "logs_conv")
    res["converted"] = {
        "exit": rc,
        "seconds": round(time.time() - t0, 1),
        "stderr_tail": err[-2500:],
        "launcher": "torchrun" if USE_TORCHRUN else "fork",
    }
    recs = {r["rank"]: r for r in _records(rec_c) if r.get("rank") is not None}
    failed: dict[str, str] = {}

    if rc is None:
        failed["hang"] = f"the converted run did not finish in {timeout:.0f} s (hang)"
    elif rc != 0:
        errs = "; ".join(
            f"rank {r}: {recs[r]['error']}"
            for r in sorted(recs)
            if recs[r].get("error")
        )
        tail = err.strip().splitlines()[-1] if err.strip() else ""
        failed["exit"] = f"exit {rc}" + (f" ({errs})" if errs else f" ({tail[:300]})")
    missing = [r for r in range(NPROC) if r not in recs]
    if missing and "hang" not in failed:
        failed.setdefault(
            "exit", f"rank(s) {missing} left no record (killed, or died at exit)"
        )
    r0, r1 = recs.get(0), recs.get(1)
    if r0 and r1:
        # parameters in sync
        if len(r0["checksums"]) != len(r1["checksums"]):
            failed["params"] = (
                f"the ranks stepped different numbers of optimizers ({len(r0['checksums'])} vs {len(r1['checksums'])})"
            )
        else:
            for i, (a, b) in enumerate(zip(r0["checksums"], r1["checksums"])):
                if not (_close(a[0], b[0]) and _close(a[1], b[1])):
                    failed["params"] = (
                        f"optimizer {i}'s parameters differ across ranks after training "
                        f"(sum {a[0]:.6g} vs {b[0]:.6g}): the replicas are not synchronised"
                    )
                    break
        # optimizer steps
        so = orec["steps"]
        if r0["steps"] != r1["steps"]:
            failed["steps"] = (
                f"optimizer steps differ across ranks: {r0['steps']} vs {r1['steps']}"
            )
        elif not so:
            pass
        elif len(r0["steps"]) != len(so):
            failed["steps"] = (
                f"the original stepped {len(so)} optimizer(s), each rank {len(r0['steps'])}"
            )
        else:
            for i, (o, r) in enumerate(zip(so, r0["steps"])):
                if prog.steps == "halved":
                    ok = o / 2 - 1 - 0.1 * o <= r <= o / 2 + 1 + 0.1 * o
                    want = f"about {o / 2:g} (half of {o}: an epoch over sharded data)"
                elif prog.steps == "equal":
                    ok = abs(r - o) <= 1 + 0.1 * o
                    want = f"about {o} (a fixed number of steps, or full batches sharded by rows)"
                else:
                    ok = r >= 1
                    want = "at least 1"
                if not ok:
                    failed["steps"] = (
                        f"optimizer {i} stepped {r} times per rank, expected {want}"
                    )
                    break
        # batches
        b0 = [h for _, h, _ in r0["batches"]]
        b1 = [h for _, h, _ in r1["batches"]]
        if b0 and b0 == b1:
            failed["batches"] = (
                f"both ranks trained on the same {len(b0)} batches in the same order: the data is not sharded"
            )
        d0, d1 = r0.get("datasets", []), r1.get("datasets", [])
        if d0 and d1 and d0 != d1:
            failed["datasets"] = (
                "the ranks' DataLoaders read different data sets (first items differ): each rank made its own data"
            )
        # every training sample seen once per epoch across the ranks, as in the original
        if (
            prog.seeded_data
            and prog.loop == "epochs"
            and prog.steps in ("halved", "equal")
        ):
            seen_o = set(orec["rows"])
            seen_c = set(r0["rows"]) | set(r1["rows"])
            if seen_o and seen_c != seen_o:
                miss, extra = len(seen_o - seen_c), len(seen_c - seen_o)
                failed["coverage"] = (
                    f"the ranks together trained on other samples than the original "
                    f"({miss} of {len(seen_o)} never seen, {extra} not in the original's data)"
                )
        # one writer per file
        w0, w1 = _files_written(r0, conv), _files_written(r1, conv)
        both = sorted({_norm(p) for p in w0} & {_norm(p) for p in w1})
        if both:
            failed["writers"] = f"written by both ranks: {', '.join(both[:5])}"
        # what the original saved with torch.save is saved by the conversion, and loads the same
        saved_o = {}
        for p in orec["saved"]:
            r = _rel(p, orig)
            if r:
                saved_o[_norm(r)] = r
        saved_c = {}
        for rec in (r0, r1):
            for p in rec["saved"]:
                r = _rel(p, conv)
                if r and os.path.exists(conv / r):
                    saved_c.setdefault(_norm(r), r)
        lost = sorted(set(saved_o) - set(saved_c))
        if lost:
            failed["saved"] = (
                f"saved by the original, not by the conversion: {', '.join(saved_o[k] for k in lost[:5])}"
            )
        pairs = [
            (saved_o[k], saved_c[k])
            for k in sorted(set(saved_o) & set(saved_c))
            if os.path.exists(orig / saved_o[k])
        ]
        lo, lc = _loadcheck(
            [(orig, [a for a, _ in pairs]), (conv, [b for _, b in pairs])],
            work / "logs_load",
        )
        problems = []
        for a, b in pairs:
            A, B = lo.get(a, {}), lc.get(b, {})
            if not B.get("ok"):
                problems.append(
                    f"{b} does not load in a plain process: {B.get('error', '?')[:200]}"
                )
                continue
            flags = _walk_flags(B["summary"])
            if flags:
                problems.append(f"{b}: {flags[0]}")
            elif A.get("ok") and A["summary"] != B["summary"]:
                problems.append(f"{b} holds another structure than the original's {a}")
        if problems:
            failed["load"] = "; ".join(problems[:3])
        res["records"] = {
            "original": {
                "steps": so,
                "saved": sorted(saved_o.values()),
                "batches": len(orec["batches"]),
            },
            "ranks": {
                r: {
                    "steps": recs[r]["steps"],
                    "batches": len(recs[r]["batches"]),
                    "writes": sorted(_files_written(recs[r], conv))[:20],
                    "recorder_errors": recs[r].get("recorder_errors", [])[:3],
                }
                for r in sorted(recs)
            },
        }
    order = [k for k in CHECKS if k in failed]
    res["failed"] = order
    if order:
        res.update(verdict="wrong", reason="; ".join(failed[k] for k in order))
    else:
        res.update(verdict="correct", reason="")
    if verify:
        res["verify"] = run_verify(prog, work / "verify_src")
    return res


def run_verify(prog, root: Path, timeout: float = 400) -> dict:
    """`ddpify verify --no-convert` on the converted copy, to its end, 2 gloo processes."""
    script_args = list(prog.argv[2:] if prog.argv[0] == "-m" else prog.argv[1:])
    jpath = root.parent / "verify.json"
    cmd = [
        sys.executable,
        "-m",
        "ddpify",
        "verify",
        "--no-convert",
        prog.entry_file,
        "--nproc",
        str(NPROC),
        "--to-end",
        "--no-baseline",
        "--backend",
        "gloo",
        "--json",
        str(jpath),
    ]
    if script_args:
        cmd += ["--", *script_args]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [env.get("PYTHONPATH", ""), str(root)] if p
    )
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", NO_COLOR="1")
    rc, out, err, secs = _run(cmd, root, env, timeout)
    v: dict = {"exit": rc, "seconds": round(secs, 1)}
    try:
        doc = json.loads(jpath.read_text())
        v["failed"] = [
            c.get("name") for c in doc.get("checks", []) if c.get("status") == "FAIL"
        ]
        v["verdict_line"] = (doc.get("verdict") or doc.get("error") or "")[:400]
    except (OSError, ValueError):
        v["failed"] = []
        v["verdict_line"] = (out + err)[-400:]
    v["verdict"] = {0: "pass", 1: "fail"}.get(
        rc, "error" if rc is not None else "timeout"
    )
    return v


def disagreement(res: dict) -> str | None:
    """Where verify and the oracle disagree (a verify bug or an oracle bug)."""
    v = res.get("verify")
    if not v or res["verdict"] not in ("correct", "wrong"):
        return None
    if res["verdict"] == "correct" and v["verdict"] != "pass":
        return f"oracle: correct; verify: {v['verdict']} ({', '.join(v.get('failed') or []) or v.get('verdict_line', '')[:200]})"
    if res["verdict"] == "wrong" and v["verdict"] == "pass":
        return f"oracle: wrong ({', '.join(res['failed'])}); verify: pass"
    return None


def signature(res: dict) -> tuple[str, str]:
    """How a case fails: its verdict and its first failing check (for the shrinker)."""
    if res["verdict"] == "crash":
        m = re.search(r"(\w+Error|\w+Exception)", res.get("reason", ""))
        return ("crash", m.group(1) if m else "")
    if res["verdict"] == "wrong":
        first = res["failed"][0]
        if first == "exit":
            # a crash: which error (names and numbers of the script left out)
            m = re.search(r"(\w+(?:Error|Exception)): ([^;()]*)", res.get("reason", ""))
            if m:
                msg = re.sub(r"'[^']*'|\[[^\]]*\]|\d+", "?", m.group(2))[:60].strip()
                return ("wrong", f"exit: {m.group(1)}: {msg}")
        return ("wrong", first)
    return (res["verdict"], "")
