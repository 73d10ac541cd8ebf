"""What the invariants share: a violation, the output's own names for the rank and the generated
set-up, and whether a node runs on rank 0 alone."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from ddpify.analysis.rank_tests import RankTests
from ddpify.gate.program import Program

# the generated names (renamed DDP_RANK, ... where the script had its own)
RANK_RE = re.compile(r"""os\.environ\.get\(\s*["']RANK["']""")
DISTRIBUTED_SAMPLERS = re.compile(
    r"Distributed\w*Sampler|RankShard|rank_share|rank_batches|rank_rows|num_replicas"
)


@dataclass(frozen=True)
class Violation:
    node: ast.AST  # where, in the output
    code: str
    message: str


# id of a test node of the program being checked -> the verdict of analysis/rank_tests.py
_HAND: dict[int, bool] = {}


def read_hand_tests(p: Program) -> None:
    """Index the program's own rank tests (`dist.get_rank() == 0`, `is_main_process()`)."""
    _HAND.clear()
    tests = RankTests(p.text).tests
    if not tests:
        return
    for node in ast.walk(p.tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            v = tests.get((node.test.lineno, node.test.col_offset))
            if v is not None:
                _HAND[id(node.test)] = v


def rank_names(p: Program) -> set[str]:
    """Names the output binds to the global rank (`RANK = int(os.environ.get("RANK", 0))`)."""
    out = set()
    for node in p.tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            if RANK_RE.search(ast.unparse(node.value)):
                out.add(node.targets[0].id)
    return out or {"RANK"}


def _text(node: ast.AST) -> str:
    """ast.unparse(node), without unparsing the common names and numbers."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Constant) and type(node.value) in (int, bool):
        return repr(node.value)
    return ast.unparse(node)


def _test_rank0(test: ast.AST, ranks: set[str]) -> bool | None:
    """True: the test holds on rank 0 alone; False: on every rank but 0; None: neither."""
    # the script's own rank tests, as the planners read them (analysis/rank_tests.py)
    hand = _HAND.get(id(test))
    if hand is not None:
        return hand
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, right = _text(test.left), _text(test.comparators[0])
        op = test.ops[0]
        if left in ranks and right == "0" or right in ranks and left == "0":
            if isinstance(op, (ast.Eq, ast.Is)):
                return True
            if isinstance(op, (ast.NotEq, ast.IsNot)):
                return False
        if (
            left in ranks
            and right == "0"
            and isinstance(op, ast.Gt)
            or left in ranks
            and right == "1"
            and isinstance(op, ast.Lt)
        ):
            return False if isinstance(op, ast.Gt) else True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        if isinstance(test.operand, ast.Name) and test.operand.id in ranks:
            return True
        inner = _test_rank0(test.operand, ranks)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        if any(_test_rank0(v, ranks) is True for v in test.values):
            return True
    return None


def on_rank0(p: Program, node: ast.AST, ranks: set[str], depth: int = 0) -> bool:
    """node runs on global rank 0 alone: under a test that holds there only, or in a function
    whose every caller does (a function nothing calls counts: it never runs)."""
    child = node
    for anc in p.ancestors(node):
        if isinstance(anc, (ast.If, ast.IfExp, ast.While)):
            verdict = _test_rank0(anc.test, ranks)
            in_body = any(
                p.inside(child, b)
                for b in (anc.body if isinstance(anc.body, list) else [anc.body])
            )
            in_else = any(
                p.inside(child, b)
                for b in (anc.orelse if isinstance(anc.orelse, list) else [anc.orelse])
            )
            if verdict is True and in_body or verdict is False and in_else:
                return True
        if isinstance(anc, ast.BoolOp) and isinstance(anc.op, ast.And):
            idx = next(
                (i for i, v in enumerate(anc.values) if p.inside(child, v)), None
            )
            if idx is not None and any(
                _test_rank0(v, ranks) is True for v in anc.values[:idx]
            ):
                return True
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if depth >= 5:
                return False
            callers = p.callers(anc)
            if not callers:
                return not p.passed_as_value(anc) and anc.name not in (
                    "forward",
                    "__getitem__",
                    "__iter__",
                    "__len__",
                )
            return all(on_rank0(p, c, ranks, depth + 1) for c in callers)
        if isinstance(anc, ast.Lambda):
            return False
        child = anc
    return False


def mentions(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))
