"""Load torch files in a plain process (no process group, no torchrun variables) and print
their structure as JSON: python loadcheck.py --root DIR FILE... [--root DIR FILE...]

Each --root group is loaded in a child process of its own (forked after torch's import), with
that folder as its working directory and first on sys.path, so a model class of the project
unpickles as it would for a user there.

A class the file names from `__main__` (the script that saved it) is rebuilt as a placeholder
that keeps its state, so a pickled model loads without running the script; every other class is
imported for real, so a pickled DistributedDataParallel fails here as it fails for a user."""

import json
import os
import pickle
import sys


class Placeholder:
    def __init__(self, *a, **k):
        self.__dict__["_state"] = None

    def __setstate__(self, state):
        self.__dict__["_state"] = state


def _placeholder(module: str, name: str):
    return type(name, (Placeholder,), {"_shapes_qualname": f"{module}.{name}"})


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "__main__":
            return _placeholder(module, name)
        return super().find_class(module, name)


class _PickleModule:
    Unpickler = _Unpickler
    load = staticmethod(pickle.load)
    __name__ = "shapes_pickle"


def summary(obj, torch, depth=0):
    if depth > 12:
        return "..."
    if isinstance(obj, torch.Tensor):
        return ["T", list(obj.shape)]
    if isinstance(obj, torch.nn.Module):
        # its state walked as _module_state walks a placeholder's: a torch module may hold one
        state = _module_state(obj.__dict__)
        return [
            "M",
            f"{type(obj).__module__}.{type(obj).__qualname__}",
            summary(state, torch, depth + 1),
        ]
    if isinstance(obj, Placeholder):
        st = obj.__dict__.get("_state")
        return [
            "M",
            type(obj)._shapes_qualname,
            summary(_module_state(st), torch, depth + 1),
        ]
    if isinstance(obj, dict):
        return {
            "D": {
                str(k): summary(v, torch, depth + 1) for k, v in list(obj.items())[:200]
            }
        }
    if isinstance(obj, (list, tuple)):
        return ["L", [summary(v, torch, depth + 1) for v in list(obj)[:50]]]
    return type(obj).__name__


def _module_state(st, prefix=""):
    """A placeholder module's parameters and buffers by dotted name, as a state dict has them."""
    out = {}
    if not isinstance(st, dict):
        return out
    for kind in ("_parameters", "_buffers"):
        for k, v in (st.get(kind) or {}).items():
            if v is not None:
                out[prefix + k] = v
    for k, sub in (st.get("_modules") or {}).items():
        if isinstance(sub, Placeholder):
            out.update(_module_state(sub.__dict__.get("_state"), prefix + k + "."))
        elif sub is not None and hasattr(sub, "__dict__"):
            out.update(_module_state(sub.__dict__, prefix + k + "."))
    return out


def load_all(root: str, files: list[str]) -> dict:
    sys.path.insert(0, root)
    os.chdir(root)
    import torch

    out = {}
    for f in files:
        try:
            obj = torch.load(
                f, map_location="cpu", weights_only=False, pickle_module=_PickleModule
            )
            out[f] = {"ok": True, "summary": summary(obj, torch)}
        except Exception as exc:
            out[f] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
    return out


def main() -> None:
    for var in (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "LOCAL_WORLD_SIZE",
    ):
        os.environ.pop(var, None)
    groups: list[tuple[str, list[str]]] = []
    for a in sys.argv[1:]:
        if a == "--root":
            groups.append(("", []))
        elif groups and not groups[-1][0]:
            groups[-1] = (a, [])
        else:
            groups[-1][1].append(a)
    import torch  # noqa: F401  (once, before the forks)

    results = []
    for root, files in groups:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                data = json.dumps(load_all(root, files)).encode()
            except BaseException as exc:
                data = json.dumps(
                    {
                        f: {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                        for f in files
                    }
                ).encode()
            with os.fdopen(w, "wb") as fw:
                fw.write(data)
            os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as fr:
            data = fr.read()
        os.waitpid(pid, 0)
        results.append(json.loads(data or b"{}"))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
