"""Run SCRIPT N times as 2 gloo ranks with torchrun's environment variables but without the
torchrun agent (a third of the CPU of a torchrun run on 2 shared cores); count the ranks that
exit non-zero or print "terminate called" (each run: PYTHONFAULTHANDLER=1).

    python bench/teardown/pair_runs.py bench/teardown/gil_race.py 15 --no-destroy
"""

import os
import socket
import subprocess
import sys
import time

script, n, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
aborts = bad = 0
t0 = time.time()
for i in range(n):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    procs = []
    for r in range(2):
        env = dict(
            os.environ,
            RANK=str(r),
            LOCAL_RANK=str(r),
            WORLD_SIZE="2",
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            CUDA_VISIBLE_DEVICES="",
            PYTHONFAULTHANDLER="1",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, script, *extra],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    for r, p in enumerate(procs):
        out, _ = p.communicate(timeout=300)
        if p.returncode != 0 or "terminate called" in out:
            bad += 1
            aborts += p.returncode == -6
            print(
                f"run {i + 1} rank {r} exit {p.returncode}: "
                + " | ".join(
                    l for l in out.splitlines() if "terminate" in l or "Error" in l
                )[:300],
                flush=True,
            )
print(
    f"{script} {' '.join(extra)}: {n} runs, {bad} ranks failed, {aborts} by SIGABRT, {time.time() - t0:.0f} s",
    flush=True,
)
