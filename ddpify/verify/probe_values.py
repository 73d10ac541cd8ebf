"""The probe's look at values: batches, model inputs, saved objects, and which writes are the script's.

Part of the probe (see probe.py): the standard library and torch only, never ddpify. Every
function here takes whatever the script hands over (nested structures, PackedSequence, None,
strings, sparse, complex or nested tensors) and never raises on it.
"""

from __future__ import annotations

import os
import re
import tempfile

# Packages whose own writes are caches, compiled kernels or a tracker's files, not the script's
# outputs: the direct caller of open() being one of these makes the write theirs.
LIBRARY_WRITERS = (
    "torch._inductor", "torch._dynamo", "torch._functorch", "torch.compiler", "torch.utils.cpp_extension",
    "torch._export", "torch.hub", "triton", "wandb", "mlflow", "comet_ml", "neptune", "clearml", "aim",
    "swanlab", "huggingface_hub", "filelock", "torch.utils._triton",
)  # fmt: skip
# tempfile's names: a prefix ("tmp" by default) and 8 random characters of its alphabet; past
# another prefix, a mix of letters and digits (about 1 name in 12 holds no digit: not required
# after "tmp").
TEMP_NAME = re.compile(
    r"tmp[a-z0-9_]{8}|.*[-_.](?=[0-9_]{0,7}[a-z])(?=[a-z_]{0,7}\d)[a-z0-9_]{8}"
)


def cache_roots() -> list[str]:
    home = os.path.expanduser("~")
    roots = [
        os.path.join(home, ".cache"),
        os.path.join(home, ".triton"),
        os.environ.get("XDG_CACHE_HOME", ""),
    ]
    roots += [
        os.environ.get(k, "")
        for k in (
            "TORCHINDUCTOR_CACHE_DIR",
            "TRITON_CACHE_DIR",
            "TORCH_HOME",
            "HF_HOME",
        )
    ]
    return [os.path.realpath(r) for r in roots if r]


_CACHES: list[str] | None = None
_HERE = os.path.dirname(os.path.realpath(__file__))
_TEMP = os.path.realpath(tempfile.gettempdir())


def outside_write(
    full: str, caller_module: str, by_user: bool, homes: tuple[str, ...] = ()
) -> str | None:
    """Why a write is not one of the script's outputs (a library's cache, a tracker's temporary
    media), or None when it is. `homes`: the working directory and the script's folder, whose
    files are the script's even where they lie in the temporary directory."""
    global _CACHES
    if _CACHES is None:
        _CACHES = cache_roots()
    if caller_module and any(
        caller_module == p or caller_module.startswith(p + ".") for p in LIBRARY_WRITERS
    ):
        return f"written by {caller_module}"
    if any(full.startswith(r + os.sep) for r in _CACHES) or "/torchinductor_" in full:
        return "a cache directory"
    if (
        not by_user
        and full.startswith(_TEMP + os.sep)
        and not any(h and full.startswith(h + os.sep) for h in homes)
    ):
        rel = os.path.relpath(full, _TEMP).split(os.sep)
        if any(
            TEMP_NAME.fullmatch(part) or part.startswith("torchinductor")
            for part in rel[:-1]
        ):
            return f"a library's temporary folder ({caller_module or '?'})"
    return None


# ------------------------------------------------------------------------ batches and inputs


def batch_len(x, depth: int = 0):
    """Samples in a batch: the first dimension of its first tensor."""
    import torch

    try:
        if isinstance(x, torch.Tensor):
            return int(x.shape[0]) if x.dim() else 1
        if depth > 3 or isinstance(x, (str, bytes)):
            return None
        if isinstance(x, (list, tuple)) and x:
            return batch_len(x[0], depth + 1)
        if isinstance(x, dict) and x:
            return batch_len(next(iter(x.values())), depth + 1)
    except Exception:
        return None
    return None


def _tensor_print(t, digits: int | None = 6) -> list:
    import torch

    shape = list(t.shape)
    t = t.detach()
    if t.layout == torch.sparse_coo:
        t = t.coalesce().values()
    elif t.layout != torch.strided:  # CSR/CSC/BSR, jagged: their stored values
        t = t.values()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.is_quantized:
        t = t.dequantize()
    flat = t.reshape(-1)
    sample = flat[:: max(1, flat.numel() // 65536)].double()
    total, size = float(sample.sum()), float(sample.abs().sum())
    if digits is None:
        return [shape, total, size]
    return [shape, round(total, digits), round(size, digits)]


def sums(t) -> tuple[float, float] | None:
    """(sum, sum of magnitudes) of a strided sample of a tensor, unrounded; None when unreadable."""
    try:
        _, total, size = _tensor_print(t, None)
        return total, size
    except Exception:
        return None


def fingerprint(data, depth: int = 0):
    """Shape and sums of a strided sample of the batch's first tensor: equal batches give equal
    prints. A value that holds no tensor gives None; one that cannot be read, its type's name."""
    import torch

    try:
        if isinstance(data, torch.Tensor):
            return _tensor_print(data)
        if depth >= 3 or isinstance(data, (str, bytes)) or data is None:
            return None
        if isinstance(
            data, (list, tuple)
        ):  # PackedSequence is a tuple: its .data comes first
            for item in data[:8]:
                found = fingerprint(item, depth + 1)
                if found is not None:
                    return found
            return None
        if isinstance(data, dict):
            for item in list(data.values())[:8]:
                found = fingerprint(item, depth + 1)
                if found is not None:
                    return found
    except Exception:
        return [type(data).__name__]
    return None


def shuffles(sampler) -> bool | None:
    name = type(sampler).__name__
    if hasattr(sampler, "shuffle"):
        return bool(sampler.shuffle)
    if name in ("RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler"):
        return True
    if name == "SequentialSampler":
        return False
    return None


def flat_indices(idx) -> list:
    if isinstance(idx, (list, tuple)):
        return [_one_index(i) for i in idx]
    return [_one_index(idx)]


def _one_index(i):
    try:
        return int(i)
    except (TypeError, ValueError):
        return repr(i)[:80]


def device_uuid(index) -> str:
    import torch

    try:
        return str(torch.cuda.get_device_properties(index).uuid)
    except Exception:
        return f"cuda:{index}"


# ------------------------------------------------------------------------ saved objects


def find_state_dicts(obj, where: str, depth: int, out: list) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    if len(out) >= 8 or depth > 3:
        return
    if isinstance(obj, DistributedDataParallel):
        out.append((where or "<object>", obj))
        return
    if isinstance(obj, dict) and obj:
        if all(isinstance(k, str) for k in obj) and all(
            isinstance(v, torch.Tensor) for v in obj.values()
        ):
            out.append((where or "<object>", obj))
            return
        for k, v in list(obj.items())[:64]:
            if isinstance(v, (dict, list, tuple, DistributedDataParallel)):
                find_state_dicts(v, f"{where}[{k!r}]", depth + 1, out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj[:16]):
            find_state_dicts(v, f"{where}[{i}]", depth + 1, out)


def model_keys(module) -> dict[str, list[int]]:
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


def compare_keys(saved: dict, model: dict) -> dict:
    if saved == model:
        return {"verdict": "loads"}
    prefixed = all(k.startswith("module.") for k in saved)
    stripped = {k[len("module.") :]: v for k, v in saved.items()} if prefixed else saved
    if not set(stripped) & set(model):
        return {"verdict": "unknown"}  # another model's, or not a model's state dict
    if prefixed and stripped == model:
        return {"verdict": "module-prefix"}
    missing = sorted(set(model) - set(stripped))
    unexpected = sorted(set(stripped) - set(model))
    shapes = [
        f"{k}: saved {stripped[k]}, model {model[k]}"
        for k in sorted(set(stripped) & set(model))
        if stripped[k] != model[k]
    ]
    if not prefixed and not shapes and not (missing and unexpected):
        return {
            "verdict": "partial"
        }  # a part of the model (a submodule, or the model inside a larger dict)
    return {
        "verdict": "module-prefix" if prefixed else "mismatch",
        "missing": missing[:5],
        "n_missing": len(missing),
        "unexpected": unexpected[:5],
        "n_unexpected": len(unexpected),
        "shapes": shapes[:5],
    }


_RANK_ORDER = {
    "loads": 0,
    "partial": 1,
    "module-prefix": 2,
    "mismatch": 3,
    "unknown": 4,
}


def inspect_saved(obj, ddp_modules: list) -> list[dict]:
    """Each state dict inside what torch.save got, and whether it loads into the unwrapped model."""
    from torch.nn.parallel import DistributedDataParallel

    found: list[tuple[str, object]] = []
    find_state_dicts(obj, "", 0, found)
    models = [model_keys(m) for m in ddp_modules]
    out = []
    for where, sd in found[:8]:
        if isinstance(sd, DistributedDataParallel):
            out.append({"at": where, "verdict": "ddp-object", "keys": 0})
            continue
        if not isinstance(sd, dict):
            continue
        keys = {k: list(v.shape) for k, v in sd.items()}
        info = {
            "at": where,
            "keys": len(keys),
            "sample": list(keys)[:3],
            "verdict": "unknown",
        }
        # Several models (a GAN's two): judged against the one it fits best.
        verdicts = [compare_keys(keys, model) for model in models]
        if verdicts:
            info.update(
                min(
                    verdicts,
                    key=lambda v: (
                        _RANK_ORDER[v["verdict"]],
                        v.get("n_missing", 0)
                        + v.get("n_unexpected", 0)
                        + len(v.get("shapes", [])),
                    ),
                )
            )
        out.append(info)
    return out


# ------------------------------------------------------------------------ the final record


def unused_params(ddp_modules: list, error: str) -> list[str]:
    """Module paths of the parameters DDP says got no gradient (its message gives indices only)."""
    m = re.search(r"did not receive grad for rank \d+:\s*([\d ,]+)", error)
    indices = [int(x) for x in re.findall(r"\d+", m.group(1))] if m else []
    names = []
    for module in ddp_modules:
        # DDP numbers the parameters that require grad, in named_parameters() order.
        trainable = [n for n, p in module.named_parameters() if p.requires_grad]
        if indices:
            names.extend(trainable[i] for i in indices if i < len(trainable))
        else:
            names.extend(
                n
                for n, p in module.named_parameters()
                if p.requires_grad and p.grad is None
            )
    return names


def device_info(params: list) -> dict:
    import torch

    info: dict = {"params": sorted({str(p.device) for p in params})}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        info["cuda_current"] = torch.cuda.current_device()
        info["cuda_count"] = torch.cuda.device_count()
        peak, ids = {}, {}
        for d in range(torch.cuda.device_count()):
            peak[d] = torch.cuda.max_memory_allocated(d)
            if peak[d]:
                ids[d] = device_uuid(d)
        info["cuda_peak"] = peak
        info["cuda_ids"] = ids
        used = {p.device for p in params if p.device.type == "cuda"}
        info["cuda_param_ids"] = {str(d): device_uuid(d.index) for d in used}
    return info


def imported_modules(environ) -> dict:
    """Project mode: how many modules came from the converted copies, and which, wrongly, from the
    user's own project (an import path verify did not point at the copies)."""
    import sys

    originals, copies = (
        environ.get("DDPIFY_VERIFY_ORIGINAL_ROOT", ""),
        environ.get("DDPIFY_VERIFY_USER_ROOT", ""),
    )
    found: dict = {"copies": 0, "originals": []}
    if not originals or not copies:
        return found
    originals, copies = (
        os.path.realpath(originals) + os.sep,
        os.path.realpath(copies) + os.sep,
    )
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if (
            not isinstance(f, str)
            or not f.endswith(".py")
            or not os.path.isabs(f)
            or not os.path.isfile(f)
        ):
            continue  # builtins and torch's generated modules carry a bare name
        real = os.path.realpath(f)
        if os.path.dirname(real) == _HERE:
            continue  # the probe itself (a project around ddpify's own checkout)
        if real.startswith(copies):
            found["copies"] += 1
        elif real.startswith(originals) and not any(
            p in real for p in ("site-packages", "dist-packages")
        ):
            if len(found["originals"]) < 20:
                found["originals"].append(real)
    return found
