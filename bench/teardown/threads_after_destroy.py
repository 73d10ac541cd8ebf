"""What destroy_process_group leaves running under gloo once DDP has used the group.

    torchrun --standalone --nproc_per_node=2 bench/teardown/threads_after_destroy.py

Prints, per rank, the Python references to the default group before/after DDP and after
destroy_process_group, and the process's thread names after destroy (with the DDP model deleted
and collected). Without DDP the gloo threads are gone after destroy; with DDP they stay
(pt_gloo_runloop x2, gloo_tcp_loop) until the process exits.
"""

import gc
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def threads():
    return sorted(
        open(f"/proc/self/task/{t}/comm").read().strip()
        for t in os.listdir("/proc/self/task")
    )


use_ddp = "--no-ddp" not in sys.argv
dist.init_process_group("gloo")
rank = dist.get_rank()
pg = dist.group.WORLD
print(rank, "refs to the group after init", sys.getrefcount(pg), flush=True)
if use_ddp:
    model = DDP(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
    del model, opt
    gc.collect()
    print(
        rank,
        "refs to the group after DDP, deleted and collected",
        sys.getrefcount(pg),
        flush=True,
    )
dist.destroy_process_group()
print(rank, "refs to the group after destroy", sys.getrefcount(pg), flush=True)
del pg
gc.collect()
print(
    rank,
    "ddp" if use_ddp else "no ddp",
    "threads after destroy:",
    threads(),
    flush=True,
)
