"""Before anything runs: torch is there, and the script is converted into verify's run folder.

A single script is converted to one temporary copy. A project (the entry imports local modules)
is converted as one program, and its whole tree is mirrored into the run folder: every Python
file copied (converted where the conversion changed it), everything else linked, so that a
module imported lazily inside a function, a data file next to the code or a package reached
through PYTHONPATH=. all resolve inside the copy. The ranks are then pointed at the copy
(probe.use_converted_copies), never at the user's unconverted files.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


class CannotRun(Exception):
    """The script could not be run at all (exit status 2)."""


def torch_missing() -> str | None:
    if importlib.util.find_spec("torch") is not None:
        return None
    return (f"torch is not installed in this Python ({sys.executable}): verify runs the script with it. Install the "
            "torch build for this machine into the same environment as ddpify (a machine without a GPU: pip install "
            "torch --index-url https://download.pytorch.org/whl/cpu), then run verify again")  # fmt: skip


@dataclass
class Prepared:
    """What the ranks run, and how its files relate to the user's."""

    status: str  # the conversion's status, or --no-convert
    exec_path: str  # the file the candidate runs
    main_file: str  # its __file__ (the user's file for a single copy: the script's own folder stays first on sys.path)
    copies: dict[str, tuple[str, str]] = field(
        default_factory=dict
    )  # converted copy -> (user's file, original text)
    roots: dict[str, str] = field(
        default_factory=dict
    )  # project mode: the mirrored tree -> the user's project
    user_root: str = ""  # the project's root (project mode) or the script's folder
    converted: bool = False


def convert_single(
    script: Path, source: str, options, converter: Callable | None
) -> tuple[str | None, str]:
    """(converted source or None to run the file as it is, conversion status)."""
    if converter is None:
        from ddpify import convert_source as converter
    from ddpify import ConversionError

    try:
        result = converter(source, options, path=str(script))
    except NotImplementedError:
        raise CannotRun(
            "the converter is not available in this build; run an already-distributed script with --no-convert"
        ) from None
    except ConversionError as exc:
        raise CannotRun(exc.format(str(script))) from None
    except Exception as exc:  # a converter bug: say so instead of a bare traceback
        where = traceback.extract_tb(exc.__traceback__)[-1]
        raise CannotRun(
            f"the converter failed on {script}: {type(exc).__name__}: {exc} "
            f"(at {os.path.basename(where.filename)}:{where.lineno}; please report it)"
        ) from None
    if result.status == "not-training":
        raise CannotRun(
            f"{script}: not a training script (no optimizer step found): nothing to verify"
        )
    if result.status == "refused":
        why = "; ".join(f.format(str(script)) for f in result.blocking)
        raise CannotRun(
            f"ddpify refused to convert {script} (blocking findings: fix them by hand or suppress one with `# ddpify: ignore[CODE]` on its line): {why}"
        )
    if result.status == "already-distributed" or not result.changed:
        return None, result.status
    try:
        compile(result.source, str(script), "exec", dont_inherit=True)
    except SyntaxError as exc:
        lines = result.source.splitlines()
        # Not exc.text: Python reads that line from the original file, which has the same name.
        code = (
            lines[exc.lineno - 1] if exc.lineno and exc.lineno <= len(lines) else ""
        ).strip()
        raise CannotRun(
            f"converter failure: the converted script does not compile ({exc.msg}, line {exc.lineno}"
            + (f": `{code}`" if code else "")
            + f"); {script} itself is untouched. Please report it (ddpify --diff shows the conversion)"
        ) from None
    return result.source, result.status


def prepare(
    script: Path, options, run_dir: Path, convert: bool, converter: Callable | None
) -> Prepared:
    """Convert the script (or project) into run_dir; what the candidate then runs."""
    here = str(script.parent)
    if not convert:
        return Prepared("--no-convert", str(script), str(script), user_root=here)
    project = (
        _project(script, options, run_dir / "project") if converter is None else None
    )
    if project is not None:
        return project
    source = script.read_text()
    converted, status = convert_single(script, source, options, converter)
    if converted is None:
        return Prepared(status, str(script), str(script), user_root=here)
    exec_path = str(run_dir / f"{script.stem}.ddp.py")
    Path(exec_path).write_text(converted)
    return Prepared(
        status,
        exec_path,
        str(script),
        copies={exec_path: (str(script), source)},
        user_root=here,
        converted=True,
    )


def _project(script: Path, options, into: Path) -> Prepared | None:
    """Project mode: convert the project, mirror its tree under `into`, the converted files in
    place of the originals. None for a single script."""
    from ddpify.project import convert_project, is_project

    if not is_project(str(script)):
        return None
    result = convert_project(str(script), options)
    if result.status == "not-training":
        raise CannotRun(
            f"{script}: not a training script (no optimizer step found in it or its local modules): nothing to verify"
        )
    if result.blocking:
        why = "; ".join(
            f.format(os.path.relpath(r.path, result.root))
            for r in result.files
            for f in r.findings
            if f.blocking
        )
        raise CannotRun(
            f"ddpify refused to convert the project of {script} (blocking findings): {why}"
        )
    if not any(r.changed for r in result.files):
        return Prepared(result.status, str(script), str(script), user_root=result.root)
    mirror(result.root, str(into))
    copies = {}
    for r in result.files:
        target = into / os.path.relpath(r.path, result.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        target.write_text(r.output)
        if r.changed:
            copies[str(target)] = (r.path, r.source)
    entry = str(into / os.path.relpath(result.entry, result.root))
    return Prepared(
        result.status,
        entry,
        entry,
        copies,
        {str(into): result.root},
        result.root,
        converted=True,
    )


# Folders never mirrored: version control, caches, virtual environments and installed packages.
_SKIPPED = {
    "__pycache__",
    "node_modules",
    "site-packages",
    "dist-packages",
    "__pypackages__",
}
_PEEK = 2000  # entries looked at to tell whether a folder holds Python code


def _holds_python(folder: str) -> bool:
    todo, seen = [folder], 0
    while todo and seen < _PEEK:
        try:
            with os.scandir(todo.pop()) as it:
                for e in it:
                    seen += 1
                    if e.name.endswith(".py"):
                        return True
                    if (
                        e.is_dir(follow_symlinks=False)
                        and not e.name.startswith(".")
                        and e.name not in _SKIPPED
                    ):
                        todo.append(e.path)
                    if seen >= _PEEK:
                        break
        except OSError:
            continue
    return False


def mirror(src: str, dst: str) -> None:
    """Copy every Python file of src's tree to dst and link everything else: folders without
    Python code (data, configs, outputs) as a whole. Hidden folders, virtual environments and
    caches are left out."""
    os.makedirs(dst, exist_ok=True)
    stop = os.path.realpath(dst)
    with os.scandir(src) as it:
        entries = list(it)
    for e in entries:
        target = os.path.join(dst, e.name)
        if os.path.lexists(target):
            continue
        if e.is_dir(follow_symlinks=False):
            real = os.path.realpath(e.path)
            if (
                e.name.startswith(".")
                or e.name in _SKIPPED
                or real == stop
                or stop.startswith(real + os.sep)
            ):
                continue
            if os.path.exists(os.path.join(e.path, "pyvenv.cfg")):
                continue
            if _holds_python(e.path):
                mirror(e.path, target)
            else:
                os.symlink(real, target)
        elif e.name.endswith(".py") and e.is_file():
            shutil.copyfile(e.path, target)
        else:
            os.symlink(os.path.realpath(e.path), target)
