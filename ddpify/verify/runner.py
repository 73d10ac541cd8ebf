"""Start the baseline (one process) and the candidate (torchrun, N processes) under the probe.

Watches every rank's heartbeat; a rank that makes no progress for the timeout gets its Python
stack dumped (SIGUSR1 -> faulthandler), then every process of the run is killed. Every process a
run starts carries DDPIFY_VERIFY_RUN=<token> in its environment, and a final sweep kills whatever
still carries it, so nothing a verify run started outlives it.
"""

from __future__ import annotations

import json
import os
import re
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
    role: str  # "baseline", "candidate", "single" (plain python) or "plain" (--optimize's reference)
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
    nnodes: int = 1
    # When the parent first saw each rank's process gone (time.time()), for ranks that died on their own.
    died_at: dict[int, float] = field(default_factory=dict)
    # faulthandler's dump of a rank killed by a fatal signal (a C++ abort, a segfault).
    fatal: dict[int, str] = field(default_factory=dict)
    # From torchrun's failure summary: {rank: {"exitcode": int, "signal": "SIGABRT" | None}}.
    exits: dict[int, dict] = field(default_factory=dict)
    max_gap: float = 0.0  # the longest time a rank went without progress (seconds)
    # each rank's last collective: (how many it entered, what, "path:line" of the script)
    collectives: dict[int, tuple[int, str, str]] = field(default_factory=dict)
    node_dirs: list[Path] = field(default_factory=list)

    @property
    def world(self) -> int:
        return self.nproc * self.nnodes


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


def run_env(
    run_dir: Path,
    steps: int,
    main_file: str,
    token: str,
    hide_gpus: bool,
    epochs: int | None = None,
) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _DIST_ENV and not k.startswith("TORCHELASTIC_")
    }
    env.update(
        DDPIFY_VERIFY_DIR=str(run_dir),
        DDPIFY_VERIFY_STEPS=str(steps),
        DDPIFY_VERIFY_MAIN_FILE=main_file,
        DDPIFY_VERIFY_RUN=token,
    )
    if epochs:
        env["DDPIFY_VERIFY_EPOCHS"] = str(epochs)
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
    *,
    nnodes: int = 1,
    epochs: int | None = None,
    progress=None,
    node_gpus: list[str] | None = None,
    extra_env: dict[str, str] | None = None,
) -> RunResult:
    """Run one side. `progress(result, stalled_for, steps_by_rank, final)` is called about every
    PROGRESS_S seconds while it runs, and once at its end."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = run_env(run_dir, steps, main_file, token, hide_gpus, epochs)
    env.update(extra_env or {})
    result = RunResult(role=role, nproc=nproc, run_dir=run_dir, nnodes=nnodes)
    if role in ("baseline", "single"):
        if role == "baseline":
            # One process, with the environment torchrun would give a group of one.
            env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        # "single": a plain `python script.py`, none of torchrun's variables
        cmds = [[sys.executable, PROBE, exec_path, *script_args]]
        cwds = [None]
    elif nnodes == 1:
        cmds = [[
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--max-restarts=0", PROBE, exec_path, *script_args,
        ]]  # fmt: skip
        cwds = [None]
    else:
        # Several torchrun agents on this host, one per "node", each in its own working directory
        # (its own disk), meeting through a c10d rendezvous on the loopback interface.
        port = free_port()
        cmds = [[
            sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
            f"--node-rank={i}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id=ddpify-{token[:12]}", "--max-restarts=0", PROBE, exec_path, *script_args,
        ] for i in range(nnodes)]  # fmt: skip
        result.node_dirs = [run_dir / f"node{i}" for i in range(nnodes)]
        cwds = result.node_dirs
    procs = []
    start = time.monotonic()
    try:
        for i, (cmd, cwd) in enumerate(zip(cmds, cwds)):
            if cwd is not None:
                cwd.mkdir(parents=True, exist_ok=True)
            log_path = run_dir / (
                "launcher.out" if len(cmds) == 1 else f"launcher{i}.out"
            )
            with open(log_path, "wb") as log:
                procs.append(
                    subprocess.Popen(
                        cmd,
                        cwd=cwd,
                        env=_node_env(env, i, nproc, node_gpus)
                        if len(cmds) > 1
                        else env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        preexec_fn=_set_parent_death_signal,
                    )
                )
        _watch(procs, result, timeout, start, progress)
    finally:
        # Whatever happened (hang, Ctrl-C, a bug here), nothing of this run survives it.
        result.swept = sum(kill_run(token, p) for p in procs)
    result.wall_s = time.monotonic() - start
    codes = [p.returncode for p in procs]
    result.returncode = next((c for c in codes if c), codes[0] if codes else None)
    _collect(result)
    if progress is not None:
        progress(result, 0.0, _steps_now(result), True)
    return result


PROGRESS_S = 5.0


def _node_env(
    env: dict[str, str], node: int, nproc: int, gpus: list[str] | None
) -> dict[str, str]:
    out = dict(env, DDPIFY_VERIFY_NODE=str(node))
    if gpus:
        # Each "node" has GPUs of its own, as real nodes do: LOCAL_RANK 0 is cuda:0 on every node.
        out["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[node * nproc : (node + 1) * nproc])
    return out


def _steps_now(result: RunResult) -> dict[int, int]:
    steps = {}
    for r in range(result.world):
        beat = _read(result.run_dir / f"rank{r}.hb")
        try:
            steps[r] = int(beat.split()[0]) if beat else 0
        except ValueError:
            steps[r] = 0
    return steps


def _watch(
    procs: list[subprocess.Popen],
    result: RunResult,
    timeout: float,
    start: float,
    progress=None,
) -> None:
    world = result.world
    last: dict[int, tuple[str | None, float]] = {r: (None, start) for r in range(world)}
    next_report = start + PROGRESS_S
    while any(p.poll() is None for p in procs):
        time.sleep(POLL_S)
        now = time.monotonic()
        stalled = []
        waiting = 0.0
        for r in range(world):
            prefix = result.run_dir / f"rank{r}"
            beat = _read(prefix.with_suffix(".hb"))
            if beat != last[r][0]:
                result.max_gap = max(result.max_gap, now - last[r][1])
                last[r] = (beat, now)
            if (prefix.with_suffix(".done")).exists():
                continue  # reached step K, waiting for the others: not stalled
            pid = _pid_of(prefix.with_suffix(".json"))
            if pid is not None and not _alive(pid):
                result.died_at.setdefault(r, time.time())
                continue  # exited; torchrun will report it
            waiting = max(waiting, now - last[r][1])
            if now - last[r][1] > timeout:
                stalled.append(r)
        if stalled:
            result.hang = {
                "ranks": stalled,
                "timeout": timeout,
                "stacks": _dump_stacks(result),
            }
            return
        if progress is not None and now >= next_report:
            next_report = now + PROGRESS_S
            progress(result, waiting, _steps_now(result), False)


def _dump_stacks(result: RunResult) -> dict[int, str]:
    pids = {}
    for r in range(result.world):
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


_FAILURE = re.compile(
    r"rank\s*:\s*(?P<rank>\d+).*?exitcode\s*:\s*(?P<code>-?\d+)[^\n]*?(?:\((?P<sig>SIG[A-Z]+)\))?\s*$",
    re.S | re.M,
)


def parse_failures(text: str) -> dict[int, dict]:
    """torchrun's failure summary: the exit code (negative: the signal) of every rank that failed."""
    out: dict[int, dict] = {}
    for block in re.split(r"\n\s*\[\d+\]:\s*\n", text)[1:]:
        m = _FAILURE.search(block)
        if m:
            code = int(m["code"])
            sig = m["sig"]
            if sig is None and code < 0:
                try:
                    sig = signal.Signals(-code).name
                except ValueError:
                    sig = f"signal {-code}"
            out.setdefault(int(m["rank"]), {"exitcode": code, "signal": sig})
    return out


def _collect(result: RunResult) -> None:
    for r in range(result.world):
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
        coll = _read(prefix.with_suffix(".coll"))
        if coll and coll.strip():
            parts = coll.strip().split("\t")
            if len(parts) == 3 and parts[0].isdigit():
                result.collectives[r] = (int(parts[0]), parts[1], parts[2].strip())
        out = _read(prefix.with_suffix(".out"))
        if out is not None:
            result.outputs[r] = out[-6000:]
        fatal = prefix.with_suffix(".fatal")
        text = _read(fatal)
        if text and text.strip():
            result.fatal[r] = text[-6000:]
            # faulthandler writes the dump as the signal arrives: the file's time is the time of death.
            result.died_at[r] = fatal.stat().st_mtime
    names = (
        ["launcher.out"]
        if result.nnodes == 1 or result.role == "baseline"
        else [f"launcher{i}.out" for i in range(result.nnodes)]
    )
    full = "\n".join(_read(result.run_dir / n) or "" for n in names)
    result.exits = parse_failures(full)
    result.launcher_output = full[-6000:]
