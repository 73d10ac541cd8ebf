"""Run training scripts as `python script.py`, or as N ranks with torchrun's environment,
forked from one process that has already imported torch.

Importing torch costs about 2 s per process; the fixture tests start ~250 processes. The
server imports torch once, runs no torch op (so no thread pool exists to break in a fork),
and forks one child per rank; a child runs the script with runpy as `__main__`, exactly as
`python script.py` would, with its own argv, cwd, environment and output files. A handful
of fixtures still run under the real torchrun (tests/test_fixture_runs.py).

Protocol: one JSON request per line on stdin, one JSON reply per line on stdout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class RankResult:
    returncode: int
    stdout: str
    stderr: str


@dataclass
class Run:
    ranks: list[RankResult]
    timed_out: bool

    @property
    def returncode(self) -> int:
        return next((r.returncode for r in self.ranks if r.returncode != 0), 0)

    @property
    def stdout(self) -> str:
        return "".join(r.stdout for r in self.ranks)

    @property
    def stderr(self) -> str:
        return "".join(
            f"[rank{i}] {line}\n"
            for i, r in enumerate(self.ranks)
            for line in r.stderr.splitlines()
        )


# -- client (pytest side) ----------------------------------------------------------------
class ForkRunner:
    def __init__(self, env: dict[str, str]) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._lock = threading.Lock()

    def run(
        self,
        script: Path,
        args: list[str],
        cwd: Path,
        nproc: int = 1,
        env: dict[str, str] | None = None,
        timeout: float = 300,
    ) -> Run:
        request = {
            "script": str(script),
            "args": args,
            "cwd": str(cwd),
            "nproc": nproc,
            "env": env or {},
            "timeout": timeout,
        }
        with self._lock:
            assert self._proc.stdin and self._proc.stdout
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the fork server died")
        reply = json.loads(line)
        return Run([RankResult(**r) for r in reply["ranks"]], reply["timed_out"])

    def close(self) -> None:
        if self._proc.stdin:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()


# -- server ------------------------------------------------------------------------------
def _child(
    script: str, args: list[str], cwd: str, env: dict[str, str], out: str, err: str
) -> None:
    code = 1
    try:
        for path, fd in ((out, 1), (err, 2)):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(f, fd)
            os.close(f)
        sys.stdin = open(os.devnull)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        # a fresh process starts its generators from seeds of its own: so does each fork
        # (torch's and numpy's would otherwise be the server's, the same on every rank)
        sys.modules["torch"].seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        import atexit
        import runpy
        import traceback

        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _serve_one(request: dict, base_env: dict[str, str]) -> dict:
    tmp = tempfile.mkdtemp(prefix="forkrun-")
    nproc = request["nproc"]
    pids = []
    files = []
    for rank in range(nproc):
        env = dict(base_env)
        env.update(request["env"])
        if nproc > 1:
            env.update(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(nproc),
                LOCAL_WORLD_SIZE=str(nproc),
                GROUP_RANK="0",
            )
        out, err = os.path.join(tmp, f"{rank}.out"), os.path.join(tmp, f"{rank}.err")
        files.append((out, err))
        pid = os.fork()
        if pid == 0:
            _child(request["script"], request["args"], request["cwd"], env, out, err)
        pids.append(pid)
    codes: dict[int, int] = {}
    deadline = time.monotonic() + request["timeout"]
    timed_out = False
    while len(codes) < nproc:
        for pid in pids:
            if pid in codes:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
                if codes[pid] != 0:  # like torchrun: one rank failing stops the others
                    deadline = min(deadline, time.monotonic() + 30)
        if len(codes) < nproc and time.monotonic() > deadline:
            timed_out = True
            for pid in pids:
                if pid not in codes:
                    os.kill(pid, signal.SIGKILL)
                    codes[pid] = -signal.SIGKILL
                    os.waitpid(pid, 0)
        time.sleep(0.02)
    ranks = []
    for pid, (out, err) in zip(pids, files):
        ranks.append(
            {
                "returncode": codes[pid],
                "stdout": Path(out).read_text(errors="replace"),
                "stderr": Path(err).read_text(errors="replace"),
            }
        )
        os.unlink(out)
        os.unlink(err)
    os.rmdir(tmp)
    return {"ranks": ranks, "timed_out": timed_out}


def main() -> None:
    import torch  # noqa: F401  imported once here, inherited by every fork

    # What every converted script imports; importing runs no torch op and starts no thread.
    # Not torch._dynamo (which DDP's constructor imports, ~1.7 s of CPU per process): with it
    # imported here, a legacy apex output (fixture 42, the group destroyed inside main() while its
    # DDP models live) hung its second rank at exit in 2 of 12 forks, 0 in 42 without it
    # (bench/teardown/fork_hang.txt).
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401
    import torch.utils.data.distributed  # noqa: F401

    base_env = dict(os.environ)
    for line in sys.stdin:
        reply = _serve_one(json.loads(line), base_env)
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
