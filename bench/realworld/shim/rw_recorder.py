"""Per-process write log for the real-world corpus harness (never part of ddpify).

Loaded by shim/sitecustomize.py when RW_WRITE_LOG names a folder. Every process of a run (the
one-process original, each torchrun rank, their DataLoader workers) appends one JSON line per
write to RW_WRITE_LOG/writes-<pid>.jsonl: files opened for writing (`open`, `io.open`, `os.open`,
logging's file handlers), `torch.save` targets, and `os.rename`/`os.replace` destinations. Each
line carries the process's RANK (torchrun sets it; "single" without it) so that the harness can
judge "only rank 0 wrote" itself, independently of `ddpify verify`, and find every file that
`torch.save` wrote to load it again in a plain process.

Writes made by C code that bypasses Python's file objects (h5py, native torch writers given an
open file descriptor) are not seen; torch.save is hooked by name for that reason.
"""

from __future__ import annotations

import builtins
import importlib.abc
import importlib.machinery
import io
import json
import os
import sys

_DIR = os.environ.get("RW_WRITE_LOG", "")
_RANK = os.environ.get("RANK", "single")
_fd: int | None = None
_fd_pid: int | None = None
_busy = False


def _log(kind: str, path) -> None:
    """Append one record; never raises (the script must run exactly as without the recorder)."""
    global _fd, _fd_pid, _busy
    if _busy or not _DIR:
        return
    _busy = True
    try:
        if isinstance(path, int):
            return  # an inherited descriptor: no path to judge
        p = os.fspath(path)
        if isinstance(p, bytes):
            p = p.decode(errors="replace")
        pid = os.getpid()
        if _fd is None or _fd_pid != pid:  # a forked worker writes its own file
            _fd = os.open(os.path.join(_DIR, f"writes-{pid}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            _fd_pid = pid
        rec = {"rank": os.environ.get("RANK", _RANK), "pid": pid, "kind": kind, "path": os.path.abspath(p)}
        os.write(_fd, (json.dumps(rec) + "\n").encode())
    except Exception:
        pass
    finally:
        _busy = False


def _writes_mode(mode) -> bool:
    return isinstance(mode, str) and any(c in mode for c in "wax+")


_open = builtins.open


def _rec_open(file, mode="r", *args, **kwargs):
    if _writes_mode(mode):
        _log("open", file)
    return _open(file, mode, *args, **kwargs)


_os_open = os.open
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _rec_os_open(path, flags, *args, **kwargs):
    if flags & _WRITE_FLAGS:
        _log("os.open", path)
    return _os_open(path, flags, *args, **kwargs)


def _wrap_move(name: str):
    orig = getattr(os, name)

    def move(src, dst, *args, **kwargs):
        _log(name, dst)
        return orig(src, dst, *args, **kwargs)

    return move


def _patch_torch_serialization(mod) -> None:
    orig = mod.save

    def save(obj, f, *args, **kwargs):
        target = f if isinstance(f, (str, bytes, os.PathLike)) else getattr(f, "name", None)
        if isinstance(target, (str, bytes, os.PathLike)):
            _log("torch.save", target)
        return orig(obj, f, *args, **kwargs)

    save.__wrapped__ = orig
    mod.save = save


def _patch_logging(mod) -> None:
    # logging.FileHandler keeps its own reference to open, taken when logging is imported
    if hasattr(mod, "FileHandler"):
        mod.FileHandler._builtin_open = staticmethod(_rec_open)


class _After(importlib.abc.Loader):
    def __init__(self, inner, patch):
        self.inner, self.patch = inner, patch

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        try:
            self.patch(module)
        except Exception:
            pass


_PATCHES = {"torch.serialization": _patch_torch_serialization, "logging": _patch_logging}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _After(spec.loader, patch)
        return spec


def install() -> None:
    if not _DIR:
        return
    builtins.open = _rec_open
    io.open = _rec_open
    os.open = _rec_os_open
    os.rename = _wrap_move("rename")
    os.replace = _wrap_move("replace")
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, _Finder())
