"""The files the baseline leaves behind: removed before the candidate runs, so that both start from
the same files (a cache or a prepared dataset the baseline built would let the candidate skip
building its own, and hide a race in it). Nothing the baseline did not write is touched."""

from __future__ import annotations

import os
from pathlib import Path

_SNAPSHOT_LIMIT = 200_000  # paths: a data tree larger than this is not walked


def snapshot(roots: list[Path]) -> set[str] | None:
    """Every path under roots (the working directory, the script's folder); None when too many."""
    seen: set[str] = set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            seen.add(dirpath)
            seen.update(os.path.join(dirpath, n) for n in dirnames + filenames)
            if len(seen) > _SNAPSHOT_LIMIT:
                return None
    return seen


def remove_new(
    before: set[str] | None, roots: list[Path], writes: list[dict]
) -> tuple[list[str], list[str]]:
    """Remove the files the baseline wrote that were not there before it (under the roots by the
    snapshot, elsewhere as the probe saw them created), then the folders that appeared under the
    roots and are empty now. (files removed, folders removed)."""
    written = {os.path.realpath(w["path"]) for w in writes}
    created = {os.path.realpath(w["path"]) for w in writes if w.get("new")}
    after = snapshot(roots) if before is not None else None
    new = sorted((after or set()) - (before or set()), key=len, reverse=True)
    files, folders = [], []
    for p in sorted(
        {p for p in new if os.path.realpath(p) in written and not os.path.isdir(p)}
        | created
    ):
        try:
            if os.path.isfile(p) or os.path.islink(p):
                os.remove(p)
                files.append(p)
        except OSError:
            pass
    for p in new:
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                os.rmdir(p)  # only emptied folders
                folders.append(p)
        except OSError:
            pass
    return files, folders


def written_files(writes: list[dict]) -> int:
    """How many files the baseline wrote: the count the `saved` row compares."""
    return len({os.path.realpath(w["path"]) for w in writes})
