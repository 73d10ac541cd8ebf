"""Finding codes: what ddpify changed ([*]) or could not change, with the manual fix.

Severity: a *blocking* finding means the output would not be a correct DDP program (a model
not wrapped, training data not sharded, ...): ddpify then leaves the file untouched and exits 2,
unless the finding is suppressed (`# ddpify: ignore[CODE]` on its line, `ignore` in
[tool.ddpify], `--ignore CODE`) or `--partial` asks for the partial conversion. Every other
finding is a *note*: it never blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# code -> (title, example message). The README's table is checked against this registry.
CODES: dict[str, str] = {
    "DDP001": "process-group setup added (ranks from torchrun's environment)",
    "DDP002": "--local-rank/--local_rank accepted for the legacy launcher",
    "DDP003": "process group destroyed when training ends",
    "DDP004": "a name ddpify generates is the script's own: ddpify's gets a free name (DDP_RANK, ...)",
    "DDP005": "BLOCKING: the conversion would read a name where it is not defined (a ddpify limitation): convert that part by hand",
    "DDP010": "device pinned to one GPU index moved to the rank's own GPU",
    "DDP011": "device could not be resolved statically; check it follows LOCAL_RANK",
    "DDP012": "CUDA_VISIBLE_DEVICES set by the script kept for plain runs only (BLOCKING when not fixed: every rank would see the same GPUs)",
    "DDP013": "legacy set-up made device-aware: NCCL and set_device only with CUDA, .cuda() to LOCAL_DEVICE",
    "DDP018": "WeightedRandomSampler replaced by DistributedWeightedSampler (per-rank weighted draws, set_epoch)",
    "DDP019": "IterableDataset sharded by rank and DataLoader worker (RankShard), the same count on every rank",
    "DDP020": "DistributedSampler added to the training DataLoader",
    "DDP021": "sampler.set_epoch(epoch) added at the top of the epoch loop",
    "DDP022": "BLOCKING: training DataLoader has its own sampler or batch_sampler with no distributed equivalent: shard it by hand",
    "DDP023": "BLOCKING: IterableDataset defined elsewhere or reading the rank itself: shard it by rank by hand",
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
    "DDP044": "loss on probabilities (binary_cross_entropy, BCELoss): no autocast for its step (bf16/fp16 round probabilities to 0 or 1); with --amp bf16/fp16 it runs in float32 with autocast off (in_float32); --amp apex O1 bans it (said, not changed)",
    "DDP045": "parameters updated by hand (no optimizer): bf16 autocast only, no GradScaler; gradients averaged in backward()",
    "DDP046": "tensor from the forward pass changed in place: autocast ends before it, the rest in float32",
    "DDP050": "gradient-accumulation micro-steps run under model.no_sync()",
    "DDP060": "rank-0 guard added",
    "DDP061": "not guarded: the statement runs a collective or the model, so every rank must run it",
    "DDP062": "progress bar disabled on ranks other than 0",
    "DDP063": "a tracker that exists on rank 0 only is used unguarded on every rank (BLOCKING: None on other ranks)",
    "DDP064": "a file write on every rank that ddpify cannot guard (BLOCKING: every rank writes the file)",
    "DDP070": "state dict saved from the unwrapped model (no 'module.' prefix)",
    "DDP071": "checkpoint loaded after a barrier, onto the rank's own device",
    "DDP072": "file written by rank 0 and read back by every rank: barrier before the read",
    "DDP073": "data prepared (downloaded, extracted, written) by rank 0 first; the other ranks wait at a barrier",
    "DDP080": "loop-ending decision taken by rank 0 and shared with every rank",
    "DDP130": "--optimize: channels-last memory format for a convolutional model and its input batches (or why not)",
    "DDP131": "--optimize: fused Adam/AdamW/SGD on GPUs (or why not)",
    "DDP132": "--optimize: DDP gradient_as_bucket_view=True and bucket_cap_mb from the model's size (or why not)",
    "DDP133": "--optimize: DDP static_graph=True where the graph provably does not change (or why not)",
    "DDP134": "--optimize: torch.backends.cudnn.benchmark for a convolutional model with fixed input shapes (or why not)",
    "DDP135": "--optimize: persistent DataLoader workers on the training loader (or why not)",
    "DDP136": "model run more than once before one backward: DDP broadcast_buffers=False (each rank keeps its own BatchNorm statistics)",
    "DDP090": "already distributed: left unchanged",
    "DDP091": "distributed the legacy way (apex / torch.distributed.launch)",
    "DDP092": "modernised legacy apex to torch-native",
    "DDP093": "amp.initialize before apex's DistributedDataParallel (--amp apex)",
    "DDP094": "backward through amp.scale_loss (--amp apex)",
    "DDP095": "amp state saved with the checkpoint and restored after amp.initialize",
    "DDP096": "apex rewrite not applied: fix by hand",
    "DDP097": "apex part kept that needs apex's CUDA extensions (--amp apex)",
    "DDP098": "left as written where `# ddpify: skip`/`off` asked (says what was not done)",
    "DDP099": "not a training script: nothing to convert",
    "DDP100": "BLOCKING: project mode: training code in a local module it cannot follow (imported inside a function)",
    "DDP101": "BLOCKING: project mode: a module shared by several entry scripts would be converted differently for each",
    "DDP102": "BLOCKING: project mode: a module that is also a script (`if __name__ == \"__main__\":`) runs the training loop converted for the entry",
    "DDP110": "batches drawn at random without a DataLoader: generators re-seeded per rank (RANK added) before training",
    "DDP111": "loop over pre-loaded data or pre-made batches runs over this rank's contiguous share (rank_share)",
    "DDP112": "full-batch training: the loss reads this rank's rows of its index (rank_rows)",
    "DDP113": "RandomSampler drawing with replacement: each rank draws num_samples // WORLD_SIZE with a generator of its own",
    "DDP114": "BLOCKING: LBFGS closure: its line search uses the rank's own loss, so the ranks diverge",
    "DDP116": "BLOCKING: random batch draws ddpify cannot make per-rank (own generator, re-seeded in the loop, draw decides the step)",
    "DDP117": "BLOCKING: full-batch index that may differ per rank (drawn unseeded, or from code ddpify cannot see)",
    "DDP145": "random draws before training with no seed: every rank seeds those generators from rank 0's seed after the set-up",
    "DDP146": "BLOCKING: an unseeded random draw runs before the process group can be set up (among the imports): each rank draws its own",
    "DDP147": "generator of the script's own made with no seed and drawn from before training: started from rank 0's seed (BLOCKING where ddpify cannot)",
    "DDP120": "the script never names a device: it stays a CPU program (gloo, no device_ids), also on a GPU machine",
    "DDP121": "mixed precision not added: the script trains on the CPU",
    "DDP140": "mixed precision not added: the program uses sparse tensors, which autocast has no bf16/fp16 kernels for",
}

# Codes that block by default: without the missing piece the output is not a correct DDP program.
# A call site may still say otherwise for one occurrence (Finding(..., severity="note")).
BLOCKING: frozenset[str] = frozenset({
    "DDP005",  # the output would stop with NameError
    "DDP022",  # training data not sharded (own sampler)
    "DDP023",  # training data not sharded (IterableDataset)
    "DDP024",  # training data not sharded (no DataLoader)
    "DDP027",  # a shuffling sampler without set_epoch: every epoch repeats the first order
    "DDP034",  # model not wrapped: ranks train unsynchronised copies
    "DDP035",  # a CPU model under NCCL: DDP refuses it on GPUs
    "DDP096",  # an apex part left half-converted
    "DDP012",  # CUDA_VISIBLE_DEVICES left pinned: under torchrun every rank sees one GPU
    "DDP063",  # a rank-0-only tracker used on every rank
    "DDP064",  # a file write that cannot be guarded: every rank would write
    "DDP036",  # the model changes after the wrap point in a way DDP cannot follow
    "DDP038",  # the model runs through a container that holds it: not wrapped
    "DDP100",  # project mode: a training loop in a module that is not followed
    "DDP101",  # project mode: one module, two different conversions
    "DDP102",  # project mode: `python module.py` would run a loop converted for another entry
    "DDP114",  # an LBFGS line search on per-rank losses
    "DDP116",  # random batch draws that stay the same on every rank
    "DDP117",  # a full-batch index that may differ per rank
    "DDP146",  # data drawn differently on each rank, before ddpify can align the seeds
})
SEVERITIES = ("blocking", "note")

@dataclass(frozen=True, order=True)
class Finding:
    line: int
    col: int  # 1-based, like ruff
    code: str
    message: str
    fixed: bool = False  # True: ddpify changed the code ([*])
    severity: str = field(default="", compare=False)  # "blocking" | "note"; "" = the code's default

    def __post_init__(self) -> None:
        if not self.severity:
            sev = "blocking" if self.code in BLOCKING and not self.fixed else "note"
            object.__setattr__(self, "severity", sev)
        elif self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")

    @property
    def blocking(self) -> bool:
        return self.severity == "blocking"

    def format(self, path: str) -> str:
        mark = " [*]" if self.fixed else " [blocking]" if self.blocking else ""
        return f"{path}:{self.line}:{self.col}: {self.code}{mark} {self.message}"

    def to_dict(self) -> dict:
        return {
            "line": self.line, "col": self.col, "code": self.code, "severity": self.severity,
            "fixed": self.fixed, "message": self.message,
        }
