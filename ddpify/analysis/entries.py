"""Entry points a project declares: the functions its console scripts start (pyproject.toml's
[project.scripts] and [project.gui-scripts], poetry's scripts, setup.py's and setup.cfg's
console_scripts). Such a function runs after its module is imported, without the module's
`if __name__ == "__main__":` block, so the process group's set-up belongs inside it. Read from
the project's files only; shared by the launch planner and the gate's lifetime invariant."""

from __future__ import annotations

import ast
import configparser
import os
import re

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from ddpify.analysis.project import project_root


def console_functions(path: str) -> list[str]:
    """Functions of this file that the project's console scripts start."""
    if not path or path.startswith("<") or not os.path.isfile(path):
        return []
    root = project_root(path)
    targets = _targets(root)
    rel = os.path.relpath(os.path.realpath(path), root)[:-3].replace(os.sep, ".")
    mods = {rel, rel[4:] if rel.startswith("src.") else rel}
    mods |= {m[: -len(".__init__")] for m in mods if m.endswith(".__init__")}
    out = []
    for t in targets:
        if not isinstance(t, str) or ":" not in t:
            continue
        mod, func = (x.strip() for x in t.split(":", 1))
        if mod in mods:
            out.append(func.split(".")[0].split("[")[0].strip())
    return out


# the three files' texts -> their entry points: a run over many files of one project parses
# them once (reading them again is cheap; an edited file gives a new key)
_TARGETS: dict[tuple, list] = {}


def _targets(root: str) -> list:
    texts = []
    for name in ("pyproject.toml", "setup.py", "setup.cfg"):
        try:
            with open(os.path.join(root, name), "rb") as f:
                texts.append(f.read())
        except OSError:
            texts.append(None)
    key = (root, *texts)
    got = _TARGETS.get(key)
    if got is None:
        if len(_TARGETS) >= 64:
            _TARGETS.clear()
        got = _TARGETS[key] = _read_targets(root)
    return got


def _read_targets(root: str) -> list:
    """The `module:function` targets of the project's console and GUI scripts."""
    targets: list = []
    try:
        with open(os.path.join(root, "pyproject.toml"), "rb") as f:
            data = tomllib.load(f)
        project = data.get("project", {})
        targets += list(project.get("scripts", {}).values()) + list(
            project.get("gui-scripts", {}).values()
        )
        targets += list(
            data.get("tool", {}).get("poetry", {}).get("scripts", {}).values()
        )
    except (OSError, tomllib.TOMLDecodeError, AttributeError):
        pass
    try:
        with open(os.path.join(root, "setup.py"), encoding="utf-8") as f:
            text = f.read()
        targets += re.findall(r"""["'][\w.-]+\s*=\s*([\w.]+\s*:\s*[\w.]+)["']""", text)
    except OSError:
        pass
    cfg = configparser.ConfigParser()
    try:
        cfg.read(os.path.join(root, "setup.cfg"), encoding="utf-8")
        if cfg.has_option("options.entry_points", "console_scripts"):
            targets += [
                ln.split("=", 1)[1]
                for ln in cfg.get(
                    "options.entry_points", "console_scripts"
                ).splitlines()
                if "=" in ln
            ]
    except configparser.Error:
        pass
    return targets


# decorators that run their function when the file is run as a script, with no call of it:
# sacred's `@ex.automain` (ex = Experiment(...)); its `@ex.main` runs from ex.run_commandline()
RUN_BY_DECORATOR = {"automain": ("sacred.Experiment", "sacred.experiment.Experiment")}


def run_by_decorator(body: list[ast.stmt]) -> list[str]:
    """Module-level functions of these statements that a decorator runs when the file is run
    (`@ex.automain def main(...)`): like a console script's function, the process group lives
    inside them."""
    imports: dict[str, str] = {}
    made: dict[str, str] = {}  # name -> the class it is an instance of
    for node in body:
        if isinstance(node, ast.Import):
            for a in node.names:
                imports[a.asname or a.name.split(".")[0]] = (
                    a.name if a.asname else a.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                imports[a.asname or a.name] = f"{node.module}.{a.name}"
        elif (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            made[node.targets[0].id] = _qualname(node.value.func, imports)
    out = []
    for node in body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for d in node.decorator_list:
            if (
                isinstance(d, ast.Attribute)
                and isinstance(d.value, ast.Name)
                and made.get(d.value.id, "") in RUN_BY_DECORATOR.get(d.attr, ())
            ):
                out.append(node.name)
    return out


def _qualname(node: ast.AST, imports: dict[str, str]) -> str:
    if isinstance(node, ast.Name):
        return imports.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = _qualname(node.value, imports)
        return f"{base}.{node.attr}" if base else ""
    return ""
