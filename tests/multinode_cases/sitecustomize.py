"""Per-process evidence for the multi-node tests: who wrote, printed, sharded, and on which device.

Put this directory on PYTHONPATH and set DDPIFY_EVIDENCE_DIR: every torchrun worker (a process
with RANK in its environment) then writes one JSON file there when it exits. The script under
test is not changed; torch functions are wrapped from an audit hook as soon as torch defines them.
Inert in every other process (torchrun agents, the test runner).
"""

from __future__ import annotations

import atexit
import json
import os
import sys

_DIR = os.environ.get("DDPIFY_EVIDENCE_DIR")
_ACTIVE = bool(_DIR) and "RANK" in os.environ

if _ACTIVE:
    _CWD = os.path.realpath(os.getcwd())
    _EVIDENCE_DIR = os.path.realpath(_DIR)
    _OUTPUT_LIMIT = 200_000
    _record: dict = {
        "node": os.environ.get("DDPIFY_NODE") or os.environ.get("SLURM_NODEID"),
        "env": {
            k: os.environ.get(k)
            for k in (
                "RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE",
                "CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID", "SLURM_NODEID", "SLURMD_NODENAME",
            )  # fmt: skip
        },
        "pid": os.getpid(),
        "cwd": _CWD,
        "argv": list(sys.argv),
        "writes": [],
        "saves": [],
        "init": [],
        "set_device": [],
        "samplers": [],
        "stdout": "",
        "stderr": "",
    }
    _sampler_seq = [0]

    class _Tee:
        """Passes writes through and keeps a copy: prints, tqdm and logging all end up here."""

        def __init__(self, stream, key: str) -> None:
            self._stream = stream
            self._key = key

        def write(self, text):
            if len(_record[self._key]) < _OUTPUT_LIMIT:
                _record[self._key] += str(text)
            return self._stream.write(text)

        def __getattr__(self, name):
            return getattr(self._stream, name)

    sys.stdout = _Tee(sys.stdout, "stdout")
    sys.stderr = _Tee(sys.stderr, "stderr")

    def _path_text(path) -> str:
        if isinstance(path, (str, bytes, os.PathLike)):
            return os.path.realpath(os.fsdecode(path))
        return f"<{type(path).__name__}>"

    def _wrap_save(torch) -> None:
        original = torch.save

        def save(obj, f, *args, **kwargs):
            _record["saves"].append(_path_text(f))
            return original(obj, f, *args, **kwargs)

        torch.save = save
        torch.serialization.save = save

    def _wrap_init(dist) -> None:
        original = dist.init_process_group

        def init_process_group(*args, **kwargs):
            out = original(*args, **kwargs)
            backend = kwargs.get("backend", args[0] if args else None)
            _record["init"].append(
                {
                    "backend": str(backend) if backend is not None else None,
                    "group_backend": str(dist.get_backend()),
                    "rank": dist.get_rank(),
                    "world_size": dist.get_world_size(),
                    "device_id": str(kwargs.get("device_id")) if kwargs.get("device_id") is not None else None,
                }
            )
            return out

        dist.init_process_group = init_process_group

    def _wrap_set_device(cuda) -> None:
        original = cuda.set_device

        def set_device(device):
            _record["set_device"].append(str(device))
            return original(device)

        cuda.set_device = set_device

    def _wrap_sampler(module) -> None:
        cls = module.DistributedSampler
        original = cls.__iter__

        def __iter__(self):
            if not hasattr(self, "_ddpify_seq"):
                self._ddpify_seq = _sampler_seq[0]
                self._ddpify_iters = 0
                _sampler_seq[0] += 1
            indices = list(original(self))
            _record["samplers"].append(
                {
                    "seq": self._ddpify_seq,
                    "iteration": self._ddpify_iters,
                    "rank": self.rank,
                    "num_replicas": self.num_replicas,
                    "epoch": self.epoch,
                    "dataset_len": len(self.dataset),
                    "indices": indices,
                }
            )
            self._ddpify_iters += 1
            return iter(indices)

        cls.__iter__ = __iter__

    # (module, attribute that must exist, wrapper): applied once, at the first audit event after.
    _pending = [
        ("torch", "save", _wrap_save),
        ("torch.distributed", "init_process_group", _wrap_init),
        ("torch.cuda", "set_device", _wrap_set_device),
        ("torch.utils.data.distributed", "DistributedSampler", _wrap_sampler),
    ]
    _busy = [False]

    def _is_write(mode, flags) -> bool:
        if isinstance(mode, str):
            return any(c in mode for c in "wax+")
        return isinstance(flags, int) and bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))

    def _hook(event: str, args) -> None:
        if _busy[0]:
            return
        _busy[0] = True
        try:
            if event == "open" and len(args) == 3 and isinstance(args[0], (str, bytes, os.PathLike)):
                if _is_write(args[1], args[2]):
                    path = _path_text(args[0])
                    # Only what the script writes into its working directory (its "node's disk").
                    if path.startswith(_CWD + os.sep) and not path.startswith(_EVIDENCE_DIR):
                        _record["writes"].append(path)
            if _pending:
                for item in list(_pending):
                    module = sys.modules.get(item[0])
                    if module is not None and hasattr(module, item[1]):
                        _pending.remove(item)
                        item[2](module)
        finally:
            _busy[0] = False

    sys.addaudithook(_hook)

    def _dump() -> None:
        torch = sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_initialized():
                _record["cuda_current_device"] = torch.cuda.current_device()
        except Exception as exc:  # evidence must never change the exit status
            _record["cuda_error"] = repr(exc)
        name = f"proc-{_record['node']}-{os.environ.get('RANK')}-{os.getpid()}.json"
        with open(os.path.join(_EVIDENCE_DIR, name), "w", encoding="utf-8") as fh:
            json.dump(_record, fh)

    atexit.register(_dump)
