"""Runs a script as `python ARGV` or as N ranks with the environment torchrun gives them
(RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each a child forked
from a server that has already imported torch: torch's import costs seconds per process, and a
shapes run starts several processes per script.

A child is a fresh program as far as the script can tell: its own working directory, argv,
sys.path[0], environment, output files and process group, its random generators seeded anew
(as a new interpreter's are), the recorder installed when the environment asks for it, atexit
handlers run at the end. The server runs no torch operation, so no thread pool exists to break
in a fork. `oracle.py --torchrun` uses the real torchrun instead.

Protocol: one JSON request a line on stdin, one JSON reply a line on stdout."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


# -- client -------------------------------------------------------------------------------
class Launcher:
    def __init__(self, env: dict[str, str]) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=HERE,
        )
        self._lock = threading.Lock()
        self.closed = False

    def run(
        self,
        argv: list[str],
        cwd: Path,
        env: dict[str, str],
        nproc: int,
        timeout: float,
        logdir: Path,
    ) -> dict:
        """{'ranks': [{'rc', 'stdout', 'stderr'}], 'timed_out': bool}"""
        req = {
            "argv": argv,
            "cwd": str(cwd),
            "env": env,
            "nproc": nproc,
            "timeout": timeout,
            "logdir": str(logdir),
        }
        with self._lock:
            self._proc.stdin.write(json.dumps(req) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the launcher died")
        return json.loads(line)

    def close(self) -> None:
        self.closed = True
        try:
            self._proc.stdin.close()
            self._proc.wait(timeout=30)
        except Exception:
            self._proc.kill()


# -- server -------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    code = 1
    try:
        os.setsid()
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        fo = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        fe = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fo, 1)
        os.dup2(fe, 2)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        import random

        import numpy
        import torch

        random.seed()
        numpy.random.seed()
        torch.seed()
        import runpy

        if argv[0] == "-m":
            sys.argv = [argv[1]] + argv[2:]
            sys.path[0] = cwd
        else:
            script = os.path.abspath(argv[0])
            sys.argv = [argv[0]] + argv[1:]
            sys.path[0] = os.path.dirname(script)
        if env.get("SHAPES_RECORD_DIR"):
            sys.path.insert(1, str(HERE / "recorder"))
            import sitecustomize  # noqa: F401  (the recorder installs itself)

            sys.path.remove(str(HERE / "recorder"))
        try:
            if argv[0] == "-m":
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            c = exc.code
            code = c if isinstance(c, int) else (0 if c is None else 1)
            if c is not None and not isinstance(c, int):
                print(c, file=sys.stderr)
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve_one(req: dict) -> dict:
    nproc = req["nproc"]
    logdir = Path(req["logdir"])
    logdir.mkdir(parents=True, exist_ok=True)
    base = dict(req["env"])
    if nproc > 1:
        base.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(_free_port()),
            WORLD_SIZE=str(nproc),
            LOCAL_WORLD_SIZE=str(nproc),
            GROUP_RANK="0",
            ROLE_RANK="0",
            ROLE_WORLD_SIZE=str(nproc),
            TORCHELASTIC_RUN_ID="shapes",
        )
    pids = []
    for r in range(nproc):
        env = dict(base)
        if nproc > 1:
            env.update(RANK=str(r), LOCAL_RANK=str(r), GROUP_WORLD_SIZE="1")
        out, err = str(logdir / f"rank{r}.out"), str(logdir / f"rank{r}.err")
        pid = os.fork()
        if pid == 0:
            _child(req["argv"], req["cwd"], env, out, err)
        pids.append(pid)
    deadline = time.time() + req["timeout"]
    codes: dict[int, int] = {}
    timed_out = False
    while len(codes) < len(pids):
        for i, pid in enumerate(pids):
            if i in codes:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[i] = os.waitstatus_to_exitcode(status)
                # a rank that dies takes the others down, as torchrun does
                if codes[i] != 0:
                    for j, other in enumerate(pids):
                        if j not in codes:
                            _kill(other, signal.SIGTERM)
                            deadline = min(deadline, time.time() + 10)
        if len(codes) < len(pids) and time.time() > deadline:
            timed_out = True
            for i, pid in enumerate(pids):
                if i not in codes:
                    _kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    codes[i] = -9
        time.sleep(0.05)
    ranks = []
    for r in range(nproc):
        ranks.append(
            {
                "rc": codes[r],
                "stdout": _tail(logdir / f"rank{r}.out"),
                "stderr": _tail(logdir / f"rank{r}.err"),
            }
        )
    return {"ranks": ranks, "timed_out": timed_out}


def _kill(pid: int, sig: int) -> None:
    for target in (lambda: os.killpg(pid, sig), lambda: os.kill(pid, sig)):
        try:
            target()
            return
        except (ProcessLookupError, PermissionError):
            continue


def _tail(p: Path, n: int = 6000) -> str:
    try:
        return p.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def serve() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.utils.data  # noqa: F401

    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = _serve_one(json.loads(line))
        except Exception as exc:  # the server keeps serving
            reply = {
                "ranks": [],
                "timed_out": False,
                "error": f"{type(exc).__name__}: {exc}",
            }
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
