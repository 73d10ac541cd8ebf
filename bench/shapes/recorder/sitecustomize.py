"""The shapes oracle's recorder: loaded by every Python process that has this folder on
PYTHONPATH and SHAPES_RECORD_DIR set; it records what the process did, for the oracle to judge.

It records only in the processes that run the script: the one-process run (SHAPES_ROLE=single)
and the ranks torchrun starts (LOCAL_RANK set); torchrun's own agent records nothing. One JSON
file a process, written at exit:
- writes: every path opened for writing (open, io.open, os.open, torch.save, numpy save,
  os.rename/replace targets, logging.FileHandler) and the folders made (os.makedirs, os.mkdir);
- steps: optimizer steps (register_optimizer_step_post_hook), per optimizer in the order of its
  first step, and at exit a checksum of each stepped optimizer's parameters;
- batches: a hash of the first tensor argument of each top-level forward of a module with
  parameters, while gradients are on (training forwards), with the step count at that time, and
  the hashes of that tensor's rows (which samples a rank trained on);
- datasets: for each DataLoader iterated, a hash of its dataset's first items (the ranks must
  train on the same data);
- saved: what torch.save was given a path for.
Nothing here is specific to the generated scripts: no name of theirs is looked at."""

import os

_DIR = os.environ.get("SHAPES_RECORD_DIR")
_ROLE = os.environ.get("SHAPES_ROLE")


def _active() -> bool:
    if not _DIR:
        return False
    if _ROLE == "single":
        return True
    return _ROLE == "ranks" and "LOCAL_RANK" in os.environ


if _active():
    import atexit
    import builtins
    import hashlib
    import io
    import json
    import sys
    import threading
    import time

    _real_open = builtins.open
    _rec = {
        "pid": os.getpid(),
        "rank": int(os.environ["RANK"])
        if "RANK" in os.environ and _ROLE == "ranks"
        else None,
        "argv": None,
        "writes": [],
        "dirs": [],
        "saved": [],
        "steps": [],
        "checksums": [],
        "batches": [],
        "rows": [],
        "datasets": [],
        "error": None,
        "finished": False,
        "recorder_errors": [],
    }
    _lock = threading.Lock()

    def _err(where, exc):
        if len(_rec["recorder_errors"]) < 20:
            _rec["recorder_errors"].append(f"{where}: {type(exc).__name__}: {exc}")

    def _path(p):
        try:
            if isinstance(p, int):
                return None
            p = os.fsdecode(os.fspath(p))
            return os.path.abspath(p)
        except Exception:
            return None

    def _note_write(p, how):
        ap = _path(p)
        if ap is not None:
            with _lock:
                _rec["writes"].append([ap, how])

    def _writing(mode) -> bool:
        return isinstance(mode, str) and any(c in mode for c in "wax+")

    def _open(file, mode="r", *args, **kwargs):
        if _writing(mode):
            _note_write(file, "open")
        return _real_open(file, mode, *args, **kwargs)

    builtins.open = _open
    io.open = _open

    _real_os_open = os.open

    def _os_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC):
            _note_write(path, "os.open")
        return _real_os_open(path, flags, *args, **kwargs)

    os.open = _os_open
    for _name in ("rename", "replace"):
        _real = getattr(os, _name)

        def _mv(src, dst, *a, _real=_real, _name=_name, **k):
            _note_write(dst, "os." + _name)
            return _real(src, dst, *a, **k)

        setattr(os, _name, _mv)
    _real_makedirs, _real_mkdir = os.makedirs, os.mkdir

    def _makedirs(name, mode=0o777, exist_ok=False):
        ap = _path(name)
        if ap:
            _rec["dirs"].append([ap, "makedirs", bool(exist_ok)])
        return _real_makedirs(name, mode, exist_ok)

    def _mkdir(path, *a, **k):
        ap = _path(path)
        if ap:
            _rec["dirs"].append([ap, "mkdir", False])
        return _real_mkdir(path, *a, **k)

    os.makedirs = _makedirs
    os.mkdir = _mkdir

    import logging

    _real_fh_init = logging.FileHandler.__init__

    def _fh_init(self, filename, *a, **k):
        _note_write(filename, "FileHandler")
        return _real_fh_init(self, filename, *a, **k)

    logging.FileHandler.__init__ = _fh_init

    try:
        import numpy as _np

        for _name in ("save", "savez", "savetxt"):
            _real = getattr(_np, _name)

            def _npw(file, *a, _real=_real, _name=_name, **k):
                if not hasattr(file, "write"):
                    p = os.fspath(file) if not isinstance(file, int) else file
                    if (
                        _name == "save"
                        and isinstance(p, str)
                        and not p.endswith(".npy")
                    ):
                        p = p + ".npy"
                    _note_write(p, "numpy." + _name)
                return _real(file, *a, **k)

            setattr(_np, _name, _npw)
    except Exception as exc:  # numpy missing: nothing to record
        _err("numpy", exc)

    import torch
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def _thash(t) -> str:
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return hashlib.md5(t.contiguous().numpy().tobytes()).hexdigest()[:12]

    _real_save = torch.save

    def _save(obj, f, *a, **k):
        if isinstance(f, (str, bytes, os.PathLike)):
            ap = _path(f)
            _note_write(f, "torch.save")
            if ap:
                _rec["saved"].append(ap)
        return _real_save(obj, f, *a, **k)

    torch.save = _save

    _opts = []  # stepped optimizers, in the order of their first step
    _counts = {}

    def _step_hook(opt, args, kwargs):
        try:
            key = id(opt)
            if key not in _counts:
                _opts.append(opt)
                _counts[key] = 0
            _counts[key] += 1
        except Exception as exc:
            _err("step", exc)

    register_optimizer_step_post_hook(_step_hook)

    def _total_steps() -> int:
        return sum(_counts.values())

    _depth = [0]

    def _first_tensor(args, kwargs):
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, torch.Tensor):
                return a
        return None

    def _pre(module, args, kwargs=None):
        _depth[0] += 1
        if _depth[0] != 1 or not torch.is_grad_enabled():
            return None
        try:
            if next(iter(module.parameters()), None) is None:
                return None
            t = _first_tensor(args, kwargs or {})
            if t is None or t.numel() == 0 or t.grad_fn is not None:
                return (
                    None  # another model's output (features, not samples of the data)
                )
            h = _thash(t)
            _rec["batches"].append([_total_steps(), h, type(module).__name__])
            if t.dim() >= 1 and len(_rec["rows"]) < 20000:
                _rec["rows"].extend(_thash(r) for r in t)
        except Exception as exc:
            _err("forward", exc)
        return None

    def _post(module, args, *rest):
        _depth[0] = max(0, _depth[0] - 1)
        return None

    register_module_forward_pre_hook(lambda m, a: _pre(m, a))
    register_module_forward_hook(_post, always_call=True)

    from torch.utils.data import DataLoader

    _real_iter = DataLoader.__iter__
    _seen_loaders = set()

    def _dl_iter(self):
        try:
            if id(self) not in _seen_loaders:
                _seen_loaders.add(id(self))
                ds = self.dataset
                fp = None
                from torch.utils.data import IterableDataset

                if not isinstance(ds, IterableDataset) and hasattr(ds, "__len__"):
                    parts = [str(len(ds))]
                    for i in range(min(4, len(ds))):
                        item = ds[i]
                        items = item if isinstance(item, (tuple, list)) else [item]
                        parts += [
                            _thash(x) for x in items if isinstance(x, torch.Tensor)
                        ]
                    fp = ":".join(parts)
                _rec["datasets"].append(fp)
        except Exception as exc:
            _err("dataset", exc)
        return _real_iter(self)

    DataLoader.__iter__ = _dl_iter

    _real_hook = sys.excepthook

    def _excepthook(tp, val, tb):
        _rec["error"] = f"{tp.__name__}: {val}"
        return _real_hook(tp, val, tb)

    sys.excepthook = _excepthook

    def _dump():
        try:
            _rec["argv"] = list(sys.argv)
            _rec["finished"] = _rec["error"] is None
            for opt in _opts:
                s, s2 = 0.0, 0.0
                h = hashlib.md5()
                for group in opt.param_groups:
                    for p in group["params"]:
                        d = p.detach().double()
                        s += float(d.sum())
                        s2 += float((d * d).sum())
                        h.update(_thash(p).encode())
                _rec["checksums"].append([s, s2, h.hexdigest()[:12]])
                _rec["steps"].append(_counts[id(opt)])
        except Exception as exc:
            _err("exit", exc)
        tag = f"rank{_rec['rank']}" if _rec["rank"] is not None else "single"
        path = os.path.join(_DIR, f"{tag}-{os.getpid()}-{time.time_ns()}.json")
        with _real_open(path, "w") as f:
            json.dump(_rec, f)

    atexit.register(_dump)
