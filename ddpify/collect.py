"""Which files a command line names: paths and directories (searched for *.py like black and
ruff: hidden, virtual-environment, build and .gitignore'd paths skipped), stdin, the excludes of
the configuration, and each file's options ([tool.ddpify], the project's line length)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ddpify import gitignore
from ddpify.config import Config, ConfigError, config_for, find_config, matches_any
from ddpify.formatting import line_length_for
from ddpify.options import Options

# Directories never entered when recursing (hidden ones, starting with ".", are skipped too).
SKIP_DIRS = frozenset(
    {
        "__pycache__",
        "__pypackages__",
        "venv",
        "env",
        "site-packages",
        "node_modules",
        "build",
        "dist",
        "_build",
        "buck-out",
    }
)
NOTEBOOK_ERROR = "notebooks are not converted: export it to a script first (jupyter nbconvert --to script)"


@dataclass(frozen=True)
class Job:
    path: str  # as shown to the user; "-" (or --stdin-filename) for stdin
    options: Options | None = None
    error: str | None = None  # found while collecting paths: reported as is
    stdin: bool = False
    passthrough: bool = (
        False  # stdin excluded by --force-exclude: echoed unchanged, like black
    )


def _dedupe_key(path: str) -> str:
    return os.path.realpath(path)


def _is_venv(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "pyvenv.cfg"))


def collect(
    paths: tuple[str, ...],
    cli_exclude: tuple[str, ...],
    force_exclude: bool,
    stdin_filename: str | None,
    overrides: dict,
) -> tuple[list[Job], list[str]]:
    """Jobs sorted by path, and warnings. Config errors become error jobs (exit 2)."""
    jobs: dict[str, Job] = {}
    warnings_: list[str] = []
    cwd = os.getcwd()

    def add(path: str, explicit: bool) -> None:
        key = _dedupe_key(path)
        if key in jobs:
            return  # a file given twice (or reached twice) is processed once
        if explicit and path.endswith(".ipynb"):
            jobs[key] = Job(path, error=f"{path}: error: {NOTEBOOK_ERROR}")
            return
        try:
            cfg = config_for(path)
        except ConfigError as exc:
            jobs[key] = Job(path, error=f"{exc}")
            return
        excluded = matches_any(path, cli_exclude, cwd) or cfg.excludes(path)
        if excluded and (not explicit or force_exclude or cfg.force_exclude):
            return
        jobs[key] = Job(path, options=cfg.options(**_with_length(overrides, path)))

    for raw in paths:
        if raw == "-":
            if "-" not in jobs:
                try:
                    cfg = (
                        config_for(stdin_filename)
                        if stdin_filename
                        else config_for(None)
                    )
                    excluded = (
                        bool(stdin_filename)
                        and (force_exclude or cfg.force_exclude)
                        and (
                            matches_any(stdin_filename, cli_exclude, cwd)
                            or cfg.excludes(stdin_filename)
                        )
                    )
                    options = cfg.options(**_with_length(overrides, stdin_filename))
                    jobs["-"] = Job(
                        stdin_filename or "-",
                        options=options,
                        stdin=True,
                        passthrough=excluded,
                    )
                except ConfigError as exc:
                    jobs["-"] = Job(stdin_filename or "-", error=f"{exc}", stdin=True)
            continue
        if os.path.isdir(raw):
            found = _walk(raw, cli_exclude, cwd, add, jobs)
            if not found:
                warnings_.append(f"{raw}: warning: no Python files found")
            continue
        add(raw, explicit=True)
    ordered = sorted(jobs.values(), key=lambda j: (not j.stdin, j.path))
    return ordered, warnings_


def _with_length(overrides: dict, path: str | None) -> dict:
    """--line-length, else the project's (ruff's or black's configuration), for this file."""
    return {
        **overrides,
        "line_length": overrides.get("line_length") or line_length_for(path),
    }


def _walk(top: str, cli_exclude: tuple[str, ...], cwd: str, add, jobs: dict) -> int:
    before = len(jobs)
    for dirpath, dirnames, filenames in os.walk(
        top
    ):  # does not follow directory symlinks
        try:
            cfg: Config = find_config(os.path.abspath(dirpath))
        except ConfigError as exc:
            jobs.setdefault(exc.path, Job(exc.path, error=str(exc)))
            dirnames[:] = []
            continue
        keep = []
        for d in sorted(dirnames):
            full = os.path.join(dirpath, d)
            if d.startswith(".") or d in SKIP_DIRS or _is_venv(full):
                continue
            if (
                matches_any(full, cli_exclude, cwd)
                or cfg.excludes(full)
                or gitignore.ignored(full, is_dir=True)
            ):
                continue
            keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            if not name.endswith(".py") or name.startswith("."):
                continue
            full = os.path.normpath(
                os.path.join(dirpath, name)
            )  # "./a.py" -> "a.py", like black
            if not os.path.exists(full) or gitignore.ignored(full, is_dir=False):
                continue  # a broken symlink, or a file .gitignore excludes
            add(full, explicit=False)
    return len(jobs) - before
