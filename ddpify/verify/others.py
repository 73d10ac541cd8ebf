"""The project's other entry scripts: a conversion that changed a module they share with the
training script (a model's `load()` helper, a data module) must leave them working in a plain
`python` process, as they ran before (an inference or export script is never run under torchrun).

Each other script of the project with a main guard that imports a changed module (directly or
through other modules of the project) runs from verify's converted copy with `--help`, or with its
own dry-run flag when it declares one; when that fails, the same command on the user's project
tells whether it failed before the conversion too.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

MAX_SCRIPTS = 8
TIMEOUT_S = 120.0
# flags a script declares for a run that checks itself without doing the work
DRY_RUN = re.compile(
    r"^--(dry[-_]?run|smoke[-_]?test|smoke|check[-_]?only|sanity[-_]?check)$"
)
_SKIPPED = {
    "__pycache__",
    "node_modules",
    "site-packages",
    "dist-packages",
    "build",
    "dist",
}
# torchrun's variables and verify's own: none of them in a plain `python` run
_STRIPPED = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def _python_files(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames
            if not d.startswith(".") and d not in _SKIPPED
            and not os.path.exists(os.path.join(dirpath, d, "pyvenv.cfg"))
        )  # fmt: skip
        out += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py")]
        if len(out) > 5000:
            break
    return out


def _has_main_guard(tree: ast.Module) -> bool:
    for node in tree.body:
        if (
            isinstance(node, ast.If)
            and "__main__" in ast.unparse(node.test)
            and "__name__" in ast.unparse(node.test)
        ):
            return True
    return False


def _imports(tree: ast.Module, path: Path, root: Path) -> set[Path]:
    """The project's files a module imports (absolute from the root or from its own folder, and
    relative imports), each a module file or a package's __init__.py."""
    found: set[Path] = set()

    def resolve(parts: list[str], bases: list[Path]) -> None:
        for base in bases:
            for k in range(len(parts), 0, -1):
                target = base.joinpath(*parts[:k])
                for cand in (target.with_suffix(".py"), target / "__init__.py"):
                    if cand.is_file():
                        found.add(cand.resolve())
                        # a package import brings its __init__ and the submodule named
                if (target.with_suffix(".py")).is_file() or (
                    target / "__init__.py"
                ).is_file():
                    break

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                resolve(a.name.split("."), [root, path.parent])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                mod = node.module.split(".") if node.module else []
                for a in node.names:
                    resolve(mod + [a.name], [base])
                if mod:
                    resolve(mod, [base])
            elif node.module:
                mod = node.module.split(".")
                for a in node.names:
                    resolve(mod + [a.name], [root, path.parent])
                resolve(mod, [root, path.parent])
    return found


def _flag(tree: ast.Module) -> str:
    """The script's own dry-run flag when it declares one (argparse, click), else --help."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and DRY_RUN.match(node.value)
        ):
            return node.value
    return "--help"


def other_entries(prep) -> list[tuple[Path, Path, str, list[str]]]:
    """(the user's script, its converted copy's path, the flag, the changed modules it reaches)
    for each other entry script of the project that imports a module the conversion changed."""
    if not prep.roots:
        return []
    copy_root, user_root = (Path(p) for p in next(iter(prep.roots.items())))
    user_root = user_root.resolve()
    entry = (user_root / os.path.relpath(prep.exec_path, copy_root)).resolve()
    changed = {Path(user).resolve() for user, _ in prep.copies.values()} - {entry}
    if not changed:
        return []
    trees: dict[Path, ast.Module] = {}
    for f in _python_files(user_root):
        try:
            trees[f.resolve()] = ast.parse(
                f.read_text(encoding="utf-8", errors="replace")
            )
        except (SyntaxError, ValueError, OSError):
            continue
    deps = {f: _imports(t, f, user_root) for f, t in trees.items()}
    out = []
    for f, tree in trees.items():
        if f == entry or f in changed or not _has_main_guard(tree):
            continue
        if f.name.startswith("test_") or "tests" in f.relative_to(user_root).parts[:-1]:
            continue
        seen, todo, reached = {f}, [f], []
        while todo:
            for d in deps.get(todo.pop(), ()):
                if d in changed and d not in reached:
                    reached.append(d)
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        if reached:
            copy = copy_root / f.relative_to(user_root)
            out.append(
                (f, copy, _flag(tree), [str(r.relative_to(user_root)) for r in reached])
            )
    return out[:MAX_SCRIPTS]


def _env(root_from: Path | None = None, root_to: Path | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _STRIPPED and not k.startswith(("DDPIFY_VERIFY", "TORCHELASTIC_"))
    }
    if root_from is not None and root_to is not None and env.get("PYTHONPATH"):
        parts = []
        for part in env["PYTHONPATH"].split(os.pathsep):
            real = os.path.realpath(part or ".")
            if real == str(root_from) or real.startswith(str(root_from) + os.sep):
                part = str(root_to) + real[len(str(root_from)) :]
            parts.append(part)
        env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def _run(script: Path, flag: str, cwd: Path, env: dict[str, str]) -> dict:
    try:
        proc = subprocess.run(
            [sys.executable, str(script), flag], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"exit": None, "error": f"no exit within {TIMEOUT_S:g} s", "output": ""}
    out = (proc.stdout[-2000:] + proc.stderr[-4000:]).strip()
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return {
        "exit": proc.returncode,
        "error": lines[-1][:300] if proc.returncode and lines else "",
        "output": out,
    }


def run_other_scripts(prep, note=lambda msg: None) -> list[dict]:
    """Run each other entry script that imports a changed module, from the converted copy; the
    original too when the copy fails. One dict per script."""
    found = other_entries(prep)
    if not found:
        return []
    copy_root, user_root = (Path(p).resolve() for p in next(iter(prep.roots.items())))
    note(
        f"  other scripts: {len(found)} of the project import a changed module; each runs as plain python ..."
    )
    results = []
    for user, copy, flag, reached in found:
        after = _run(copy, flag, copy_root, _env(user_root, copy_root))
        entry = {
            "script": str(user), "copy": str(copy), "flag": flag, "imports": reached, "after": after,
        }  # fmt: skip
        if after["exit"] != 0:
            entry["before"] = _run(user, flag, user_root, _env())
        results.append(entry)
    return results
