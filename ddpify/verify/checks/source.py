"""The files the ranks ran: each read and parsed once per run, the questions the checks ask of
their code (the `if` around a line, the loop a `break` leaves, the calls that write files), and
where each line is in the user's own files.

The candidate runs verify's converted copy, whose lines differ from the user's file. Every
location in a message is the user's file and its line there; a line that only the conversion
has is given as "converted line N, added after line M" (`ddpify --diff` shows it).
"""

from __future__ import annotations

import ast
import difflib
import os
import re


class Sources:
    def __init__(self, copies: dict[str, tuple[str, str]] | None = None, roots: dict[str, str] | None = None,
                 user_root: str | None = None) -> None:  # fmt: skip
        """copies: {converted file: (the user's file, its original text)}; roots: {folder of the
        copies: the user's project folder} (project mode: every file of the tree is copied);
        user_root: the folder names are shown relative to (the project root, or the script's folder)."""
        self.copies = {os.path.realpath(k): v for k, v in (copies or {}).items()}
        self.roots = [
            (os.path.realpath(k), os.path.realpath(v)) for k, v in (roots or {}).items()
        ]
        self.user_root = os.path.realpath(user_root) if user_root else None
        self._texts: dict[str, str | None] = {}
        self._trees: dict[str, ast.Module | None] = {}
        self._maps: dict[str, list[tuple[int, bool]]] = {}

    # ---------------------------------------------------------------- reading, once

    def text(self, path: str) -> str | None:
        key = os.path.realpath(path)
        if key not in self._texts:
            try:
                with open(key, encoding="utf-8") as f:
                    self._texts[key] = f.read()
            except (OSError, UnicodeDecodeError, ValueError):
                self._texts[key] = None
        return self._texts[key]

    def tree(self, path: str) -> ast.Module | None:
        key = os.path.realpath(path)
        if key not in self._trees:
            text = self.text(key)
            try:
                self._trees[key] = ast.parse(text) if text is not None else None
            except (SyntaxError, ValueError):
                self._trees[key] = None
        return self._trees[key]

    def line_text(self, path: str, line: int) -> str:
        lines = (self.text(path) or "").splitlines()
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""

    # ---------------------------------------------------------------- the user's file and line

    def user_file(self, path: str) -> str:
        real = os.path.realpath(path)
        if real in self.copies:
            return self.copies[real][0]
        for copy, user in self.roots:
            if real.startswith(copy + os.sep):
                return user + real[len(copy) :]
        return path

    def copy_of(self, user_path: str) -> str:
        """The file the candidate ran in place of the user's file (itself when not copied)."""
        real = os.path.realpath(user_path)
        for copy, (user, _) in self.copies.items():
            if os.path.realpath(user) == real:
                return copy
        for copy, user in self.roots:
            if real.startswith(user + os.sep):
                return copy + real[len(user) :]
        return user_path

    def is_copy(self, path: str) -> bool:
        return self.user_file(path) != path

    def locate(self, path: str, line: int) -> tuple[str, int, bool]:
        """(the user's file, its line, whether the conversion added this line: then the line
        of the user's file it follows)."""
        real = os.path.realpath(path)
        if real not in self.copies:
            return self.user_file(path), line, False
        if real not in self._maps:
            self._maps[real] = line_map(self.copies[real][1], self.text(real) or "")
        mapping = self._maps[real]
        user = self.copies[real][0]
        if 0 < line <= len(mapping):
            orig, added = mapping[line - 1]
            return user, orig, added
        return user, line, True

    def converted_lines(self, path: str, line: int) -> list[int]:
        """The lines of the converted file `path` that are (or changed) the user's `line`."""
        real = os.path.realpath(path)
        if real not in self.copies:
            return [line]
        self.locate(path, 1)
        return [
            j + 1
            for j, (orig, added) in enumerate(self._maps[real])
            if orig == line and not added
        ]

    def name(self, path: str) -> str:
        user = os.path.realpath(self.user_file(path))
        if self.user_root and user.startswith(self.user_root + os.sep):
            return os.path.relpath(user, self.user_root)
        return os.path.basename(user)

    def line(self, path: str, line: int) -> str:
        """ "line M" of the user's file; a line the conversion added: "converted line N, added after line M"."""
        _, orig, added = self.locate(path, line)
        if added:
            return (
                f"converted line {line}, added after line {orig}"
                if orig
                else f"converted line {line}, added at the top"
            )
        return f"line {orig}"

    def where(self, path: str, line: int) -> str:
        _, orig, added = self.locate(path, line)
        if added:
            return f"{self.name(path)}, {self.line(path, line)}"
        return f"{self.name(path)}:{orig}"

    def rewrite(self, text: str) -> str:
        """A traceback or a stack dump, with the copies' locations as the user's."""

        def one(m: re.Match) -> str:
            path, line = m["file"], int(m["line"])
            if not self.is_copy(path):
                return m[0]
            user, orig, added = self.locate(path, line)
            return f'File "{user}", ' + (
                self.line(path, line) if added else f"line {orig}"
            )

        return _FRAME_REF.sub(one, text)

    # ---------------------------------------------------------------- questions about the code

    def enclosing_if(
        self, path: str, line: int, rank_only: bool = False
    ) -> tuple[int, str] | None:
        """The innermost `if` whose body holds `line` (with rank_only, whose test mentions a rank,
        e.g. `if rank == 0:`): (its line, its test)."""
        tree, source = self.tree(path), self.text(path)
        if tree is None or source is None:
            return None
        found = None
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and node.body:
                start, end = (
                    node.body[0].lineno,
                    max(getattr(n, "end_lineno", 0) or 0 for n in node.body),
                )
                if start <= line <= end and (found is None or node.lineno > found[0]):
                    test = ast.get_source_segment(source, node.test) or ""
                    if not rank_only or re.search(r"rank|is_main|master", test, re.I):
                        found = (node.lineno, test)
        return found

    def loop_left_by_break(
        self, path: str, out_line: int, in_line: int
    ) -> tuple | None:
        """A loop that holds in_line but not out_line, in out_line's function, and the break that
        leaves it: (loop line, its head, break line, the `if` around the break)."""
        tree, source = self.tree(path), self.text(path)
        if tree is None or source is None:
            return None
        scope = _scope_of(tree, out_line)
        loops = [
            n
            for n in ast.walk(scope)
            if isinstance(n, _LOOPS) and _spans(n, in_line) and not _spans(n, out_line)
        ]
        loops = [n for n in loops if _scope_of(tree, n.lineno) is scope]
        # The outermost: leaving an inner loop only goes on with the outer one.
        for loop in sorted(loops, key=lambda n: n.lineno):
            breaks = _owned_breaks(loop)
            if breaks:
                head = (
                    (ast.get_source_segment(source, loop) or "").splitlines()[0].strip()
                )
                brk = breaks[0]
                return (
                    loop.lineno,
                    head,
                    brk.lineno,
                    self.enclosing_if(path, brk.lineno),
                )
        return None

    def write_sites(self, path: str) -> list[tuple[int, str]]:
        """Calls that write a file: torch.save, open(..., "w"/"a"/"x"), savefig, to_csv, ..."""
        tree = self.tree(path)
        if tree is None:
            return []
        sites = []
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = (
                f.attr
                if isinstance(f, ast.Attribute)
                else f.id
                if isinstance(f, ast.Name)
                else ""
            )
            if name == "open":
                mode = (
                    node.args[1]
                    if len(node.args) > 1
                    else next((k.value for k in node.keywords if k.arg == "mode"), None)
                )
                if (
                    isinstance(mode, ast.Constant)
                    and isinstance(mode.value, str)
                    and any(c in mode.value for c in "wax")
                ):
                    sites.append((node.lineno, f"open({mode.value!r})"))
            elif name in _WRITERS:
                base = (
                    ast.unparse(f.value) + "." if isinstance(f, ast.Attribute) else ""
                )
                if (
                    name == "save"
                    and base not in ("torch.", "")
                    and not base.startswith(("np.", "numpy."))
                ):
                    continue
                sites.append((node.lineno, f"{base}{name}"))
        return sorted(set(sites))


_FRAME_REF = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
_WRITERS = (
    "save",
    "save_image",
    "savefig",
    "to_csv",
    "savez",
    "savez_compressed",
    "write_text",
    "write_bytes",
    "dump",
)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def line_map(original: str, converted: str) -> list[tuple[int, bool]]:
    """For each line of the converted text: (the original's line, False), or (the original line it
    follows, True) for a line the conversion added. Indentation is ignored (a line the conversion
    moved under an `if` is the same line); a changed line maps to the most similar original line
    of its block."""
    a = [s.strip() for s in original.splitlines()]
    b = [s.strip() for s in converted.splitlines()]
    out: list[tuple[int, bool] | None] = [None] * len(b)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for k in range(j2 - j1):
                out[j1 + k] = (i1 + k + 1, False)
        elif tag == "replace" and (i2 - i1) * (j2 - j1) <= 20_000:
            for j in range(j1, j2):
                scored = [
                    (difflib.SequenceMatcher(None, a[i], b[j]).ratio(), i)
                    for i in range(i1, i2)
                    if b[j]
                ]
                best = max(scored, default=(0.0, 0))
                if best[0] >= 0.6:
                    out[j] = (best[1] + 1, False)
    last = 0
    for j, entry in enumerate(out):
        if entry is None:
            out[j] = (last, True)
        else:
            last = entry[0]
    return out  # type: ignore[return-value]


def _spans(node, line: int) -> bool:
    return node.lineno <= line <= (getattr(node, "end_lineno", None) or node.lineno)


def _owned_breaks(loop) -> list:
    """The `break` statements that leave this loop (not an inner one)."""
    found, todo = [], list(loop.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Break):
            found.append(node)
        elif not isinstance(node, (*_LOOPS, *_SCOPES)):
            todo.extend(ast.iter_child_nodes(node))
        elif isinstance(node, _LOOPS):
            todo.extend(node.orelse)  # a nested loop's else: belongs to this loop
    return sorted(found, key=lambda n: n.lineno)


def _scope_of(tree, line: int):
    best = tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _spans(
            node, line
        ):
            if best is tree or node.lineno > best.lineno:
                best = node
    return best
