"""Is the script distributed already, and does it use apex?

Distributed means something that distributes: a process group, a DDP wrapper (torch's or
apex.parallel's), FSDP, mp.spawn, another framework's launcher or wrapper (Accelerate,
Lightning/Fabric, DeepSpeed, Horovod), or the legacy launcher's --local_rank used to pick the
device. apex amp, apex optimizers and apex SyncBatchNorm alone distribute nothing: plenty of
single-GPU scripts use them (apex's own README shows that use).
"""

from __future__ import annotations

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import call_args

DISTRIBUTED_APIS = (
    "torch.distributed.init_process_group",
    "torch.distributed.device_mesh.init_device_mesh",
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.multiprocessing.spawn",
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_shard",
    "torch.distributed.launcher.api.elastic_launch",
    "apex.parallel.DistributedDataParallel",
    "apex.parallel.distributed.DistributedDataParallel",
    "accelerate.Accelerator",
    "accelerate.notebook_launcher",
    "lightning.Trainer",
    "lightning.pytorch.Trainer",
    "pytorch_lightning.Trainer",
    "lightning.Fabric",
    "lightning.fabric.Fabric",
    "lightning_fabric.Fabric",
    "deepspeed.initialize",
    "deepspeed.init_distributed",
    "horovod.torch.init",
    "horovod.torch.DistributedOptimizer",
)
# apex parts a single-GPU script uses as well (mixed precision, fused optimizers, SyncBatchNorm)
APEX_APIS = (
    "apex.amp",
    "apex.parallel",
    "apex.optimizers",
    "apex.normalization",
    "apex.fp16_utils",
)
LEGACY_APIS = APEX_APIS  # the name older callers use
LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")
# where a rank picks its device
DEVICE_CALLS = ("torch.cuda.set_device", "torch.device", "torch.cuda.device")


class ApisMixin:
    def _find_api(self, names: tuple[str, ...]) -> cst.CSTNode | None:
        exact, under = (
            set(names),
            tuple(n + "." for n in names),
        )  # q == n or q.startswith(n + ".")
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
            if (
                isinstance(c.func, cst.Attribute)
                and c.func.attr.value == "add_argument"
            ):
                flags = [
                    a.value.evaluated_value
                    for a in c.args
                    if a.keyword is None and isinstance(a.value, cst.SimpleString)
                ]
                if any(f in LOCAL_RANK_FLAGS for f in flags):
                    return c
        return None

    def _launcher_device(self, flag: cst.Call | None) -> cst.CSTNode | None:
        """The call that picks a device from the legacy launcher's --local_rank (set_device(args.local_rank),
        torch.device("cuda", local_rank), .cuda(args.local_rank), device_ids=[args.local_rank]), or None."""
        if flag is None:
            return None
        _, kw = call_args(flag)
        dest = (
            kw["dest"].value.evaluated_value
            if "dest" in kw and isinstance(kw["dest"].value, cst.SimpleString)
            else "local_rank"
        )
        # the flag's value and the names bound from it one assignment away (local_rank = args.local_rank)
        names = {dest}
        for asg in self.assigns:
            if isinstance(asg, cst.Assign) and any(
                isinstance(n, cst.Attribute) and n.attr.value == dest
                for n in self.findall(asg.value, m.Attribute())
            ):
                for t in asg.targets:
                    if isinstance(t.target, cst.Name):
                        names.add(t.target.value)
                    elif isinstance(
                        t.target, cst.Subscript
                    ):  # cfg["local_rank"] = args.local_rank
                        key = getattr(t.target.slice[0].slice, "value", None)
                        if isinstance(key, cst.SimpleString):
                            names.add(key.evaluated_value)

        def reads(node: cst.CSTNode) -> bool:
            return any(
                (isinstance(n, cst.Attribute) and n.attr.value in names)
                or (isinstance(n, cst.Name) and n.value in names)
                or (isinstance(n, cst.SimpleString) and n.evaluated_value in names)
                for n in self.findall(node, m.Attribute() | m.Name() | m.SimpleString())
            )

        for c in self.calls:
            if self.is_call(c, *DEVICE_CALLS) or (
                isinstance(c.func, cst.Attribute)
                and c.func.attr.value in ("cuda", "to")
            ):
                if any(reads(a.value) for a in c.args):
                    return c
            for a in c.args:
                if (
                    a.keyword is not None
                    and a.keyword.value in ("device_ids", "output_device")
                    and reads(a.value)
                ):
                    return c
        return None

    def _uses_apex_amp(self) -> bool:
        return self._find_api(("apex.amp",)) is not None
