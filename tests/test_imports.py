"""ddpify's modules import each other without cycles, each imports alone in a fresh interpreter,
and docs/architecture.md's module tables name the modules there are.

The graph has an edge for every import statement in ddpify/**/*.py, function-local ones
included (a local import hides a cycle, it does not remove it). It leaves out what Python
does implicitly: importing ddpify.analysis.tree runs ddpify/__init__.py and
ddpify/analysis/__init__.py first. Counting that would make every package whose __init__
re-exports its submodules cyclic; the fresh-interpreter imports below cover that order.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted((ROOT / "ddpify").rglob("*.py"))}


def imports_of(name: str, path: Path) -> set[str]:
    """The ddpify modules that module `name` imports, anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in MODULES:  # `from ddpify import fileio`: the submodule
                    out.add(sub)
                elif base in MODULES:
                    out.add(base)
    out.discard(name)
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return stack[stack.index(d) :] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_graph_sees_local_and_relative_imports(tmp_path: Path):
    # imports inside functions count (legacy.py imports precision.py and wrapping.py in its planner)
    assert "ddpify.transforms.precision" in imports_of(
        "ddpify.transforms.legacy", MODULES["ddpify.transforms.legacy"]
    )
    p = tmp_path / "x.py"
    p.write_text(
        "def f():\n    from ddpify.pipeline import Result\n    from .base import Context\n"
    )
    assert imports_of("ddpify.transforms.x", p) == {
        "ddpify.pipeline",
        "ddpify.transforms.base",
    }


def test_no_import_cycle_among_ddpify_modules():
    graph = {name: imports_of(name, path) for name, path in MODULES.items()}
    assert graph["ddpify.analysis"], "the graph must see the package's imports"
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_architecture_module_tables_match_the_tree():
    """docs/architecture.md names every module of the analysis, the transforms and the gate, and its
    tables (and docs/conversion.md's concern table) name no module that does not exist."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    on_disk = {
        p.name
        for pkg in ("analysis", "transforms", "gate")
        for p in (ROOT / "ddpify" / pkg).glob("*.py")
    } - {"__init__.py"}
    assert len(on_disk) > 60, "the packages must be found"
    for name in ("architecture.md", "conversion.md"):
        text = (ROOT / "docs" / name).read_text()
        in_tables = {
            m
            for line in text.splitlines()
            if line.startswith("|")
            for m in re.findall(r"`(\w+\.py)`", line)
        }
        assert in_tables, f"docs/{name} has no module table"
        assert in_tables <= on_disk, (
            f"docs/{name} names modules that do not exist: {sorted(in_tables - on_disk)}"
        )
    named = set(re.findall(r"`(\w+\.py)`", page))
    assert on_disk <= named, (
        f"docs/architecture.md does not name: {sorted(on_disk - named)}"
    )


@pytest.mark.runs
@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_imports_in_a_fresh_interpreter(name: str):
    if name.endswith(".__main__"):  # importing it runs the command: --help must work
        res = subprocess.run(
            [sys.executable, "-m", name.rpartition(".")[0], "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0 and "Usage" in res.stdout, res.stderr
        return
    # the converter must not import torch; ddpify.verify imports it only where it runs scripts
    code = f"import importlib, sys; importlib.import_module({name!r}); print('torch' in sys.modules)"
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False", f"{name} imports torch"
