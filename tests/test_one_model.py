"""One model, one name, over every converted fixture: DDP is applied in place (ddp_in_place),
so the output builds no wrapper object, adds no `.module`, and names every model the way the
input did. Each ddp_in_place(X) runs before the optimizer it belongs to takes X's parameters:
it comes right before a statement of the same block that calls X.parameters() or
X.named_parameters(), or, for a model updated by hand, right after X is bound."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import FIXTURES, PROJECTS

DDP_NAMES = {"DDP", "DistributedDataParallel"}


def _outputs(d: Path) -> tuple[dict[str, str], dict[str, str]]:
    if (d / "input").is_dir():
        return (
            {
                str(p.relative_to(d / "input")): p.read_text()
                for p in (d / "input").rglob("*.py")
            },
            {
                str(p.relative_to(d / "expected")): p.read_text()
                for p in (d / "expected").rglob("*.py")
            },
        )
    return {"input.py": (d / "input.py").read_text()}, {
        "input.py": (d / "expected.py").read_text()
    }


def _converted(d: Path) -> bool:
    """A fixture ddpify converted from single-GPU code (not refused, not already distributed)."""
    inputs, outputs = _outputs(d)
    text = "".join(inputs.values())
    return inputs != outputs and "DistributedDataParallel" not in text


CASES = [d for d in FIXTURES + PROJECTS if _converted(d)]


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id == name
    ]


def _bodies(tree: ast.AST):
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def test_there_are_converted_fixtures():
    assert len(CASES) > 100


def _module_attributes(tree: ast.AST) -> int:
    return sum(
        isinstance(n, ast.Attribute) and n.attr == "module" for n in ast.walk(tree)
    )


def test_no_wrapper_object_and_no_new_module_attribute():
    problems = []
    for d in CASES:
        inputs, outputs = _outputs(d)
        for name, text in outputs.items():
            tree = ast.parse(text)
            for node in ast.walk(tree):
                f = node.func if isinstance(node, ast.Call) else None
                last = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if last in DDP_NAMES:
                    problems.append(
                        f"{d.name}: {name}:{node.lineno}: {ast.unparse(node)}"
                    )
            old = _module_attributes(ast.parse(inputs.get(name, "")))
            if _module_attributes(tree) > old:
                problems.append(f"{d.name}: {name}: `.module` added")
    assert not problems, "\n".join(problems)


def _takes(stmts: list[ast.stmt], target: str) -> bool:
    """One of stmts takes target's parameters (target.parameters(), .named_parameters())."""
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("parameters", "named_parameters")
        and ast.unparse(n.func.value).startswith(target)
        for s in stmts
        for n in ast.walk(s)
    )


def test_every_model_is_made_distributed_before_its_parameters_are_taken():
    problems, seen = [], 0
    for d in CASES:
        _, outputs = _outputs(d)
        for name, text in outputs.items():
            for block in _bodies(ast.parse(text)):
                for i, stmt in enumerate(block):
                    if isinstance(stmt, ast.For) and _calls(stmt, "ddp_in_place"):
                        seen += 1  # for m in models.values(): ddp_in_place(m)
                        continue
                    if not (
                        isinstance(stmt, ast.Expr)
                        and isinstance(stmt.value, ast.Call)
                        and getattr(stmt.value.func, "id", "") == "ddp_in_place"
                    ):
                        continue
                    seen += 1
                    target = ast.unparse(stmt.value.args[0])
                    after, before = block[i + 1 : i + 9], block[:i]
                    bound = (
                        bool(before) and target in ast.unparse(before[-1]).split("=")[0]
                    )
                    if not (_takes(after, target) or bound):
                        problems.append(f"{d.name}: {name}:{stmt.lineno}: {target}")
    assert seen > 100
    assert not problems, "\n".join(problems)


def test_the_model_keeps_its_name():
    """Every name the input gives a model is still there: nothing is renamed or rebound."""
    for d in CASES:
        inputs, outputs = _outputs(d)
        for name, text in outputs.items():
            for call in _calls(ast.parse(text), "ddp_in_place"):
                if not call.args:
                    continue
                model = ast.unparse(call.args[0]).split(".")[0]
                if model == "self" or name not in inputs:
                    continue
                assert model in inputs[name], f"{d.name}: {name}: {model}"
