"""The teardown abort of bench/teardown/results.txt on purpose: a gloo work whose thread-local
state holds a Python object (as every DDP all-reduce launched inside backward does in torch
2.13), freed by a gloo worker while the rank runs straight to the end of the script holding the
GIL.

    python bench/teardown/pair_runs.py bench/teardown/gil_race.py 15 --no-destroy
    python bench/teardown/pair_runs.py bench/teardown/gil_race.py 15 --no-destroy --last-allreduce

Each run does 20 all-reduces the way backward does (stash a Python object in the thread-local
state, collective, remove), then ends; --last-allreduce adds the last all_reduce that was tried as a
teardown and reverted (it does not prevent the abort), --no-destroy leaves out
destroy_process_group (which happens to give the GIL away here), --sleep sleeps 0.2 s at the end.
"""

import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
grad = torch.zeros(1000)
for _ in range(20):
    # what torch/autograd/graph.py's _engine_run_backward does around every backward
    torch._C._stash_obj_in_tls("context", object())
    dist.all_reduce(grad)
    torch._C._remove_obj_from_tls("context")
if "--last-allreduce" in sys.argv:
    ddp_done = torch.zeros(1)
    dist.all_reduce(ddp_done)  # the reverted teardown
if "--sleep" in sys.argv:
    time.sleep(0.2)  # the GIL and the CPU are free for gloo's threads
if "--no-destroy" not in sys.argv:
    dist.destroy_process_group()
