"""every module: each module of the project that the program imports at top level is among the
files the conversion read, whatever makes it importable: a package, a folder without
__init__.py, a folder the script puts on sys.path. Resolved here on its own (the file system,
the importing file's folder, the entry's folder, the project root, sys.path inserts): a module
the conversion did not read would keep its writes and its loops as they were, on every rank."""

from __future__ import annotations

import ast
import os

from ddpify.rules import declare

declare(
    "DDP155",
    "invariant-every-module",
    "a module of the project that the program imports was not read, so it "
    "would run unconverted on every rank: not converted",
    severity="blocking",
    tool="gate",
)

NOT_LOCAL = ("site-packages", "dist-packages", "__pypackages__", "node_modules")


def _candidates(base: str, parts: list[str]) -> list[str]:
    target = os.path.join(base, *parts)
    return [
        p
        for p in (target + ".py", os.path.join(target, "__init__.py"))
        if os.path.isfile(p)
    ]


def _local(path: str, root: str) -> bool:
    real = os.path.realpath(path)
    try:
        if os.path.commonpath([real, root]) != root:
            return False
    except ValueError:
        return False
    rel = os.path.relpath(real, root).split(os.sep)
    return not any(part in NOT_LOCAL or part.startswith(".") for part in rel[:-1])


def check(
    entry: str, root: str, files: dict[str, str]
) -> list[tuple[str, int, int, str]]:
    """(file, line, col, message) for each top-level import of a read file that reaches a local
    module the conversion did not read; files: real path -> text."""
    from ddpify.analysis.project import path_inserts

    read = set(files)
    out = []
    here = os.path.dirname(os.path.realpath(entry))
    top = here
    while (
        os.path.isfile(os.path.join(top, "__init__.py")) and os.path.dirname(top) != top
    ):
        top = os.path.dirname(top)  # `python -m pkg.mod` runs from above the package
    extra: list[str] = [top]
    for path, text in files.items():
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        extra += path_inserts(tree, path)
    for path, text in files.items():
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        bases = list(dict.fromkeys([os.path.dirname(path), here, root, *extra]))
        for node in tree.body:
            found: list[str] = []
            if isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    for base in bases:
                        found += [
                            c
                            for k in range(1, len(parts) + 1)
                            for c in _candidates(base, parts[:k])
                        ]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    pkg = os.path.dirname(path)
                    for _ in range(node.level - 1):
                        pkg = os.path.dirname(pkg)
                    starts = [pkg]
                else:
                    starts = bases
                parts = (node.module or "").split(".") if node.module else []
                for base in starts:
                    found += [
                        c
                        for k in range(1, len(parts) + 1)
                        for c in _candidates(base, parts[:k])
                    ]
                    found += [
                        c
                        for a in node.names
                        for c in _candidates(os.path.join(base, *parts), [a.name])
                    ]
            for f in found:
                real = os.path.realpath(f)
                if (
                    real in read
                    or not _local(real, root)
                    or os.path.basename(real) == "__init__.py"
                    and os.path.getsize(real) == 0
                ):
                    continue
                rel = os.path.relpath(real, here)
                out.append(
                    (
                        path,
                        node.lineno,
                        node.col_offset + 1,
                        f"every module: `{ast.unparse(node)}` imports {rel}, "
                        "which the conversion did not read, so its code would run unconverted on every rank",
                    )
                )
                break
    return out
