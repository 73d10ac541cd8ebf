"""The probe's hooks: what it wraps in torch and the standard library, and nothing more.

Part of the probe (see probe.py): the standard library and torch only, never ddpify. Each wrapper
calls the original unchanged (its own exceptions, StopIteration included, reach the script as
before) and hands what it saw to the Probe through probe.safe(), so a failure of the probe's own
code is recorded and never raised into the script. Only StopVerify (a BaseException) leaves a hook.
"""

from __future__ import annotations

import builtins
import io
import sys

if __package__:
    from ddpify.verify import probe_state as S
    from ddpify.verify import probe_values as V
else:  # started by path in a rank: probe.py loads its parts by their file names
    import probe_state as S  # type: ignore[no-redef]
    import probe_values as V  # type: ignore[no-redef]


# torch.distributed's collectives every rank must join (their entries are noted, see Probe.on_collective)
COLLECTIVES = (
    "barrier",
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "all_to_all",
    "all_to_all_single",
    "monitored_barrier",
)


class OutputTee:
    """sys.stdout / sys.stderr as the script sees them: every write goes to the real stream, and
    the probe notes the line of the script that wrote it (print, .write, a logging handler)."""

    def __init__(self, stream, probe: S.Probe, name: str) -> None:
        self.__dict__.update(_stream=stream, _probe=probe, _name=name)

    def write(self, text):
        out = self._stream.write(text)
        if isinstance(text, str):
            self._probe.safe("output", self._probe.note_output, self._name, text)
        return out

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(
        self, name
    ):  # fileno, flush, isatty, buffer, encoding, ...: the real stream's
        return getattr(self._stream, name)

    def __setattr__(self, name, value):
        setattr(self._stream, name, value)

    def __iter__(self):
        return iter(self._stream)


def install(probe: S.Probe) -> None:
    import torch
    import torch.distributed as dist
    import torch.utils.data.dataloader as dl
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import Optimizer, register_optimizer_step_post_hook
    from torch.utils.data.distributed import DistributedSampler

    safe = probe.safe

    def step_hook(optimizer, args, kwargs):
        safe(
            "optimizer step", probe.on_optimizer_step, optimizer
        )  # StopVerify passes through

    register_optimizer_step_post_hook(step_hook)

    orig_opt_init = Optimizer.__init__

    def opt_init(self, *args, **kwargs):
        orig_opt_init(self, *args, **kwargs)
        probe.optimizers.append(self)

    Optimizer.__init__ = opt_init

    orig_backward = torch.autograd.backward

    def backward(tensors, *args, **kwargs):
        if safe("stop", probe.should_stop_before_backward):
            raise S.StopVerify
        safe("backward", probe.on_backward, tensors)
        if probe.ddp_modules:
            safe("collective", probe.on_collective, "backward")
        return orig_backward(tensors, *args, **kwargs)

    torch.autograd.backward = backward

    for scaler_cls in {
        torch.amp.GradScaler,
        getattr(torch.cuda.amp, "GradScaler", torch.amp.GradScaler),
    }:
        orig_scale = scaler_cls.scale

        def scale(self, outputs, _orig=orig_scale):
            out = _orig(self, outputs)
            if isinstance(outputs, torch.Tensor):
                probe.last_scaled = (out, outputs)
            return out

        scaler_cls.scale = scale

    orig_next_index = dl._BaseDataLoaderIter._next_index

    def new_epoch_of(it):
        if it.__dict__.get("_ddpify_it") is not it._sampler_iter:
            it._ddpify_it = it._sampler_iter
            it._ddpify_epoch = probe.new_epoch(it)

    def note_indices(it, idx):
        rec = it.__dict__.get("_ddpify_epoch")
        if (
            rec is not None
            and not rec["iterable"]
            and len(rec["indices"]) < S.MAX_INDICES_PER_EPOCH
        ):
            rec["indices"].extend(V.flat_indices(idx))

    def next_index(self):
        safe("epoch", new_epoch_of, self)
        idx = orig_next_index(self)
        safe("indices", note_indices, self, idx)
        return idx

    dl._BaseDataLoaderIter._next_index = next_index

    orig_next = dl._BaseDataLoaderIter.__next__

    def next_batch(self):
        try:
            data = orig_next(self)
        except StopIteration:
            safe("epoch end", probe.on_epoch_end, self)
            raise
        safe("batch", probe.on_batch, self, data)
        return data

    dl._BaseDataLoaderIter.__next__ = next_batch

    orig_set_epoch = DistributedSampler.set_epoch

    def set_epoch(self, epoch):
        calls = probe.record["set_epoch_calls"]
        if len(calls) < 10_000:
            calls.append(epoch if isinstance(epoch, int) else repr(epoch)[:80])
        return orig_set_epoch(self, epoch)

    DistributedSampler.set_epoch = set_epoch

    orig_ddp_init = DistributedDataParallel.__init__

    def note_ddp(module, args, kwargs):
        devices = sorted({str(p.device) for p in module.parameters()})
        probe.record["ddp"].append(
            {
                "devices": devices,
                "device_ids": repr(kwargs.get("device_ids", args[0] if args else None)),
            }
        )
        probe.ddp_modules.append(module)
        probe.milestone()

    def watch(ddp, module):
        # the first DDP model: its inputs and the local gradients of a few parameters
        ddp.register_forward_pre_hook(
            lambda m, a, k: safe("ddp forward", probe.on_ddp_forward, m, a, k),
            with_kwargs=True,
        )
        for p in [p for p in module.parameters() if p.requires_grad][:4]:
            p.register_hook(lambda g: safe("local gradient", probe.on_local_grad, g))

    def ddp_init(self, module, *args, **kwargs):
        # Recorded before DDP's own collectives run, so a rank that dies inside them still tells where its model was.
        safe("ddp", note_ddp, module, args, kwargs)
        safe("collective", probe.on_collective, "DistributedDataParallel()")
        orig_ddp_init(self, module, *args, **kwargs)
        self.register_forward_pre_hook(
            lambda m, a: safe("collective", probe.on_collective, "the DDP forward")
        )
        if len(probe.ddp_modules) == 1:
            safe("ddp hooks", watch, self, module)

    DistributedDataParallel.__init__ = ddp_init

    orig_init_pg = dist.init_process_group

    def note_init():
        probe.record["init"] = {
            "backend": str(dist.get_backend()),
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
        }
        probe.milestone()

    def init_process_group(*args, **kwargs):
        out = orig_init_pg(*args, **kwargs)
        safe("init_process_group", note_init)
        return out

    dist.init_process_group = init_process_group
    dist.distributed_c10d.init_process_group = init_process_group

    def noting(name, real):
        def collective(*args, **kwargs):
            safe("collective", probe.on_collective, name)
            return real(*args, **kwargs)

        collective.__wrapped__ = real
        return collective

    for name in COLLECTIVES:
        real = getattr(dist, name, None)
        if real is not None:
            wrapped = noting(name, real)
            setattr(dist, name, wrapped)
            if getattr(dist.distributed_c10d, name, None) is real:
                setattr(dist.distributed_c10d, name, wrapped)

    if torch.cuda.is_available():
        orig_set_device = torch.cuda.set_device

        def set_device(device):
            probe.record["set_device"].append(str(device)[:40])
            return orig_set_device(device)

        torch.cuda.set_device = set_device

    orig_save = torch.save

    def inspect(entry, obj):
        entry["state_dicts"] = V.inspect_saved(obj, probe.ddp_modules)

    def save(obj, f, *args, **kwargs):
        entry = safe("torch.save", probe.note_write, f, "torch.save")
        if entry is not None:
            safe(
                "saved state dicts", inspect, entry, obj
            )  # never break the script's save
        was, probe.in_probe = (
            probe.in_probe,
            True,
        )  # torch.save's own open() is the same write
        try:
            return orig_save(obj, f, *args, **kwargs)
        finally:
            probe.in_probe = was

    torch.save = save
    torch.serialization.save = save

    def opener(real):
        def open_(file, mode="r", *args, **kwargs):
            if isinstance(mode, str) and any(c in mode for c in "wax+"):
                safe("open", probe.note_write, file, f"open({mode!r})")
            return real(file, mode, *args, **kwargs)

        return open_

    builtins.open = opener(builtins.open)
    io.open = opener(io.open)


def tee_output(probe: S.Probe) -> None:
    """Note where the script prints, on every rank: rank0-output compares the ranks' lines."""
    sys.stdout = OutputTee(sys.stdout, probe, "stdout")
    sys.stderr = OutputTee(sys.stderr, probe, "stderr")
