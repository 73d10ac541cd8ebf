"""[tool.ddpify] in pyproject.toml: defaults for the command line, found like ruff finds its own.

The closest pyproject.toml that has a [tool.ddpify] table, walking up from the file's directory
(the working directory for stdin), applies to that file. Flags on the command line override it.

    [tool.ddpify]
    amp = "bf16"            # auto | bf16 | fp16 | none | apex
    sync-bn = true
    shard-eval = false
    opt-level = "O1"        # apex only
    exclude = ["legacy/", "**/gen_*.py"]
    force-exclude = false   # also exclude matching files named on the command line
    ignore = ["DDP027"]     # codes never reported (so never blocking), like ruff's ignore
    writers = ["mylib.io.dump_results"]  # functions that write files: rank 0 alone calls them
    optimize = true         # --optimize: every verified-safe speed-up, or a list of some
    keep-global-batch = true  # batch_size / WORLD_SIZE per rank: the global batch stays
    scale-lr = "linear"     # or: lr x WORLD_SIZE for the larger global batch (not both)
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import lru_cache

from ddpify.options import (
    AMP_CHOICES,
    OPT_LEVELS,
    SCALE_LR_CHOICES,
    Options,
    parse_optimize,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    try:
        import tomli as tomllib
    except ImportError:
        tomllib = None

_KEYS = {
    "amp",
    "sync-bn",
    "shard-eval",
    "opt-level",
    "exclude",
    "force-exclude",
    "ignore",
    "writers",
    "optimize",
    "keep-global-batch",
    "scale-lr",
}
# the two ways to keep the single-GPU dynamics exclude each other: one given on the command line
# replaces the other from the configuration
_DYNAMICS = ("keep_global_batch", "scale_lr")


class ConfigError(Exception):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: error: {message}")
        self.path = path


@dataclass(frozen=True)
class Config:
    path: str | None = None  # the pyproject.toml, None when there is none
    root: str = "."  # directory the exclude globs are relative to
    values: dict = field(default_factory=dict)  # option name (snake_case) -> value
    exclude: tuple[str, ...] = ()
    force_exclude: bool = False

    def options(self, **overrides) -> Options:
        """Options from this config; overrides that are not None win (the command line)."""
        values = dict(self.values)
        extra = overrides.get("ignore") or ()
        values.update({k: v for k, v in overrides.items() if v is not None})
        if extra:  # --ignore adds to the config's list, like ruff's --extend-ignore
            values["ignore"] = tuple(self.values.get("ignore", ())) + tuple(extra)
        for key, other in (_DYNAMICS, _DYNAMICS[::-1]):
            if overrides.get(key) and overrides.get(other) is None:
                values.pop(other, None)
        return Options(**values)

    def excludes(self, path: str) -> bool:
        return bool(self.exclude) and matches_any(path, self.exclude, self.root)


def matches_any(path: str, patterns: tuple[str, ...] | list[str], root: str) -> bool:
    """gitignore-like matching of `path` against globs relative to `root`.

    A glob without "/" matches any one path component ("build", "*_old.py"); one with "/" matches
    the path relative to root or any of its parent directories ("legacy/", "src/**/gen_*.py").
    """
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    if rel == "." or rel.startswith(".." + os.sep) or rel == "..":
        return False
    parts = rel.replace(os.sep, "/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for raw in patterns:
        pattern = raw.strip()
        if pattern.startswith("./"):
            pattern = pattern[2:]
        pattern = pattern.rstrip("/")
        if not pattern:
            continue
        if "/" not in pattern:
            if any(fnmatchcase(part, pattern) for part in parts):
                return True
            continue
        alternatives = (
            [pattern, pattern[3:]] if pattern.startswith("**/") else [pattern]
        )
        if any(fnmatchcase(p, alt) for p in prefixes for alt in alternatives):
            return True
    return False


def _parse_table(path: str, table: dict) -> Config:
    unknown = sorted(k for k in table if k.replace("_", "-") not in _KEYS)
    if unknown:
        raise ConfigError(
            path,
            f"unknown key {unknown[0]!r} in [tool.ddpify] (known: {', '.join(sorted(_KEYS))})",
        )
    norm = {k.replace("_", "-"): v for k, v in table.items()}
    values: dict = {}
    if "amp" in norm:
        if norm["amp"] not in AMP_CHOICES:
            raise ConfigError(
                path,
                f"[tool.ddpify] amp must be one of {', '.join(AMP_CHOICES)}, not {norm['amp']!r}",
            )
        values["amp"] = norm["amp"]
    if "opt-level" in norm:
        if norm["opt-level"] not in OPT_LEVELS:
            raise ConfigError(
                path,
                f"[tool.ddpify] opt-level must be one of {', '.join(OPT_LEVELS)}, not {norm['opt-level']!r}",
            )
        values["opt_level"] = norm["opt-level"]
    for key in ("sync-bn", "shard-eval", "force-exclude", "keep-global-batch"):
        if key in norm and not isinstance(norm[key], bool):
            raise ConfigError(
                path, f"[tool.ddpify] {key} must be true or false, not {norm[key]!r}"
            )
    for key in ("sync-bn", "shard-eval", "keep-global-batch"):
        if key in norm:
            values[key.replace("-", "_")] = norm[key]
    if "scale-lr" in norm:
        if norm["scale-lr"] not in SCALE_LR_CHOICES:
            raise ConfigError(
                path,
                f"[tool.ddpify] scale-lr must be one of {', '.join(SCALE_LR_CHOICES)}, not {norm['scale-lr']!r}",
            )
        values["scale_lr"] = norm["scale-lr"]
    if values.get("keep_global_batch") and values.get("scale_lr"):
        raise ConfigError(
            path,
            "[tool.ddpify] keep-global-batch and scale-lr exclude each other: set one",
        )
    if "ignore" in norm:
        codes = norm["ignore"]
        if not isinstance(codes, list) or not all(
            isinstance(c, str) and re.fullmatch(r"DDP\d{3}", c.strip().upper())
            for c in codes
        ):
            raise ConfigError(
                path, '[tool.ddpify] ignore must be a list of codes such as "DDP027"'
            )
        values["ignore"] = tuple(codes)
    writers = norm.get("writers", [])
    if not isinstance(writers, list) or not all(
        isinstance(w, str) and w for w in writers
    ):
        raise ConfigError(
            path,
            '[tool.ddpify] writers must be a list of function names ("mylib.dump_results")',
        )
    if writers:
        values["writers"] = tuple(writers)
    if "optimize" in norm:
        value = norm["optimize"]
        if not isinstance(value, (bool, list)):
            raise ConfigError(
                path,
                "[tool.ddpify] optimize must be true, false or a list of speed-ups",
            )
        try:
            values["optimize"] = parse_optimize(value)
        except ValueError as exc:
            raise ConfigError(path, f"[tool.ddpify] {exc}") from None
    exclude = norm.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(g, str) for g in exclude):
        raise ConfigError(path, "[tool.ddpify] exclude must be a list of glob strings")
    return Config(
        path,
        os.path.dirname(path),
        values,
        tuple(exclude),
        bool(norm.get("force-exclude", False)),
    )


def read_toml(path: str) -> dict:
    """A TOML file's document; {} where it cannot be read (other tools' files: not ours to judge)."""
    if tomllib is None:
        return {}
    try:
        with open(path, "rb") as f:
            doc = tomllib.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def load_pyproject(path: str) -> Config | None:
    """The [tool.ddpify] table of one pyproject.toml, or None when it has none."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ConfigError(path, f"cannot read: {exc.strerror or exc}") from None
    if tomllib is None:
        if b"[tool.ddpify" in raw:
            raise ConfigError(
                path,
                "reading [tool.ddpify] on Python 3.10 needs tomli: pip install tomli",
            )
        return None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(path, f"invalid TOML: {exc}") from None
    table = (
        doc.get("tool", {}).get("ddpify") if isinstance(doc.get("tool"), dict) else None
    )
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(path, "[tool.ddpify] must be a table")
    return _parse_table(path, table)


@lru_cache(maxsize=None)
def find_config(directory: str) -> Config:
    """The config that applies to files in `directory` (an absolute path)."""
    candidate = os.path.join(directory, "pyproject.toml")
    if os.path.isfile(candidate):
        found = load_pyproject(candidate)
        if found is not None:
            return found
    parent = os.path.dirname(directory)
    if parent == directory:
        return Config()
    return find_config(parent)


def config_for(path: str | None) -> Config:
    """Config for a file (None: stdin, looked up from the working directory)."""
    start = os.getcwd() if path is None else os.path.dirname(os.path.abspath(path))
    return find_config(start)
