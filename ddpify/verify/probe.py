"""The probe: runs inside every process of a verify run, around the user's script.

    python probe.py EXEC_PATH [SCRIPT_ARGS...]

It installs hooks (optimizer steps, backward passes, DataLoader draws, process-group setup, DDP
construction, file writes, what the script prints), runs EXEC_PATH as ``__main__`` without
editing it, stops it cleanly after K optimizer steps (or K backward passes when the script has no
optimizer), and writes what it saw into DDPIFY_VERIFY_DIR as rank<R>.json (+ rank<R>.params.pt).
The parent process compares the ranks; the probe never runs a collective of its own, so it
cannot hang a healthy run.

Only the standard library and torch are imported here: this file is started by path (torchrun
starts one per rank), so it must not depend on ddpify being importable. Its parts sit next to it:
probe_state.py (the record), probe_hooks.py (the wrappers), probe_values.py (looking at values).
"""

from __future__ import annotations

import builtins
import faulthandler
import os
import signal
import sys
import time
import traceback
import types

_HERE = os.path.dirname(os.path.abspath(__file__))
if __package__:
    from ddpify.verify import probe_hooks as H
    from ddpify.verify import probe_state as S
    from ddpify.verify.probe_values import compare_keys as _compare_keys  # noqa: F401  (tests)
else:  # started by path: load the parts from this folder, then take the folder off the path again
    sys.path.insert(0, _HERE)
    try:
        import probe_hooks as H  # type: ignore[no-redef]
        import probe_state as S  # type: ignore[no-redef]
    finally:
        sys.path.remove(_HERE)
    for _part in (
        "probe_hooks",
        "probe_state",
        "probe_values",
        "probe_models",
    ):  # free the short names for the script's modules
        sys.modules["_ddpify_" + _part] = sys.modules.pop(_part)


def _set_parent_death_signal() -> None:
    # If torchrun (or the verify parent) dies, this rank dies too: no orphan outlives a run.
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _user_traceback(exc: BaseException) -> str:
    """The script's traceback as Python would print it, without the probe's own frames."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    seen = set()
    todo = [te]
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        t.stack = traceback.StackSummary.from_list(
            [
                f
                for f in t.stack
                if not os.path.abspath(f.filename).startswith(S.PROBE_DIR)
            ]
        )
        todo.extend(x for x in (t.__cause__, t.__context__) if x is not None)
    return "".join(te.format())


def _wait_for_all_ranks(probe: S.Probe) -> None:
    # File barrier, no collective: every rank has finished step K (and its gradient all-reduce)
    # before any rank exits, so no peer sees a closed connection mid-collective.
    S.real_open(probe.prefix + ".done", "w").close()
    deadline = time.time() + 600
    while time.time() < deadline:
        if all(
            os.path.exists(os.path.join(S.RUN_DIR, f"rank{r}.done"))
            for r in range(probe.world_size)
        ):
            return
        time.sleep(0.02)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def use_converted_copies(original: str, copy: str) -> list[str]:
    """Project mode: the converted copies live under `copy`, the user's project under `original`.
    Every import path into the project (PYTHONPATH=., a .pth file, an editable install's finder)
    is pointed at the copy, so the ranks import the converted modules, as they will once the
    conversion is applied in place. Returns what was redirected."""
    original, copy = os.path.realpath(original), os.path.realpath(copy)

    def moved(path: str) -> str | None:
        try:
            real = os.path.realpath(path or os.getcwd())
        except OSError:
            return None
        if real == original or real.startswith(original + os.sep):
            target = copy + real[len(original) :]
            # the copy holds the project's code, not a virtual environment or site-packages inside it
            return target if os.path.exists(target) else None
        return None

    done = []
    for i, entry in enumerate(sys.path):
        target = moved(entry) if isinstance(entry, str) else None
        if target is not None and target != entry:
            sys.path[i] = target
            done.append(f"sys.path: {entry} -> {target}")
    # setuptools' editable installs: a finder module whose MAPPING names each package's folder.
    for name, mod in list(sys.modules.items()):
        mapping = (
            getattr(mod, "MAPPING", None) if name.startswith("__editable__") else None
        )
        if isinstance(mapping, dict):
            for pkg, path in list(mapping.items()):
                target = moved(path) if isinstance(path, str) else None
                if target is not None:
                    mapping[pkg] = target
                    done.append(f"editable {pkg}: {path} -> {target}")
    import importlib

    importlib.invalidate_caches()
    sys.path_importer_cache.clear()
    return done


def main(argv: list[str]) -> None:
    if not argv or not S.RUN_DIR:
        sys.stderr.write(
            "usage: DDPIFY_VERIFY_DIR=... python probe.py SCRIPT [ARGS...]\n"
        )
        raise SystemExit(2)
    exec_path = argv[0]
    main_file = S.MAIN_FILE or exec_path
    _set_parent_death_signal()
    rank = S.env_int("RANK", 0)
    # The script's output goes to one file per rank, stdout and stderr interleaved as written.
    out_fd = os.open(
        os.path.join(S.RUN_DIR, f"rank{rank}.out"),
        os.O_WRONLY | os.O_CREAT | os.O_APPEND,
        0o644,
    )
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    stack_file = S.real_open(os.path.join(S.RUN_DIR, f"rank{rank}.stack"), "w")
    # Dumps every thread's Python stack on SIGUSR1 even while the rank is blocked inside a collective.
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    # torchrun stops the other ranks with SIGTERM when one fails: leave their stacks, then die as usual.
    faulthandler.register(signal.SIGTERM, file=stack_file, all_threads=True, chain=True)
    # A fatal signal (a C++ abort in a collective, a segfault) leaves its stack here; the file's
    # time tells which rank died first.
    fatal_file = S.real_open(os.path.join(S.RUN_DIR, f"rank{rank}.fatal"), "w")
    faulthandler.enable(file=fatal_file, all_threads=True)

    # As `python SCRIPT` would: the script's folder first on the path (not the probe's), also while torch imports.
    sys.path[0] = os.path.dirname(os.path.abspath(main_file))
    original = os.environ.get("DDPIFY_VERIFY_ORIGINAL_ROOT")
    redirected = (
        use_converted_copies(original, S.USER_ROOT) if original and S.USER_ROOT else []
    )
    probe = S.Probe(exec_path, main_file)
    if redirected:
        probe.record["redirected"] = redirected[:20]
    probe.save_record()
    H.install(probe)
    H.tee_output(probe)
    probe.milestone()

    with S.real_open(exec_path, "rb") as f:
        source = f.read()
    module = types.ModuleType("__main__")
    module.__dict__.update(
        __file__=main_file,
        __builtins__=builtins,
        __spec__=None,
        __package__=None,
        __cached__=None,
    )
    sys.modules["__main__"] = module
    sys.argv = [main_file, *argv[1:]]

    try:
        code = compile(source, exec_path, "exec", dont_inherit=True)
        exec(code, module.__dict__)
    except S.StopVerify:
        probe.finish("stopped", 0)
        _wait_for_all_ranks(probe)
        _flush()
        os._exit(0)
    except SystemExit as exc:
        code_ = (
            exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        )
        if code_ == 0:
            probe.finish("finished", 0)
            raise
        probe.finish(
            "exited", code_, error=f"SystemExit({exc.code!r})", tb=_user_traceback(exc)
        )
        _flush()
        os._exit(code_)
    except BaseException as exc:
        tb = _user_traceback(exc)
        sys.stderr.write(tb)
        probe.finish("crashed", 1, error=f"{type(exc).__name__}: {exc}", tb=tb)
        _flush()
        os._exit(1)
    probe.finish("finished", 0)


if __name__ == "__main__":
    main(sys.argv[1:])
