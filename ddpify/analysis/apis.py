"""Is the script distributed already (init_process_group, DDP, FSDP, accelerate, Lightning,
DeepSpeed, Horovod, mp.spawn), or distributed the legacy way (apex, a --local_rank flag that
only torch.distributed.launch fills)?
"""

from __future__ import annotations

import libcst as cst

DISTRIBUTED_APIS = (
    "torch.distributed.init_process_group",
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.multiprocessing.spawn",
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_shard",
    "accelerate.Accelerator",
    "lightning.Trainer",
    "lightning.pytorch.Trainer",
    "pytorch_lightning.Trainer",
    "deepspeed.initialize",
    "horovod.torch.init",
)
LEGACY_APIS = ("apex.amp", "apex.parallel", "apex.optimizers")


class ApisMixin:
    def _find_api(self, names: tuple[str, ...]) -> cst.CSTNode | None:
        exact, under = set(names), tuple(n + "." for n in names)  # q == n or q.startswith(n + ".")
        for c in self.calls:
            for q in self.qualified(c.func):
                if q in exact or q.startswith(under):
                    return c
        for node in self.attributes:
            for q in self.qualified(node):
                if q in exact or q.startswith(under):
                    return node
        return None

    def _local_rank_flag(self) -> cst.CSTNode | None:
        for c in self.calls:
            if isinstance(c.func, cst.Attribute) and c.func.attr.value == "add_argument":
                flags = [a.value.evaluated_value for a in c.args if a.keyword is None and isinstance(a.value, cst.SimpleString)]
                if "--local_rank" in flags or "--local-rank" in flags:
                    return c
        return None
