"""The probe: runs inside every process of a verify run, around the user's script.

    python probe.py EXEC_PATH [SCRIPT_ARGS...]

It installs hooks (optimizer steps, backward passes, DataLoader draws, process-group setup, DDP
construction, file writes), runs EXEC_PATH as ``__main__`` without editing it, stops it cleanly
after K optimizer steps (or K backward passes when the script has no optimizer), and writes what
it saw into DDPIFY_VERIFY_DIR as rank<R>.json (+ rank<R>.params.pt). The parent process compares
the ranks; the probe never runs a collective of its own, so it cannot hang a healthy run.

Only the standard library and torch are imported here: this file is started by path (torchrun
starts one per rank), so it must not depend on ddpify being importable.
"""

from __future__ import annotations

import builtins
import faulthandler
import io
import json
import math
import os
import signal
import sys
import time
import traceback
import types

RUN_DIR = os.environ.get("DDPIFY_VERIFY_DIR", "")
MAX_STEPS = int(os.environ.get("DDPIFY_VERIFY_STEPS", "20"))
# --epochs N: run N whole training epochs (and what the script does at their end) instead of K steps.
EPOCHS = int(os.environ.get("DDPIFY_VERIFY_EPOCHS", "0") or 0)
if EPOCHS:
    MAX_STEPS = 1 << 62
# The file the user named: __file__, sys.argv[0] and sys.path[0] follow it even when the
# converted copy (EXEC_PATH) is what runs.
MAIN_FILE = os.environ.get("DDPIFY_VERIFY_MAIN_FILE", "")
# Above this many parameters the dump keeps an evenly strided sample of each tensor.
MAX_DUMP_NUMEL = 16_000_000
MAX_INDICES_PER_EPOCH = 1_000_000
MAX_FINGERPRINTS = 8  # batches per epoch of an IterableDataset
MAX_STEP_PRINTS = 64  # training forwards/backwards of the DDP model whose inputs and local gradients are kept
HEARTBEAT_S = 0.25

_real_open = builtins.open


class StopVerify(BaseException):
    """Raised from a hook after step K; BaseException so `except Exception` in the script lets it through."""


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class Probe:
    def __init__(self, exec_path: str, main_file: str) -> None:
        self.rank = _env_int("RANK", 0)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.exec_path = os.path.abspath(exec_path)
        self.main_file = os.path.abspath(main_file)
        self.user_dir = os.path.dirname(self.main_file)
        self.user_files = {self.exec_path, self.main_file}
        self.prefix = os.path.join(RUN_DIR, f"rank{self.rank}")
        self.record: dict = {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "node": _env_int("GROUP_RANK", 0),
            "pid": os.getpid(),
            "t_start": time.time(),
            "status": "running",
            "init": None,
            "set_device": [],
            "ddp": [],
            "writes": [],
            "set_epoch_calls": [],
        }
        self.opt_steps: dict[int, int] = {}
        self.step = 0
        self.backward = 0
        self.batches = 0
        self.samples = 0
        self.samples_known = False
        self.optimizers: list = []
        self.ddp_modules: list = []
        self.losses: list = []
        self.marks: list[tuple[float, int]] = []
        self.epochs: list[dict] = []
        self.last_epoch: dict | None = None
        self.train_epochs_done = 0
        self.last_scaled = None  # (scaled tensor, unscaled loss) from GradScaler.scale
        # without a DataLoader, sharding shows in what the DDP model sees: its training inputs,
        # and the gradients each rank computes before DDP averages them
        self.input_prints: list = []
        self.grad_prints: dict[int, list[float]] = {}
        self.in_probe = False  # our own writes are not the script's
        self.events = 0  # milestones (hooks installed, group initialised, DDP built): progress before step 1
        self.hb_time = 0.0
        self.hb_fd = os.open(self.prefix + ".hb", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.heartbeat()

    # ---------------------------------------------------------------- bookkeeping

    def heartbeat(self, force: bool = True) -> None:
        # A fixed-size overwrite: the parent reads progress from it to spot a hang. Steps and
        # milestones always write; batches and backward passes at most every HEARTBEAT_S.
        now = time.monotonic()
        if not force and now - self.hb_time < HEARTBEAT_S:
            return
        self.hb_time = now
        line = f"{self.step} {self.backward} {self.batches} {self.events}".ljust(63) + "\n"
        os.pwrite(self.hb_fd, line.encode(), 0)

    def milestone(self) -> None:
        self.events += 1
        self.heartbeat()
        self.save_record()

    def save_record(self) -> None:
        self.in_probe = True
        try:
            if self.last_epoch is not None and not self.last_epoch["complete"]:
                self.last_epoch["bw_last"] = self.backward
            rec = dict(self.record)
            rec.update(
                steps=self.step,
                backward=self.backward,
                batches=self.batches,
                samples=self.samples if self.samples_known else None,
                mode="step" if self.optimizers else "backward",
                marks=self.marks,
                epochs=[_public_epoch(e) for e in self.epochs],
                input_prints=self.input_prints,
                grad_prints=[self.grad_prints[k] for k in sorted(self.grad_prints)],
                t_saved=time.time(),
            )
            tmp = self.prefix + ".json.tmp"
            with _real_open(tmp, "w") as f:
                json.dump(rec, f, default=str)
            os.replace(tmp, self.prefix + ".json")
        finally:
            self.in_probe = False

    def is_user_frame(self, filename: str) -> bool:
        if filename in self.user_files:
            return True
        return (
            filename.startswith(self.user_dir + os.sep)
            and "site-packages" not in filename
            and "dist-packages" not in filename
            and not filename.startswith(os.path.dirname(os.path.abspath(__file__)) + os.sep)
        )

    def user_where(self) -> str | None:
        f = sys._getframe(2)
        depth = 0
        while f is not None and depth < 80:
            if self.is_user_frame(f.f_code.co_filename):
                return f"{f.f_code.co_filename}:{f.f_lineno}"
            f = f.f_back
            depth += 1
        return None

    def note_write(self, path, kind: str) -> dict | None:
        if self.in_probe:
            return None
        if isinstance(path, int) or not isinstance(path, (str, bytes, os.PathLike)):
            return None
        try:
            full = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return None
        if full.startswith(("/dev/", "/proc/", "/sys/")):
            return None
        run_dir = os.path.realpath(RUN_DIR) if RUN_DIR else ""
        try:
            cwd = os.path.realpath(os.getcwd())
        except OSError:  # the script removed its own working directory
            cwd = "/nonexistent"
        # Under --nnodes each node's working directory lies in the run directory: its files are the script's.
        if run_dir and full.startswith(run_dir + os.sep) and not full.startswith(cwd + os.sep):
            return None
        where = self.user_where()
        if where is None:
            return None  # a library's own cache or log, not something the script asked for
        if len(self.record["writes"]) >= 1000:
            return None
        # The same file on every node's disk has the same path relative to that node's working directory.
        rel = os.path.relpath(full, cwd) if full.startswith(cwd + os.sep) else full
        entry = {"path": full, "rel": rel, "kind": kind, "where": where}
        self.record["writes"].append(entry)
        return entry

    def mark_step(self) -> None:
        import torch

        if self.step == 1 or self.step == MAX_STEPS:
            # The throughput window runs from step 1 to step K: sync its ends so queued GPU work counts.
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
        self.marks.append((time.perf_counter(), self.samples))
        self.heartbeat()
        if self.step == 1:
            self.save_record()

    # ---------------------------------------------------------------- hooks

    def on_optimizer_step(self, optimizer, args, kwargs) -> None:
        key = id(optimizer)
        self.opt_steps[key] = self.opt_steps.get(key, 0) + 1
        step = max(self.opt_steps.values())
        if step != self.step:
            self.step = step
            self.mark_step()
            if self.step >= MAX_STEPS:
                raise StopVerify

    def on_backward(self, tensors) -> None:
        import torch

        if EPOCHS and self.train_epochs_done >= EPOCHS:
            # N whole epochs done, and whatever the script did after them up to this next backward.
            raise StopVerify
        if not self.optimizers and self.backward >= MAX_STEPS:
            # Hand-stepped script: K backward passes and their updates are done; stop before the next.
            raise StopVerify
        self.backward += 1
        t = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
        if isinstance(t, torch.Tensor):
            if self.last_scaled is not None and self.last_scaled[0] is t:
                t = self.last_scaled[1]
            self.last_scaled = None
            val = t.detach()
            if val.dim():
                val = val.float().mean()
            if len(self.losses) < 100_000:
                self.losses.append(val)
            if "loss_device" not in self.record:
                self.record["loss_device"] = str(val.device)
        if not self.optimizers:
            self.step = self.backward
            self.mark_step()
        else:
            self.heartbeat(force=False)

    def on_batch(self, it, data) -> None:
        self.batches += 1
        n = _batch_len(data)
        if n is not None:
            self.samples += n
            self.samples_known = True
        rec = it.__dict__.get("_ddpify_epoch")
        if rec is not None:
            rec["drawn"] += 1
            if rec["iterable"] and len(rec["fingerprints"]) < MAX_FINGERPRINTS:
                # No indices to compare for an IterableDataset: compare what the batches hold instead.
                rec["fingerprints"].append(_fingerprint(data))
            if rec["bw_first"] is None:
                rec["bw_first"] = self.backward
            rec["bw_last"] = self.backward
            self.last_epoch = rec
        self.heartbeat(force=False)

    def on_ddp_forward(self, module, args, kwargs) -> None:
        import torch

        if torch.is_grad_enabled() and module.training and len(self.input_prints) < MAX_STEP_PRINTS:
            self.input_prints.append(_fingerprint([*args, *kwargs.values()]))

    def on_local_grad(self, grad) -> None:
        # one entry per backward pass: the sums of the watched parameters' local gradients
        if self.backward not in self.grad_prints and len(self.grad_prints) >= MAX_STEP_PRINTS:
            return
        entry = self.grad_prints.setdefault(self.backward, [0.0, 0.0])
        g = grad.detach().double()
        entry[0] += float(g.sum())
        entry[1] += float(g.abs().sum())

    def on_epoch_end(self, it) -> None:
        rec = it.__dict__.get("_ddpify_epoch")
        if rec is not None and not rec["complete"]:
            rec["bw_last"] = self.backward
            rec["complete"] = True
            if rec["bw_first"] is not None and rec["bw_last"] > rec["bw_first"]:
                self.train_epochs_done += 1

    def new_epoch(self, it) -> dict:
        sampler = getattr(it, "_index_sampler", None)
        inner = getattr(sampler, "sampler", sampler)
        dataset = getattr(it, "_dataset", None)
        try:
            length = len(dataset)
        except TypeError:
            length = None
        from torch.utils.data import IterableDataset

        try:
            num_batches = len(it)
        except TypeError:
            num_batches = None
        rec = {
            "num_batches": num_batches,
            "drawn": 0,
            "sampler_seed": getattr(inner, "seed", None) if type(inner).__name__ == "DistributedSampler" else None,
            "dataset": type(dataset).__qualname__,
            "dataset_len": length,
            "batch_size": getattr(sampler, "batch_size", None),
            "sampler": type(inner).__qualname__,
            "replacement": bool(getattr(inner, "replacement", False)),
            "shuffle": _shuffles(inner),
            "sampler_epoch": getattr(inner, "epoch", None),
            "num_replicas": getattr(inner, "num_replicas", None),
            "sampler_rank": getattr(inner, "rank", None),
            "iterable": isinstance(dataset, IterableDataset),
            "indices": [],
            "fingerprints": [],
            "bw_first": None,
            "bw_last": None,
            "complete": False,
            "seq": len(self.epochs),
        }
        self.epochs.append(rec)
        return rec

    # ---------------------------------------------------------------- final dump

    def tracked_params(self) -> list:
        seen: set[int] = set()
        params = []
        for opt in self.optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        params.append(p)
        for m in self.ddp_modules:
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        return params

    def unused_params(self, error: str) -> list[str]:
        """Module paths of the parameters DDP says got no gradient (its message gives indices only)."""
        import re

        m = re.search(r"did not receive grad for rank \d+:\s*([\d ,]+)", error)
        indices = [int(x) for x in re.findall(r"\d+", m.group(1))] if m else []
        names = []
        for module in self.ddp_modules:
            # DDP numbers the parameters that require grad, in named_parameters() order.
            trainable = [n for n, p in module.named_parameters() if p.requires_grad]
            if indices:
                names.extend(trainable[i] for i in indices if i < len(trainable))
            else:
                names.extend(n for n, p in module.named_parameters() if p.requires_grad and p.grad is None)
        return names

    def inspect_saved(self, obj) -> list[dict]:
        """Each state dict inside what torch.save got, and whether it loads into the unwrapped model."""
        from torch.nn.parallel import DistributedDataParallel

        found: list[tuple[str, object]] = []
        _find_state_dicts(obj, "", 0, found)
        models = [_model_keys(m) for m in self.ddp_modules]
        out = []
        for where, sd in found[:8]:
            if isinstance(sd, DistributedDataParallel):
                out.append({"at": where, "verdict": "ddp-object", "keys": 0})
                continue
            if not isinstance(sd, dict):
                continue
            keys = {k: list(v.shape) for k, v in sd.items()}
            info = {"at": where, "keys": len(keys), "sample": list(keys)[:3], "verdict": "unknown"}
            # Several models (a GAN's two): judged against the one it fits best.
            verdicts = [_compare_keys(keys, model) for model in models]
            rank = {"loads": 0, "partial": 1, "module-prefix": 2, "mismatch": 3, "unknown": 4}
            if verdicts:
                info.update(min(verdicts, key=lambda v: (rank[v["verdict"]], v.get("n_missing", 0) + v.get("n_unexpected", 0) + len(v.get("shapes", [])))))
            out.append(info)
        return out

    def device_info(self) -> dict:
        import torch

        info: dict = {"params": sorted({str(p.device) for p in self.tracked_params()})}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            info["cuda_current"] = torch.cuda.current_device()
            peak, ids = {}, {}
            for d in range(torch.cuda.device_count()):
                peak[d] = torch.cuda.max_memory_allocated(d)
                if peak[d]:
                    ids[d] = _device_uuid(d)
            info["cuda_peak"] = peak
            info["cuda_ids"] = ids
            used = {p.device for p in self.tracked_params() if p.device.type == "cuda"}
            info["cuda_param_ids"] = {str(d): _device_uuid(d.index) for d in used}
        return info

    def dump_params(self) -> None:
        import torch

        params = self.tracked_params()
        if not params:
            return
        total = sum(p.numel() for p in params)
        stride = max(1, math.ceil(total / MAX_DUMP_NUMEL))
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1)[::stride].to("cpu", torch.float64) for p in params])
        self.in_probe = True
        try:
            torch.save(flat, self.prefix + ".params.pt")
        finally:
            self.in_probe = False
        self.record["params"] = {"numel": total, "stride": stride, "tensors": len(params)}

    def finish(self, status: str, exit_code: int, error: str | None = None, tb: str | None = None) -> None:
        import torch

        self.record.update(status=status, exit_code=exit_code, t_end=time.time())
        if error:
            self.record["error"] = error
            self.record["traceback"] = tb
            if "did not receive grad" in error or "finished reduction in the prior iteration" in error:
                try:
                    self.record["unused_params"] = self.unused_params(error)
                except Exception as exc:
                    self.record.setdefault("probe_errors", []).append(repr(exc))
        if self.last_epoch is not None and not self.last_epoch["complete"]:
            self.last_epoch["bw_last"] = self.backward
        try:
            self.record["losses"] = [float(x) for x in torch.stack([x.float() for x in self.losses]).cpu()] if self.losses else []
        except Exception as exc:  # a loss on a broken device: keep going, say why
            self.record["losses_error"] = repr(exc)
        # A crashed rank's parameters are never compared, and its device may be unusable.
        parts = [self.dump_params] if status in ("stopped", "finished") else []
        for part in (*parts, lambda: self.record.update(devices=self.device_info())):
            try:
                part()
            except Exception as exc:
                self.record.setdefault("probe_errors", []).append(repr(exc))
        self.save_record()


def _find_state_dicts(obj, where: str, depth: int, out: list) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    if len(out) >= 8 or depth > 3:
        return
    if isinstance(obj, DistributedDataParallel):
        out.append((where or "<object>", obj))
        return
    if isinstance(obj, dict) and obj:
        if all(isinstance(k, str) for k in obj) and all(isinstance(v, torch.Tensor) for v in obj.values()):
            out.append((where or "<object>", obj))
            return
        for k, v in list(obj.items())[:64]:
            if isinstance(v, (dict, list, tuple, DistributedDataParallel)):
                _find_state_dicts(v, f"{where}[{k!r}]", depth + 1, out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj[:16]):
            _find_state_dicts(v, f"{where}[{i}]", depth + 1, out)


def _model_keys(module) -> dict[str, list[int]]:
    """What module.state_dict() would hold (names and shapes), without calling it (no user hooks)."""
    keys = {}
    for prefix, m in module.named_modules():
        for n, p in m._parameters.items():
            if p is not None:
                keys[f"{prefix}.{n}" if prefix else n] = list(p.shape)
        for n, b in m._buffers.items():
            if b is not None and n not in m._non_persistent_buffers_set:
                keys[f"{prefix}.{n}" if prefix else n] = list(b.shape)
    return keys


def _compare_keys(saved: dict, model: dict) -> dict:
    if saved == model:
        return {"verdict": "loads"}
    prefixed = all(k.startswith("module.") for k in saved)
    stripped = {k[len("module."):]: v for k, v in saved.items()} if prefixed else saved
    if not set(stripped) & set(model):
        return {"verdict": "unknown"}  # another model's, or not a model's state dict
    if prefixed and stripped == model:
        return {"verdict": "module-prefix"}
    missing = sorted(set(model) - set(stripped))
    unexpected = sorted(set(stripped) - set(model))
    shapes = [f"{k}: saved {stripped[k]}, model {model[k]}" for k in sorted(set(stripped) & set(model)) if stripped[k] != model[k]]
    if not prefixed and not shapes and not (missing and unexpected):
        return {"verdict": "partial"}  # a part of the model (a submodule, or the model inside a larger dict)
    return {
        "verdict": "module-prefix" if prefixed else "mismatch",
        "missing": missing[:5],
        "n_missing": len(missing),
        "unexpected": unexpected[:5],
        "n_unexpected": len(unexpected),
        "shapes": shapes[:5],
    }


def _public_epoch(e: dict) -> dict:
    return {k: v for k, v in e.items() if not k.startswith("_")}


def _shuffles(sampler) -> bool | None:
    name = type(sampler).__name__
    if hasattr(sampler, "shuffle"):
        return bool(sampler.shuffle)
    if name in ("RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler"):
        return True
    if name == "SequentialSampler":
        return False
    return None


def _batch_len(x, depth: int = 0):
    import torch

    if isinstance(x, torch.Tensor):
        return int(x.shape[0]) if x.dim() else 1
    if depth > 3:
        return None
    if isinstance(x, (list, tuple)) and x:
        return _batch_len(x[0], depth + 1)
    if isinstance(x, dict) and x:
        return _batch_len(next(iter(x.values())), depth + 1)
    return None


def _fingerprint(data, depth: int = 0):
    """Shape and sums of a strided sample of the batch's first tensor: equal batches give equal prints."""
    import torch

    if isinstance(data, torch.Tensor):
        flat = data.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 65536)].double()
        return [list(data.shape), round(float(sample.sum()), 6), round(float(sample.abs().sum()), 6)]
    if depth < 3 and isinstance(data, (list, tuple)) and data:
        return _fingerprint(data[0], depth + 1)
    if depth < 3 and isinstance(data, dict) and data:
        return _fingerprint(next(iter(data.values())), depth + 1)
    return None


def _device_uuid(index) -> str:
    import torch

    try:
        return str(torch.cuda.get_device_properties(index).uuid)
    except Exception:
        return f"cuda:{index}"


def _flat_indices(idx):
    if isinstance(idx, (list, tuple)):
        return [_one_index(i) for i in idx]
    return [_one_index(idx)]


def _one_index(i):
    try:
        return int(i)
    except (TypeError, ValueError):
        return repr(i)


# -------------------------------------------------------------------- installing the hooks


def install(probe: Probe) -> None:
    import torch
    import torch.distributed as dist
    import torch.utils.data.dataloader as dl
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import Optimizer, register_optimizer_step_post_hook
    from torch.utils.data.distributed import DistributedSampler

    register_optimizer_step_post_hook(probe.on_optimizer_step)

    orig_opt_init = Optimizer.__init__

    def opt_init(self, *args, **kwargs):
        orig_opt_init(self, *args, **kwargs)
        probe.optimizers.append(self)

    Optimizer.__init__ = opt_init

    orig_backward = torch.autograd.backward

    def backward(tensors, *args, **kwargs):
        probe.on_backward(tensors)
        return orig_backward(tensors, *args, **kwargs)

    torch.autograd.backward = backward

    for scaler_cls in {torch.amp.GradScaler, getattr(torch.cuda.amp, "GradScaler", torch.amp.GradScaler)}:
        orig_scale = scaler_cls.scale

        def scale(self, outputs, _orig=orig_scale):
            out = _orig(self, outputs)
            if isinstance(outputs, torch.Tensor):
                probe.last_scaled = (out, outputs)
            return out

        scaler_cls.scale = scale

    orig_next_index = dl._BaseDataLoaderIter._next_index

    def next_index(self):
        it = self._sampler_iter
        if self.__dict__.get("_ddpify_it") is not it:
            self._ddpify_it = it
            self._ddpify_epoch = probe.new_epoch(self)
        idx = orig_next_index(self)
        rec = self._ddpify_epoch
        if not rec["iterable"] and len(rec["indices"]) < MAX_INDICES_PER_EPOCH:
            rec["indices"].extend(_flat_indices(idx))
        return idx

    dl._BaseDataLoaderIter._next_index = next_index

    orig_next = dl._BaseDataLoaderIter.__next__

    def next_batch(self):
        try:
            data = orig_next(self)
        except StopIteration:
            probe.on_epoch_end(self)
            raise
        probe.on_batch(self, data)
        return data

    dl._BaseDataLoaderIter.__next__ = next_batch

    orig_set_epoch = DistributedSampler.set_epoch

    def set_epoch(self, epoch):
        if len(probe.record["set_epoch_calls"]) < 10_000:
            probe.record["set_epoch_calls"].append(epoch if isinstance(epoch, int) else repr(epoch))
        return orig_set_epoch(self, epoch)

    DistributedSampler.set_epoch = set_epoch

    orig_ddp_init = DistributedDataParallel.__init__

    def ddp_init(self, module, *args, **kwargs):
        # Recorded before DDP's own collectives run, so a rank that dies inside them still tells where its model was.
        devices = sorted({str(p.device) for p in module.parameters()})
        probe.record["ddp"].append({"devices": devices, "device_ids": repr(kwargs.get("device_ids", args[0] if args else None))})
        probe.ddp_modules.append(module)
        probe.milestone()
        orig_ddp_init(self, module, *args, **kwargs)
        if len(probe.ddp_modules) == 1:  # the first DDP model: its inputs and local gradients
            self.register_forward_pre_hook(probe.on_ddp_forward, with_kwargs=True)
            watched = [p for p in module.parameters() if p.requires_grad][:4]
            for p in watched:
                p.register_hook(lambda g: probe.on_local_grad(g))

    DistributedDataParallel.__init__ = ddp_init

    orig_init_pg = dist.init_process_group

    def init_process_group(*args, **kwargs):
        out = orig_init_pg(*args, **kwargs)
        probe.record["init"] = {
            "backend": str(dist.get_backend()),
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
        }
        probe.milestone()
        return out

    dist.init_process_group = init_process_group
    dist.distributed_c10d.init_process_group = init_process_group

    if torch.cuda.is_available():
        orig_set_device = torch.cuda.set_device

        def set_device(device):
            probe.record["set_device"].append(str(device))
            return orig_set_device(device)

        torch.cuda.set_device = set_device

    orig_save = torch.save

    def save(obj, f, *args, **kwargs):
        entry = probe.note_write(f, "torch.save")
        if entry is not None:
            try:
                entry["state_dicts"] = probe.inspect_saved(obj)
            except Exception as exc:  # never break the script's save
                entry["state_dicts_error"] = repr(exc)
        was, probe.in_probe = probe.in_probe, True  # torch.save's own open() is the same write
        try:
            return orig_save(obj, f, *args, **kwargs)
        finally:
            probe.in_probe = was

    torch.save = save
    torch.serialization.save = save

    def opener(real):
        def open_(file, mode="r", *args, **kwargs):
            if isinstance(mode, str) and any(c in mode for c in "wax+"):
                probe.note_write(file, f"open({mode!r})")
            return real(file, mode, *args, **kwargs)

        return open_

    builtins.open = opener(builtins.open)
    io.open = opener(io.open)


# -------------------------------------------------------------------- running the script


def _set_parent_death_signal() -> None:
    # If torchrun (or the verify parent) dies, this rank dies too: no orphan outlives a run.
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _user_traceback(exc: BaseException, probe: Probe) -> str:
    """The script's traceback as Python would print it, without the probe's own frames."""
    me = os.path.abspath(__file__)
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    seen = set()
    todo = [te]
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        t.stack = traceback.StackSummary.from_list([f for f in t.stack if os.path.abspath(f.filename) != me])
        todo.extend(x for x in (t.__cause__, t.__context__) if x is not None)
    return "".join(te.format())


def _wait_for_all_ranks(probe: Probe) -> None:
    # File barrier, no collective: every rank has finished step K (and its gradient all-reduce)
    # before any rank exits, so no peer sees a closed connection mid-collective.
    _real_open(probe.prefix + ".done", "w").close()
    deadline = time.time() + 600
    while time.time() < deadline:
        if all(os.path.exists(os.path.join(RUN_DIR, f"rank{r}.done")) for r in range(probe.world_size)):
            return
        time.sleep(0.02)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def main(argv: list[str]) -> None:
    if not argv or not RUN_DIR:
        sys.stderr.write("usage: DDPIFY_VERIFY_DIR=... python probe.py SCRIPT [ARGS...]\n")
        raise SystemExit(2)
    exec_path = argv[0]
    main_file = MAIN_FILE or exec_path
    _set_parent_death_signal()
    rank = _env_int("RANK", 0)
    # The script's output goes to one file per rank, stdout and stderr interleaved as written.
    out_fd = os.open(os.path.join(RUN_DIR, f"rank{rank}.out"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    stack_file = _real_open(os.path.join(RUN_DIR, f"rank{rank}.stack"), "w")
    # Dumps every thread's Python stack on SIGUSR1 even while the rank is blocked inside a collective.
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    # torchrun stops the other ranks with SIGTERM when one fails: leave their stacks, then die as usual.
    faulthandler.register(signal.SIGTERM, file=stack_file, all_threads=True, chain=True)
    # A fatal signal (a C++ abort in a collective, a segfault) leaves its stack here; the file's
    # time tells which rank died first.
    fatal_file = _real_open(os.path.join(RUN_DIR, f"rank{rank}.fatal"), "w")
    faulthandler.enable(file=fatal_file, all_threads=True)

    # As `python SCRIPT` would: the script's folder first on the path (not the probe's), also while torch imports.
    sys.path[0] = os.path.dirname(os.path.abspath(main_file))
    probe = Probe(exec_path, main_file)
    probe.save_record()
    install(probe)
    probe.milestone()

    with _real_open(exec_path, "rb") as f:
        source = f.read()
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=main_file, __builtins__=builtins, __spec__=None, __package__=None, __cached__=None)
    sys.modules["__main__"] = module
    sys.argv = [main_file, *argv[1:]]

    try:
        code = compile(source, exec_path, "exec", dont_inherit=True)
        exec(code, module.__dict__)
    except StopVerify:
        probe.finish("stopped", 0)
        _wait_for_all_ranks(probe)
        _flush()
        os._exit(0)
    except SystemExit as exc:
        code_ = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code_ == 0:
            probe.finish("finished", 0)
            raise
        probe.finish("exited", code_, error=f"SystemExit({exc.code!r})", tb=_user_traceback(exc, probe))
        _flush()
        os._exit(code_)
    except BaseException as exc:
        tb = _user_traceback(exc, probe)
        sys.stderr.write(tb)
        probe.finish("crashed", 1, error=f"{type(exc).__name__}: {exc}", tb=tb)
        _flush()
        os._exit(1)
    probe.finish("finished", 0)


if __name__ == "__main__":
    main(sys.argv[1:])
