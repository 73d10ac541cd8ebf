"""The probe's look at the whole model state: every module the script holds, found by walking the
objects it holds (the locals of its frames, `self` attributes, containers, the main module's
globals), whatever wraps it: a `DDP(model)` wrapper counts as its module, and a module that
`replicate()` made distributed in place (class `DDP<Name>`) as itself. Its parameters and buffers
are dumped at the end and at each checkpoint, for the parent to compare across ranks (EMA and
momentum copies, teachers, anything no optimizer steps).

Part of the probe (see probe.py): the standard library and torch only, never ddpify.
"""

from __future__ import annotations

import math
import re
import sys
import types

MAX_ROOTS = 64  # modules (and state dicts) kept per dump
MAX_DEPTH = 3  # attribute / container levels walked below a name the script holds
MAX_ITEMS = 64  # items looked at in one container or object
MAX_NUMEL = 16_000_000  # values dumped per moment; above, an evenly strided sample of each tensor
MAX_CHECKPOINTS = 4  # checkpoints whose model state is compared across ranks
PER_RANK_KEYS = ("running_mean", "running_var", "num_batches_tracked")
# a dict of tensors is a model's state (an EMA kept as a state dict) when its keys read like one
_STATE_KEY = re.compile(r"(^|\.)(weight|bias|running_mean|running_var)$")
# objects never walked into: data, optimisers, generators, code
_SKIP_TYPES = ("Dataset", "DataLoader", "Sampler", "Optimizer", "Generator", "Tensor")


def replicated_module(ddp_module):
    """The module replicate() made distributed, when DDP is being built inside it: replicate hands
    DDP a ParameterList of the module's parameters, and holds the module itself on its state."""
    f = sys._getframe(1)
    for _ in range(12):
        if f is None:
            return None
        owner = f.f_locals.get("self")
        if f.f_code.co_name == "init" and type(owner).__name__ == "_ReplicateState":
            return f.f_locals.get("module")
        f = f.f_back
    return None


def _is_state_dict(obj) -> bool:
    import torch

    if not isinstance(obj, dict) or not obj or len(obj) > 100_000:
        return False
    keys = list(obj)[:MAX_ITEMS]
    return (
        all(isinstance(k, str) for k in keys)
        and all(isinstance(obj[k], torch.Tensor) for k in keys)
        and any(_STATE_KEY.search(k) for k in keys)
    )


def _plain_type(obj) -> bool:
    return isinstance(
        obj,
        (
            str,
            bytes,
            int,
            float,
            complex,
            bool,
            type(None),
            types.ModuleType,
            types.FunctionType,
            types.BuiltinFunctionType,
            types.MethodType,
            type,
        ),
    )


class Finder:
    """Walks what the script holds, outermost names first, and keeps each module once, under the
    first name it was found by; a module inside another one found is part of that one's state."""

    def __init__(self) -> None:
        self.found: list[tuple[str, object]] = []
        self.seen: set[int] = set()
        self.names: set[str] = set()
        self.scope = ""  # the function whose locals are walked: names a duplicate name

    def visit(self, name: str, obj, depth: int = 0) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel

        if len(self.found) >= MAX_ROOTS or _plain_type(obj) or id(obj) in self.seen:
            return
        self.seen.add(id(obj))
        if isinstance(obj, DistributedDataParallel):
            obj = obj.module
            if id(obj) in self.seen:
                return
            self.seen.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            self.add(name, obj)
            return
        if depth >= MAX_DEPTH:
            return
        if isinstance(obj, dict):
            if _is_state_dict(obj):
                self.add(name, obj)
                return
            for k, v in list(obj.items())[:MAX_ITEMS]:
                if isinstance(k, (str, int)):
                    self.visit(f"{name}[{k!r}]", v, depth + 1)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj[:MAX_ITEMS]):
                self.visit(f"{name}[{i}]", v, depth + 1)
        elif any(c.__name__ in _SKIP_TYPES for c in type(obj).__mro__):
            return
        else:
            attrs = getattr(obj, "__dict__", None)
            if isinstance(attrs, dict):
                for k, v in list(attrs.items())[:MAX_ITEMS]:
                    self.visit(f"{name}.{k}", v, depth + 1)

    def add(self, name: str, obj) -> None:
        if (
            name in self.names and self.scope
        ):  # another object of that name: a helper's local
            name = f"{self.scope}:{name}"
        if name in self.names:
            return  # named alike on every rank or not at all: comparing it could pair the wrong ones
        self.names.add(name)
        self.found.append((name, obj))

    def roots(self) -> list[tuple[str, object]]:
        """The modules found, less those inside another one found (their state is in it)."""
        import torch

        inner: set[int] = set()
        for _, obj in self.found:
            if isinstance(obj, torch.nn.Module):
                inner.update(id(m) for m in obj.modules() if m is not obj)
        return [(n, o) for n, o in self.found if id(o) not in inner]


def find_roots(user_frames: list, main_globals: dict | None, known: list) -> list:
    """(name, module or state dict) for everything the script holds: the frames' locals (the
    outermost frame first), the main module's globals, then what the probe met before."""
    finder = Finder()
    for frame in user_frames:
        finder.scope = frame.f_code.co_name
        for name, value in list(frame.f_locals.items()):
            if not name.startswith("__"):
                finder.visit(name, value)
    finder.scope = "<module>"
    for name, value in list((main_globals or {}).items()):
        if not name.startswith("__"):
            finder.visit(name, value)
    finder.scope = ""
    for name, value in known:
        finder.visit(name, value)
    return finder.roots()


def _kinds(module, ddp_ids: dict[int, bool]) -> dict[int, str]:
    """Each buffer's kind, by id: "stats" for a norm layer's running statistics (per rank without
    SyncBatchNorm), "broadcast" for a buffer DDP overwrites from rank 0 at every forward."""
    import torch
    from torch.nn.modules.batchnorm import _NormBase

    out: dict[int, str] = {}

    def walk(m, broadcast: bool) -> None:
        broadcast = broadcast or ddp_ids.get(id(m), False)
        per_rank = isinstance(m, _NormBase) and not isinstance(
            m, torch.nn.SyncBatchNorm
        )
        for b in m._buffers.values():
            if b is not None:
                out[id(b)] = "stats" if per_rank else ("broadcast" if broadcast else "")
        for child in m._modules.values():
            if child is not None:
                walk(child, broadcast)

    walk(module, False)
    return out


def state_entries(
    roots: list, ddp_ids: dict[int, bool], stepped: set[int]
) -> list[tuple[str, str, object]]:
    """(dotted name, kind, tensor) for every parameter and buffer of the roots, in order; a
    parameter an optimizer steps is "param:stepped"."""
    import torch

    out = []
    for root, obj in roots:
        if isinstance(obj, torch.nn.Module):
            kinds = _kinds(obj, ddp_ids)
            for n, p in obj.named_parameters(remove_duplicate=True):
                kind = "param:stepped" if id(p) in stepped else "param"
                out.append((f"{root}.{n}", kind, p))
            for n, b in obj.named_buffers(remove_duplicate=True):
                out.append((f"{root}.{n}", "buffer:" + kinds.get(id(b), ""), b))
        else:  # a dict of weights: a norm layer's running statistics are per rank there too
            for k, v in list(obj.items()):
                stats = k.endswith(PER_RANK_KEYS)
                out.append((f"{root}[{k!r}]", "buffer:stats" if stats else "state", v))
    return out


def dump_state(
    roots: list, ddp_ids: dict[int, bool], stepped: set[int], path: str, save
) -> dict:
    """Write the roots' state (float64, on the CPU, strided past MAX_NUMEL) with `save`; a summary."""
    import torch

    entries = [
        (n, k, t)
        for n, k, t in state_entries(roots, ddp_ids, stepped)
        if isinstance(t, torch.Tensor) and t.layout == torch.strided
    ]
    total = sum(t.numel() for _, _, t in entries)
    stride = max(1, math.ceil(total / MAX_NUMEL))
    index, parts = [], []
    with torch.no_grad():
        for name, kind, t in entries:
            x = t.detach().reshape(-1)[::stride]
            if x.is_complex():
                x = torch.view_as_real(x).reshape(-1)
            x = x.to("cpu", torch.float64)
            index.append((name, kind, list(t.shape), x.numel()))
            parts.append(x)
    flat = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
    save({"index": index, "flat": flat}, path)
    held = {name for name, _, _, _ in index}
    return {
        "roots": [  # what holds a tensor (a loss module holds none)
            n
            for n, _ in roots
            if any(h == n or h.startswith((n + ".", n + "[")) for h in held)
        ],
        "tensors": len(index),
        "numel": total,
        "stride": stride,
    }


class StateWatch:
    """When to dump the model state, on every rank alike: at the end, and at each checkpoint. Only
    rank 0 saves one, so it leaves a marker file when it does; every rank dumps before its next
    optimizer step (DDP keeps the ranks within one step of each other, so the marker is there
    by then), when the parameters are still those the checkpoint holds."""

    def __init__(self, probe) -> None:
        self.probe = probe
        self.known: list[
            tuple[str, object]
        ] = []  # found before: the end still sees them
        self.ddp_ids: dict[int, bool] = {}  # a module DDP holds -> broadcast_buffers
        self.saves = 0
        self.marks = 0
        self.dumps = 0

    def active(self) -> bool:
        return self.probe.world_size > 1

    def note_ddp(self, module, broadcast) -> None:
        self.ddp_ids[id(module)] = bool(broadcast)
        self.known.append((f"ddp_model{len(self.ddp_ids)}", module))

    def discover(self) -> list:
        if not self.active():
            return []
        main = sys.modules.get("__main__")
        roots = find_roots(
            self.probe.user_frames(), getattr(main, "__dict__", None), self.known
        )
        ids = {id(o) for _, o in roots}
        self.known = (roots + [k for k in self.known if id(k[1]) not in ids])[
            :MAX_ROOTS
        ]
        return roots

    def _marker(self, n: int) -> str:
        import os

        return os.path.join(os.path.dirname(self.probe.prefix), f"checkpoint{n}")

    def on_save(self, obj, entry: dict) -> None:
        """Rank 0's torch.save of a model or its state: mark the moment for every rank."""
        import torch

        p = self.probe
        if not self.active() or p.rank != 0 or self.saves >= MAX_CHECKPOINTS:
            return
        if not entry.get("state_dicts") and not isinstance(obj, torch.nn.Module):
            return
        self.saves += 1
        path = self._marker(self.saves)
        with p.real_open(path + ".tmp", "w") as f:
            f.write(f"{p.step}\t{entry.get('where') or ''}")
        import os

        os.replace(path + ".tmp", path)

    def _pending(self, ready_only: bool = True) -> list[tuple[int, str]]:
        """The checkpoints rank 0 marked that this rank has reached: it has taken as many steps
        as rank 0 had when it saved (a rank behind sees the marker a step early)."""
        import os

        out = []
        while self.marks < MAX_CHECKPOINTS and os.path.exists(
            self._marker(self.marks + 1)
        ):
            try:
                with self.probe.real_open(self._marker(self.marks + 1)) as f:
                    step, _, where = f.read().partition("\t")
                step = int(step)
            except (OSError, ValueError):
                return out
            if ready_only and step > self.probe.step:
                return out
            self.marks += 1
            out.append((step, where))
        return out

    def before_step(self) -> None:
        if not self.active():
            return
        for step, where in self._pending():
            self.dump("checkpoint", self.marks, step, where)

    def at_end(self) -> None:
        if not self.active():
            return
        pending = self._pending(ready_only=False)
        self.dump("end", 0, self.probe.step, "; ".join(w for _, w in pending))

    def dump(self, tag: str, n: int, step: int, where: str) -> None:
        p = self.probe
        if (
            tag == "end"
        ):  # the frames are gone: what was found, and the main module's globals
            main = sys.modules.get("__main__")
            roots = find_roots([], getattr(main, "__dict__", None), self.known)
        else:
            roots = self.discover()
        path = f"{p.prefix}.state{self.dumps}.pt"
        self.dumps += 1
        import torch

        p.in_probe = True
        stepped = {
            id(x) for opt in p.optimizers for g in opt.param_groups for x in g["params"]
        }
        try:
            summary = dump_state(
                roots, self.ddp_ids, stepped, path, p.real_save or torch.save
            )
        finally:
            p.in_probe = False
        p.record["states"].append(
            {"tag": tag, "n": n, "step": step, "where": where, "file": path, **summary}
        )
