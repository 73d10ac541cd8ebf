"""Paths a repository's .gitignore files exclude, skipped when ddpify recurses, like black and ruff.

The .gitignore of every directory from the repository's root (the nearest folder above with .git,
else with pyproject.toml) down to the one being walked applies, with git's rules: a pattern without
a slash matches a name at any depth below its file, one with a slash is anchored to its file's
folder, a trailing slash matches folders only, `*`/`?`/`[...]` stay within a path component, `**`
spans folders, `!` re-includes, and the last pattern that matches wins (a deeper file's after a
higher one's). .git/info/exclude counts as the root's. Files named on the command line are
converted whatever .gitignore says, as excludes are.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache


def _glob(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 2 if pattern.startswith("**", i) else 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 2 :]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1 : end]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif pattern[i] == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def parse(text: str) -> list[tuple[re.Pattern, bool, bool]]:
    """(regex on the path relative to the file's folder, negated, folders only) per pattern."""
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip("\n\r")
        if not line.strip() or line.startswith("#"):
            continue
        if not line.endswith("\\ "):
            line = line.rstrip(" ")
        negated = line.startswith("!")
        if negated:
            line = line[1:]
        elif line.startswith(("\\!", "\\#")):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        body = _glob(line.lstrip("/"))
        rules.append(
            (
                re.compile(("^" if anchored else "^(?:.*/)?") + body + "$", re.S),
                negated,
                dir_only,
            )
        )
    return rules


@lru_cache(maxsize=None)
def _rules_in(directory: str) -> tuple:
    rules = []
    for name in (".gitignore", os.path.join(".git", "info", "exclude")):
        try:
            with open(
                os.path.join(directory, name), encoding="utf-8", errors="replace"
            ) as f:
                rules += parse(f.read())
        except OSError:
            continue
    return tuple(rules)


@lru_cache(maxsize=None)
def root_of(directory: str) -> str | None:
    """The repository's root above `directory` (absolute), or None outside any project."""
    for marker in (".git", "pyproject.toml"):
        cur = directory
        while True:
            if os.path.exists(os.path.join(cur, marker)):
                return cur
            parent = os.path.dirname(cur)
            if parent == cur:
                break
            cur = parent
    return None


def ignored(path: str, is_dir: bool) -> bool:
    """Whether the .gitignore files above `path` exclude it."""
    full = os.path.abspath(path)
    root = root_of(os.path.dirname(full))
    if root is None:
        return False
    folders, cur = [], os.path.dirname(full)
    while True:
        folders.append(cur)
        if cur == root or os.path.dirname(cur) == cur:
            break
        cur = os.path.dirname(cur)
    verdict = False
    for folder in reversed(
        folders
    ):  # the root's file first: a deeper file's patterns win
        rel = os.path.relpath(full, folder).replace(os.sep, "/")
        for regex, negated, dir_only in _rules_in(folder):
            if (is_dir or not dir_only) and regex.match(rel):
                verdict = not negated
    return verdict


def clear() -> None:
    _rules_in.cache_clear()
    root_of.cache_clear()
