"""Fixture NN's output as 2 forked ranks under verify's probe, N times, through a given copy of
tests/forkrun.py: counts the runs where a rank is still alive after 25 s (see fork_hang.txt).

    python bench/teardown/fork_hang_loop.py 42_ 12 tests fixtures
"""

import sys, os, time, socket, tempfile
from pathlib import Path

sys.path.insert(0, sys.argv[3])
from forkrun import ForkRunner
from ddpify.verify.runner import PROBE


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


fx = sys.argv[1]
n = int(sys.argv[2])
env0 = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER"))
}
env0["CUDA_VISIBLE_DEVICES"] = ""
env0["OMP_NUM_THREADS"] = "1"
r = ForkRunner(env0)
script = str(next(Path(sys.argv[4]).glob(fx + "*")) / "expected.py")
hung = 0
for i in range(n):
    d = Path(tempfile.mkdtemp())
    (d / "verify").mkdir()
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "DDPIFY_VERIFY_DIR": str(d / "verify"),
        "DDPIFY_VERIFY_STEPS": "1000000",
        "DDPIFY_VERIFY_MAIN_FILE": script,
    }
    t = time.time()
    run = r.run(Path(PROBE), [script], d, nproc=2, env=env, timeout=25)
    hung += run.timed_out
    print(
        i,
        "HUNG" if run.timed_out else "ok",
        [x.returncode for x in run.ranks],
        round(time.time() - t, 1),
        flush=True,
    )
print("hung", hung, "of", n)
r.close()
