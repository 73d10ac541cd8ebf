"""The probe's hooks: what it wraps in torch and the standard library, and nothing more.

Part of the probe (see probe.py): the standard library and torch only, never ddpify. Each wrapper
calls the original unchanged (its own exceptions, StopIteration included, reach the script as
before) and hands what it saw to the Probe through probe.safe(), so a failure of the probe's own
code is recorded and never raised into the script. Only StopVerify (a BaseException) leaves a hook.
"""

from __future__ import annotations

import builtins
import dis
import io
import sys

if __package__:
    from ddpify.verify import probe_models as M
    from ddpify.verify import probe_state as S
    from ddpify.verify import probe_values as V
else:  # started by path in a rank: probe.py loads its parts by their file names
    import probe_models as M  # type: ignore[no-redef]
    import probe_state as S  # type: ignore[no-redef]
    import probe_values as V  # type: ignore[no-redef]

# a `for` loop, and `yield from` (3.11+: SEND; before: YIELD_FROM)
_LOOPING = {dis.opmap[n] for n in ("FOR_ITER", "SEND", "YIELD_FROM") if n in dis.opmap}


def _in_for_loop(frame) -> bool:
    """The frame asks for the next item as a `for` loop does (directly, or through enumerate,
    zip, tqdm's `yield from`): the end of the data is then what the script expects, not a
    StopIteration that a bare next() would raise into it."""
    try:
        return frame.f_code.co_code[frame.f_lasti] in _LOOPING
    except (AttributeError, IndexError, TypeError):
        return False


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
    from torch.optim.optimizer import (
        Optimizer,
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )
    from torch.utils.data.distributed import DistributedSampler

    safe = probe.safe

    def step_hook(optimizer, args, kwargs):
        safe(
            "optimizer step", probe.on_optimizer_step, optimizer
        )  # StopVerify passes through

    register_optimizer_step_post_hook(step_hook)
    # before a step: the model state of a checkpoint rank 0 just saved, on every rank
    register_optimizer_step_pre_hook(
        lambda optimizer, args, kwargs: safe("model state", probe.models.before_step)
    )

    orig_opt_init = Optimizer.__init__

    def opt_init(self, *args, **kwargs):
        orig_opt_init(self, *args, **kwargs)
        probe.optimizers.append(self)

    Optimizer.__init__ = opt_init

    orig_backward = torch.autograd.backward

    def backward(tensors, *args, **kwargs):
        if safe("stop", probe.should_stop_before_backward):
            raise S.StopVerify
        if not probe.optimizers:
            safe("model state", probe.models.before_step)
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

    def capped(it) -> bool:
        rec = it.__dict__.get("_ddpify_epoch")
        if (
            rec is None
            or rec["complete"]
            or rec["drawn"] < S.MAX_BATCHES
            or not _in_for_loop(
                sys._getframe(3)
            )  # capped <- safe <- next_batch <- its caller
        ):
            return False
        rec["capped"] = True
        probe.on_epoch_end(it)
        return True

    def next_batch(self):
        if S.MAX_BATCHES and safe("data cap", capped, self):
            raise StopIteration
        try:
            data = orig_next(self)
        except StopIteration:
            safe("epoch end", probe.on_epoch_end, self)
            raise
        safe("batch", probe.on_batch, self, data)
        return data

    dl._BaseDataLoaderIter.__next__ = next_batch
    probe.iter_len = dl._BaseDataLoaderIter.__len__
    if S.MAX_BATCHES:  # the data cap: len() agrees with the batches a pass now yields
        for cls in (dl.DataLoader, dl._BaseDataLoaderIter):

            def capped_len(self, _orig=cls.__len__):
                return min(_orig(self), S.MAX_BATCHES)

            cls.__len__ = capped_len

    orig_set_epoch = DistributedSampler.set_epoch

    def set_epoch(self, epoch):
        calls = probe.record["set_epoch_calls"]
        if len(calls) < 10_000:
            calls.append(epoch if isinstance(epoch, int) else repr(epoch)[:80])
        return orig_set_epoch(self, epoch)

    DistributedSampler.set_epoch = set_epoch

    orig_ddp_init = DistributedDataParallel.__init__

    def note_ddp(module, args, kwargs):
        probe.models.note_ddp(module, kwargs.get("broadcast_buffers", True))
        devices = sorted({str(p.device) for p in module.parameters()})
        probe.record["ddp"].append(
            {
                "devices": devices,
                "device_ids": repr(kwargs.get("device_ids", args[0] if args else None)),
            }
        )
        probe.ddp_modules.append(module)
        probe.milestone()

    def on_module(module, hook):
        """hook(args) before each forward of `module`: a global hook, so the module holds
        nothing of the probe (a script that pickles its whole model still can)."""
        from torch.nn.modules.module import register_module_forward_pre_hook

        register_module_forward_pre_hook(lambda m, a: hook(a) if m is module else None)

    def watch(ddp, module):
        # the first DDP model: its inputs and the local gradients of a few parameters
        on_module(ddp, lambda a: safe("ddp forward", probe.on_ddp_forward, ddp, a, {}))
        for p in [p for p in module.parameters() if p.requires_grad][:4]:
            p.register_hook(lambda g: safe("local gradient", probe.on_local_grad, g))

    def ddp_init(self, module, *args, **kwargs):
        # replicate() builds its DDP over a ParameterList at the first forward: the model is the
        # module it was applied to, whose forward the script calls
        user = safe("replicate", M.replicated_module, module) or module
        # Recorded before DDP's own collectives run, so a rank that dies inside them still tells where its model was.
        safe("ddp", note_ddp, user, args, kwargs)
        safe("collective", probe.on_collective, "DistributedDataParallel()")
        orig_ddp_init(self, module, *args, **kwargs)
        called = self if user is module else user

        def forward_collective(m, a, ddp=self):
            # the forward communicates when it broadcasts the buffers (from rank 0)
            if ddp._check_sync_bufs_pre_fwd():
                probe.on_collective("the DDP forward (buffer broadcast)")

        on_module(called, lambda a: safe("collective", forward_collective, called, a))
        if len(probe.ddp_modules) == 1:
            safe("ddp hooks", watch, called, user)

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

    def whole_group(args, kwargs) -> bool:
        # a subgroup's collective is not every rank's: not counted
        group = kwargs.get("group")
        if group is None:
            group = next((x for x in args if type(x).__name__ == "ProcessGroup"), None)
        return group is None or group is dist.group.WORLD

    def noting(name, real):
        def collective(*args, **kwargs):
            if safe("group", whole_group, args, kwargs):
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
    probe.real_save = orig_save

    def inspect(entry, obj):
        entry["state_dicts"] = V.inspect_saved(obj, probe.ddp_modules)

    def save(obj, f, *args, **kwargs):
        entry = safe("torch.save", probe.note_write, f, "torch.save")
        if entry is not None:
            safe(
                "saved state dicts", inspect, entry, obj
            )  # never break the script's save
            safe("checkpoint", probe.models.on_save, obj, entry)
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

    orig_import = builtins.__import__

    def import_(name, globals=None, locals=None, fromlist=(), level=0):
        try:
            return orig_import(name, globals, locals, fromlist, level)
        except ImportError as exc:
            # an import of the script's own that fails here (a CUDA-only package on the CPU)
            safe("import", probe.note_failed_import, name, exc, globals)
            raise

    builtins.__import__ = import_


def tee_output(probe: S.Probe) -> None:
    """Note where the script prints, on every rank: rank0-output compares the ranks' lines."""
    sys.stdout = OutputTee(sys.stdout, probe, "stdout")
    sys.stderr = OutputTee(sys.stderr, probe, "stderr")
