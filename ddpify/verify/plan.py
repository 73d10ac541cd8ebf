"""How many processes run, over which backend, on which devices, and how long a rank may go
without progress.

With GPUs, every rank gets one of its own and NCCL. With fewer GPUs than ranks (one GPU, the
common case), the ranks share the GPUs there are (--share-gpus, on by default then): NCCL
refuses two ranks on one device, so the converted script picks gloo for its CUDA tensors and
device LOCAL_RANK % GPUs (ddpify's set-up does that itself when LOCAL_WORLD_SIZE exceeds the
GPUs), and device placement, autocast, pinned memory and the synchronisation checks all run in
one verify. Throughput then says nothing about scaling. Without a GPU, the ranks run on the CPU
over gloo; `--backend gloo` hides the GPUs so the script takes its CPU path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ddpify.verify.prepare import CannotRun
from ddpify.verify.runner import RunResult


@dataclass
class Plan:
    nproc: int  # processes per node
    backend: str  # nccl or gloo
    hide_gpus: bool  # the ranks see no GPU (the CPU path)
    gpus: int  # GPUs visible here
    shared: int = (
        0  # with --share-gpus: the GPUs the ranks share; 0: a GPU (or the CPU) each
    )

    def describe(self, nnodes: int) -> str:
        layout = (
            f"{nnodes} nodes x {self.nproc} processes"
            if nnodes > 1
            else f"{self.nproc} processes"
        )
        if self.shared:
            gpus = "1 GPU" if self.shared == 1 else f"{self.shared} GPUs"
            return f"{layout} sharing {gpus} (--share-gpus, the default with fewer GPUs than processes), gloo"
        return f"{layout}, {self.backend}"


def visible_gpus() -> int:
    # No NVIDIA device node, or every GPU hidden: skip importing torch in this process just to learn it.
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "" or not any(
        os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")
    ):
        return 0
    import torch

    return torch.cuda.device_count()


def plan_processes(
    nproc: int | None, backend: str, nnodes: int = 1, share: bool | None = None
) -> Plan:
    """share: True/False from --share-gpus/--no-share-gpus, None: on when there are fewer GPUs than processes."""
    gpus = visible_gpus()
    if backend == "gloo":
        return Plan(nproc or 2, "gloo", True, gpus)
    if not gpus:
        if backend == "nccl":
            raise CannotRun("--backend nccl needs a GPU, and none is visible")
        if share:
            raise CannotRun("--share-gpus needs a GPU, and none is visible")
        return Plan(nproc or 2, "gloo", True, 0)
    nproc = nproc or max(1, gpus // nnodes)
    need = nproc * nnodes
    if need <= gpus:
        return Plan(nproc, "nccl", False, gpus)
    if share is False:
        raise CannotRun(
            f"--nproc {nproc} x --nnodes {nnodes} needs {need} GPUs, one per process; {gpus} visible. "
            "Leave out --no-share-gpus to let the processes share them (gloo), or --backend gloo to run on the CPU"
        )
    if nnodes > 1:
        raise CannotRun(
            f"--nnodes {nnodes} x --nproc {nproc} needs {need} GPUs, one per process; {gpus} visible, and processes of "
            "different nodes cannot share a GPU (each node's set-up picks NCCL, which refuses a GPU twice): "
            "--backend gloo rehearses the nodes on the CPU"
        )
    if backend == "nccl":
        raise CannotRun(
            f"NCCL refuses two processes on one GPU, and --nproc {nproc} x --nnodes {nnodes} with {gpus} visible "
            "would need that: leave --backend at auto (the processes share the GPUs over gloo) or lower --nproc"
        )
    return Plan(nproc, "gloo", False, gpus, shared=gpus)


def gpu_ids() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [g.strip() for g in visible.split(",") if g.strip()]
    return [str(i) for i in range(visible_gpus())]


# --timeout auto: before anything is known, and the ceiling once the baseline was timed.
AUTO_TIMEOUT_FIRST = 120.0
AUTO_TIMEOUT_MIN = 30.0
AUTO_TIMEOUT_MAX = 300.0


def auto_timeout(base: RunResult | None) -> float:
    """Seconds without progress before a rank counts as hung, from how the one-process run went:
    ten times its longest pause between two progress marks (torch's import included), or three
    times its whole run, within [30, 300] s."""
    if base is None or not base.wall_s:
        return AUTO_TIMEOUT_FIRST
    guess = max(10 * base.max_gap, 3 * base.wall_s, AUTO_TIMEOUT_MIN)
    return float(min(AUTO_TIMEOUT_MAX, round(guess)))


# The one-process run died for want of a GPU: its error names CUDA, NCCL or the driver.
NEEDS_GPU = ("cuda", "nccl", "nvidia", "gpu")


def needs_gpu_hint(error: str, plan: Plan) -> str | None:
    """When the original needs CUDA and the ranks see none: what to do."""
    if not plan.hide_gpus or not any(word in error.lower() for word in NEEDS_GPU):
        return None
    why = "--backend gloo hides the GPUs" if plan.gpus else "there is no GPU here"
    return (f"the original needs a GPU ({why}): run with --no-baseline to verify the converted script alone, "
            "on its CPU path")  # fmt: skip


# The default run: every rank through its whole shard twice, so that what a script does at the end
# of an epoch (evaluation, checkpoint, logging) runs twice; each DataLoader pass capped at
# AUTO_MAX_BATCHES batches and the run at AUTO_MAX_TIME seconds, AUTO_STEPS steps for a script
# without DataLoader epochs.
AUTO_EPOCHS = 2
AUTO_MAX_BATCHES = 16
AUTO_STEPS = 100
AUTO_MAX_TIME = 240.0
NO_LIMIT = 1 << 62  # --to-end: steps the probe never reaches


@dataclass
class Length:
    """How long the runs go: K steps (--steps), E whole epochs (--epochs), the script's end
    (--to-end), or by default two passes over each rank's shard, capped."""

    steps: int
    epochs: int | None = None
    to_end: bool = False
    auto: bool = False
    max_batches: int | None = None  # batches a DataLoader pass yields at most
    max_time: float | None = (
        None  # seconds a run trains before every rank stops at one step
    )

    @classmethod
    def choose(cls, steps: int | None, epochs: int | None, to_end: bool, max_batches: int | None = None,
               max_time: float | None = None) -> Length:  # fmt: skip
        if to_end:
            return cls(NO_LIMIT, None, True, False, max_batches, max_time)
        if steps is None and epochs is None:
            return cls(AUTO_STEPS, AUTO_EPOCHS, False, True, max_batches or AUTO_MAX_BATCHES,
                       AUTO_MAX_TIME if max_time is None else max_time)  # fmt: skip
        return cls(steps or NO_LIMIT, epochs, False, False, max_batches, max_time)

    def env(self) -> dict[str, str]:
        out = {}
        if self.auto:
            out["DDPIFY_VERIFY_AUTO"] = "1"
        if self.max_batches:
            out["DDPIFY_VERIFY_MAX_BATCHES"] = str(self.max_batches)
        if self.max_time:
            out["DDPIFY_VERIFY_MAX_TIME"] = str(self.max_time)
        return out

    def describe(self) -> str:
        if self.to_end:
            return "to its end (--to-end)"
        if self.auto:
            return (f"{self.epochs} passes over each rank's shard (at most {self.max_batches} batches a pass, "
                    f"{self.max_time:g} s, {self.steps} steps without DataLoader epochs)")  # fmt: skip
        if self.epochs:
            return f"{self.epochs} epoch{'s' if self.epochs > 1 else ''}"
        return f"K={self.steps}"
