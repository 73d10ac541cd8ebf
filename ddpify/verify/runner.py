"""Start the baseline (one process) and the candidate (torchrun, N processes) under the probe.

Watches every rank's heartbeat; a rank that makes no progress for the timeout gets its Python
stack dumped (SIGUSR1 -> faulthandler), then every process of the run is killed. Every process a
run starts carries DDPIFY_VERIFY_RUN=<token> in its environment, and a final sweep kills whatever
still carries it, so nothing a verify run started outlives it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PROBE = str(Path(__file__).with_name("probe.py"))
POLL_S = 0.1
# Environment a parent launcher may have set; a verify run starts its own.
_DIST_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@dataclass
class RunResult:
    role: str  # "baseline" or "candidate"
    nproc: int
    run_dir: Path
    returncode: int | None = None
    wall_s: float = 0.0
    records: dict[int, dict] = field(default_factory=dict)
    heartbeats: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    outputs: dict[int, str] = field(default_factory=dict)
    launcher_output: str = ""
    # Set when a rank stalled: {"ranks": [...], "timeout": s, "stacks": {rank: text}}
    hang: dict | None = None
    pids: list[int] = field(default_factory=list)
    swept: int = 0  # stragglers the final sweep had to kill


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _set_parent_death_signal() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_env(run_dir: Path, steps: int, main_file: str, token: str, hide_gpus: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DIST_ENV and not k.startswith("TORCHELASTIC_")}
    env.update(
        DDPIFY_VERIFY_DIR=str(run_dir),
        DDPIFY_VERIFY_STEPS=str(steps),
        DDPIFY_VERIFY_MAIN_FILE=main_file,
        DDPIFY_VERIFY_RUN=token,
    )
    if hide_gpus:
        # The script then takes its CPU path, and with it gloo.
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def launch(
    role: str,
    exec_path: str,
    main_file: str,
    script_args: list[str],
    nproc: int,
    steps: int,
    timeout: float,
    run_dir: Path,
    token: str,
    hide_gpus: bool,
) -> RunResult:
    run_dir.mkdir(parents=True, exist_ok=True)
    env = run_env(run_dir, steps, main_file, token, hide_gpus)
    if role == "baseline":
        # One process, with the environment torchrun would give a group of one.
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        cmd = [sys.executable, PROBE, exec_path, *script_args]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "--max-restarts=0",
            PROBE,
            exec_path,
            *script_args,
        ]
    result = RunResult(role=role, nproc=nproc, run_dir=run_dir)
    log_path = run_dir / "launcher.out"
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_set_parent_death_signal,
        )
        try:
            _watch(proc, result, timeout, start)
        finally:
            # Whatever happened (hang, Ctrl-C, a bug here), nothing of this run survives it.
            result.swept = kill_run(token, proc)
    result.wall_s = time.monotonic() - start
    result.returncode = proc.returncode
    _collect(result)
    return result


def _watch(proc: subprocess.Popen, result: RunResult, timeout: float, start: float) -> None:
    last: dict[int, tuple[str | None, float]] = {r: (None, start) for r in range(result.nproc)}
    while proc.poll() is None:
        time.sleep(POLL_S)
        now = time.monotonic()
        stalled = []
        for r in range(result.nproc):
            prefix = result.run_dir / f"rank{r}"
            beat = _read(prefix.with_suffix(".hb"))
            if beat != last[r][0]:
                last[r] = (beat, now)
            if (prefix.with_suffix(".done")).exists():
                continue  # reached step K, waiting for the others: not stalled
            pid = _pid_of(prefix.with_suffix(".json"))
            if pid is not None and not _alive(pid):
                continue  # exited; torchrun will report it
            if now - last[r][1] > timeout:
                stalled.append(r)
        if stalled:
            result.hang = {"ranks": stalled, "timeout": timeout, "stacks": _dump_stacks(result)}
            return


def _dump_stacks(result: RunResult) -> dict[int, str]:
    pids = {}
    for r in range(result.nproc):
        pid = _pid_of(result.run_dir / f"rank{r}.json")
        if pid is not None and _alive(pid):
            pids[r] = pid
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
    stacks: dict[int, str] = {}
    deadline = time.monotonic() + 5
    sizes: dict[int, int] = {}
    while time.monotonic() < deadline:
        time.sleep(0.2)
        done = True
        for r in pids:
            path = result.run_dir / f"rank{r}.stack"
            size = path.stat().st_size if path.exists() else 0
            if size == 0 or sizes.get(r) != size:
                done = False
            sizes[r] = size
        if done:
            break
    for r in pids:
        stacks[r] = _read(result.run_dir / f"rank{r}.stack") or ""
    return stacks


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _pid_of(record_path: Path) -> int | None:
    try:
        return int(json.loads(record_path.read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True


def processes_of_run(token: str) -> list[int]:
    """Live processes whose environment carries this run's token (Linux /proc)."""
    marker = f"DDPIFY_VERIFY_RUN={token}".encode()
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if marker in env.split(b"\0") and _alive(int(entry)):
            found.append(int(entry))
    return found


def kill_run(token: str, proc: subprocess.Popen) -> int:
    killed = 0
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for _ in range(3):
        pids = processes_of_run(token)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    return killed


def _collect(result: RunResult) -> None:
    for r in range(result.nproc):
        prefix = result.run_dir / f"rank{r}"
        text = _read(prefix.with_suffix(".json"))
        if text:
            try:
                result.records[r] = json.loads(text)
                result.pids.append(result.records[r]["pid"])
            except ValueError:
                pass
        beat = _read(prefix.with_suffix(".hb"))
        if beat:
            try:
                s, b, n = (int(x) for x in beat.split()[:3])
                result.heartbeats[r] = (s, b, n)
            except ValueError:
                pass
        out = _read(prefix.with_suffix(".out"))
        if out is not None:
            result.outputs[r] = out[-6000:]
    result.launcher_output = (_read(result.run_dir / "launcher.out") or "")[-6000:]
