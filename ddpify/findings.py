"""Finding codes: what ddpify changed ([*]) or could not change, with the manual fix."""

from __future__ import annotations

from dataclasses import dataclass

# code -> (title, example message). The README's table is checked against this registry.
CODES: dict[str, str] = {
    "DDP001": "process-group setup added (ranks from torchrun's environment)",
    "DDP002": "--local-rank/--local_rank accepted for the legacy launcher",
    "DDP003": "process group destroyed when training ends",
    "DDP010": "device pinned to one GPU index moved to the rank's own GPU",
    "DDP011": "device could not be resolved statically; check it follows LOCAL_RANK",
    "DDP020": "DistributedSampler added to the training DataLoader",
    "DDP021": "sampler.set_epoch(epoch) added at the top of the epoch loop",
    "DDP022": "training DataLoader has its own sampler or batch_sampler: shard it by hand",
    "DDP023": "IterableDataset or infinite loader: shard it by rank by hand",
    "DDP024": "no training DataLoader found: data is not sharded",
    "DDP025": "evaluation DataLoader left unsharded: every rank evaluates the full set",
    "DDP026": "batch_size is per process: the global batch is batch_size x WORLD_SIZE",
    "DDP027": "epoch loop not found: call sampler.set_epoch(epoch) by hand",
    "DDP028": "pin_memory on the training DataLoader (GPUs)",
    "DDP029": "batch copies to the device made non_blocking",
    "DDP030": "model wrapped in DistributedDataParallel",
    "DDP031": "nn.DataParallel replaced by DistributedDataParallel",
    "DDP032": "BatchNorm converted to SyncBatchNorm",
    "DDP033": "model attribute reached through .module (the unwrapped model)",
    "DDP034": "no model found: wrap it in DistributedDataParallel by hand",
    "DDP035": "model never moved to a device: it stays on the CPU",
    "DDP036": "model changed where DDP cannot follow (in training, or later): not wrapped (blocking)",
    "DDP037": "parameters that may get no gradient: find_unused_parameters=True",
    "DDP038": "model run through a list or dict that holds it: not wrapped (blocking)",
    "DDP039": "model with every parameter frozen: not wrapped",
    "DDP040": "forward and loss run under torch.autocast",
    "DDP041": "backward and step go through the GradScaler",
    "DDP042": "torch.cuda.amp modernised to torch.amp",
    "DDP043": "mixed precision not added: the training step was not found",
    "DDP050": "gradient-accumulation micro-steps run under model.no_sync()",
    "DDP060": "rank-0 guard added",
    "DDP061": "not guarded: the statement runs a collective or the model, so every rank must run it",
    "DDP062": "progress bar disabled on ranks other than 0",
    "DDP070": "state dict saved from the unwrapped model (no 'module.' prefix)",
    "DDP071": "checkpoint loaded after a barrier, onto the rank's own device",
    "DDP072": "file written by rank 0 and read back by every rank: barrier before the read",
    "DDP080": "loop-ending decision taken by rank 0 and shared with every rank",
    "DDP090": "already distributed: left unchanged",
    "DDP091": "distributed the legacy way (apex / torch.distributed.launch)",
    "DDP092": "modernised legacy apex to torch-native",
    "DDP093": "amp.initialize before apex's DistributedDataParallel (--amp apex)",
    "DDP094": "backward through amp.scale_loss (--amp apex)",
    "DDP095": "amp state saved with the checkpoint and restored after amp.initialize",
    "DDP096": "apex rewrite not applied: fix by hand",
    "DDP097": "apex part kept that needs apex's CUDA extensions (--amp apex)",
    "DDP099": "not a training script: nothing to convert",
}


@dataclass(frozen=True, order=True)
class Finding:
    line: int
    col: int  # 1-based, like ruff
    code: str
    message: str
    fixed: bool = False  # True: ddpify changed the code ([*])

    def format(self, path: str) -> str:
        mark = " [*]" if self.fixed else ""
        return f"{path}:{self.line}:{self.col}: {self.code}{mark} {self.message}"

    def to_dict(self) -> dict:
        return {"line": self.line, "col": self.col, "code": self.code, "message": self.message, "fixed": self.fixed}
