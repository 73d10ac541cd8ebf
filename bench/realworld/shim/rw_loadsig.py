"""Load files that torch.save wrote, in a plain process, and describe what they hold.

    python rw_loadsig.py OUT.json FILE [FILE...]

Run by the harness with no process group and no torchrun variables: a file that needs a process
group to load (a pickled DistributedDataParallel) fails here, as it would for a user. For each
file it writes {"ok": bool, "error": str, "sig": ...} where sig describes the structure (dict
keys, tensor dtypes and shapes, module classes and their state-dict entries, types of the rest),
so that the harness can compare what the converted output saved with what the original saved.

Classes that cannot be imported here (a model class defined in the script's `__main__`) load as
placeholders that keep their name and state: the original's file has the same placeholders.
"""

from __future__ import annotations

import json
import numbers
import os
import pickle
import sys
import types

for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID"):
    os.environ.pop(var, None)

import torch  # noqa: E402

_PLACEHOLDERS: dict[tuple[str, str], type] = {}


def _placeholder(module: str, name: str) -> type:
    key = (module, name)
    if key not in _PLACEHOLDERS:
        cls = type(name, (), {"__module__": module, "__rw_unresolved__": True,
                              "__setstate__": lambda self, state: self.__dict__.update(
                                  state if isinstance(state, dict) else {"__state__": state})})
        _PLACEHOLDERS[key] = cls
    return _PLACEHOLDERS[key]


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            return _placeholder(module, name)


tolerant = types.SimpleNamespace(Unpickler=_Unpickler, load=lambda f, **kw: _Unpickler(f, **kw).load(),
                                 __name__="pickle")


def _qual(x) -> str:
    t = type(x)
    return f"{t.__module__}.{t.__qualname__}"


def sig(x, depth: int = 0):
    if depth > 12:
        return "..."
    if isinstance(x, torch.Tensor):
        return ["tensor", str(x.dtype), list(x.shape)]
    try:
        import numpy as np

        if isinstance(x, np.ndarray):
            return ["ndarray", str(x.dtype), list(x.shape)]
        if isinstance(x, np.generic):
            return "number"
    except ImportError:
        pass
    if isinstance(x, torch.nn.Module):
        return ["module", _qual(x), {k: sig(v, depth + 1) for k, v in x.state_dict().items()}]
    if isinstance(x, torch.optim.Optimizer):
        return ["optimizer", _qual(x), sig(x.state_dict(), depth + 1)]
    if getattr(type(x), "__rw_unresolved__", False):
        d = x.__dict__
        if "_parameters" in d and "_modules" in d:  # a pickled nn.Module of an unimportable class
            flat = {}

            def walk(m, prefix):
                md = getattr(m, "__dict__", {})
                for k, v in (md.get("_parameters") or {}).items():
                    if v is not None:
                        flat[prefix + k] = sig(v, depth + 1)
                for k, v in (md.get("_buffers") or {}).items():
                    if v is not None and k not in (md.get("_non_persistent_buffers_set") or ()):
                        flat[prefix + k] = sig(v, depth + 1)
                for k, v in (md.get("_modules") or {}).items():
                    if v is not None:
                        if isinstance(v, torch.nn.Module):
                            for kk, vv in v.state_dict().items():
                                flat[f"{prefix}{k}.{kk}"] = sig(vv, depth + 1)
                        else:
                            walk(v, f"{prefix}{k}.")

            walk(x, "")
            return ["module", f"{type(x).__module__}.{type(x).__name__}", flat]
        return ["object", f"{type(x).__module__}.{type(x).__name__}", sig(d, depth + 1)]
    if isinstance(x, dict):
        return ["dict", {f"{type(k).__name__}:{k}": sig(v, depth + 1) for k, v in x.items()}]
    if isinstance(x, (list, tuple)):
        if all(isinstance(v, numbers.Number) for v in x):
            return [type(x).__name__ + "-of-numbers"]  # histories: their length follows the step count
        return [type(x).__name__, [sig(v, depth + 1) for v in x]]
    if isinstance(x, bool) or x is None:
        return type(x).__name__
    if isinstance(x, numbers.Number):
        return "number"
    if isinstance(x, (str, bytes)):
        return type(x).__name__
    return ["object", _qual(x)]


def main() -> int:
    out, files = sys.argv[1], sys.argv[2:]
    sys.path.insert(0, os.getcwd())  # the script's folder: its own modules unpickle as themselves
    res = {}
    for f in files:
        try:
            obj = torch.load(f, map_location="cpu", weights_only=False, pickle_module=tolerant)
            res[f] = {"ok": True, "sig": sig(obj), "pg": torch.distributed.is_initialized()}
        except Exception as e:  # noqa: BLE001 - every failure is the answer
            res[f] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
    with open(out, "w") as fh:
        json.dump(res, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
