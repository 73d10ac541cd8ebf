"""Hand-written rank tests: an `if` that holds on rank 0 alone, however the script spells it
(`dist.get_rank() == 0`, `rank == 0` with the rank read from the environment, the legacy
launcher's `args.local_rank in [-1, 0]`, `is_main_process()` whose body returns such a test,
`not rank`, ...). A value is a rank by where it comes from, not by its name: `args.rank` of a
`--rank` flag whose default every rank shares is no rank (torchrun passes no flag), and a LoRA
`rank` is none either. The legacy `--local_rank` flag is one: the conversion reads it from
LOCAL_RANK (launch.py). Code under such a test already runs on one rank (on one node: the local
rank's), so the planners add no guard there, and the gate counts it as rank 0's, writes and
collectives alike.

Read from the text with Python's ast, so the planners (the source) and the gate (the output,
where those lines are unchanged) ask the same question.
"""

from __future__ import annotations

import ast
import re

ENV_RANKS = (
    "RANK",
    "LOCAL_RANK",
    "SLURM_PROCID",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
)
RANK_CALLS = ("torch.distributed.get_rank", "torch.distributed.get_node_local_rank")
# tests that hold only where there is no process group (a plain run): False once there is one
NO_GROUP = ("torch.distributed.is_initialized", "torch.distributed.is_available")
LEGACY_FLAGS = ("--local_rank", "--local-rank")
_MAYBE = re.compile(r"rank|main_process|is_master|RANK|PROCID", re.I)


class RankTests:
    """The rank tests of one text: `verdict(test)` and the lines run on rank 0 alone."""

    def __init__(self, text: str) -> None:
        self.tests: dict[tuple[int, int], bool] = {}  # (line, col) of a test -> verdict
        self.lines: set[int] = set()  # lines that run only where a rank test holds
        if not _MAYBE.search(text):
            return
        try:
            self.tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return
        self.imports: dict[str, str] = {}
        self.values: dict[str, list[ast.expr]] = {}  # name or attribute name -> values
        self.funcs: dict[str, list[ast.FunctionDef]] = {}
        self.flags: dict[str, ast.Call] = {}  # argparse dest -> its add_argument call
        self._index()
        self._busy: set[int] = set()
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.If, ast.IfExp, ast.While)):
                v = self.verdict(node.test)
                if v is None:
                    continue
                self.tests[(node.test.lineno, node.test.col_offset)] = v
                if isinstance(node, ast.If):
                    for stmt in node.body if v else node.orelse:
                        self.lines |= set(
                            range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
                        )

    # -- the index ---------------------------------------------------------------------------
    def _index(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.imports[a.asname] = a.name
                    else:
                        self.imports[a.name.split(".")[0]] = a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    self.imports[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.funcs.setdefault(node.name, []).append(node)  # type: ignore[arg-type]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value:
                targets = (
                    node.targets if isinstance(node, ast.Assign) else [node.target]
                )
                for t in targets:
                    key = _key(t)
                    if key:
                        self.values.setdefault(key, []).append(node.value)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                flags = [
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant) and isinstance(a.value, str)
                ]
                dest = next(
                    (
                        k.value.value
                        for k in node.keywords
                        if k.arg == "dest" and isinstance(k.value, ast.Constant)
                    ),
                    None,
                )
                long = [f for f in flags if f.startswith("--")] or flags
                if long and isinstance(dest or long[0], str):
                    self.flags[dest or long[0].lstrip("-").replace("-", "_")] = node

    def qualname(self, node: ast.AST) -> str:
        if isinstance(node, ast.Name):
            return self.imports.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.qualname(node.value)
            return f"{base}.{node.attr}" if base else ""
        return ""

    # -- the questions -------------------------------------------------------------------------
    def verdict(self, test: ast.AST, depth: int = 0) -> bool | None:
        """True: the test holds on rank 0 alone; False: on every rank but 0; None: neither."""
        if depth > 4:
            return None
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            left, op, right = test.left, test.ops[0], test.comparators[0]
            if _const(left) is not None and self.is_rank(right, depth):
                left, right = right, left
                op = _FLIP.get(type(op), op)
            if not self.is_rank(left, depth):
                return None
            if isinstance(op, (ast.In, ast.NotIn)):
                vals = _consts(right)
                if vals and 0 in vals and all(v <= 0 for v in vals):
                    return isinstance(op, ast.In)
                return None
            c = _const(right)
            if c == 0 and isinstance(op, (ast.Eq, ast.Is, ast.LtE)):
                return True
            if c == 1 and isinstance(op, ast.Lt):
                return True
            if c == 0 and isinstance(op, (ast.NotEq, ast.IsNot, ast.Gt)):
                return False
            if c == 1 and isinstance(op, ast.GtE):
                return False
            return None
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            if self.is_rank(test.operand, depth):
                return True
            inner = self.verdict(test.operand, depth + 1)
            return None if inner is None else not inner
        if isinstance(test, ast.BoolOp):
            parts = [
                v
                for v in test.values
                if not (isinstance(test.op, ast.Or) and self._no_group(v))
            ]
            verdicts = [self.verdict(v, depth + 1) for v in parts]
            if isinstance(test.op, ast.And) and True in verdicts:
                return True
            if isinstance(test.op, ast.Or) and verdicts and all(verdicts):
                return True
            return None
        if isinstance(test, ast.Call) and not test.args and not test.keywords:
            return self._returns_test(test.func, depth)
        if isinstance(test, (ast.Name, ast.Attribute)):
            return self._value_test(test, depth)
        return None

    def is_rank(self, expr: ast.AST, depth: int = 0) -> bool:
        """expr holds this process's rank: dist.get_rank(), the environment's RANK or
        LOCAL_RANK, the legacy launcher's --local_rank, or a name bound to one of those."""
        if depth > 4:
            return False
        if isinstance(expr, ast.Call):
            name = self.qualname(expr.func)
            if name in RANK_CALLS:
                return True
            if name in ("int", "str") and len(expr.args) == 1:
                return self.is_rank(expr.args[0], depth + 1)
            if name in ("os.environ.get", "os.getenv") and expr.args:
                return _const(expr.args[0]) in ENV_RANKS
            if isinstance(expr.func, ast.Name) and not expr.args:
                rets = self._returns(expr.func.id)
                ranks = [r for r in rets if self.is_rank(r, depth + 1)]
                # `return 0` where there is no group, dist.get_rank() elsewhere
                return bool(ranks) and all(r in ranks or _const(r) == 0 for r in rets)
            return False
        if isinstance(expr, ast.Subscript):
            return (
                self.qualname(expr.value) == "os.environ"
                and _const(expr.slice) in ENV_RANKS
            )
        if isinstance(expr, (ast.Name, ast.Attribute)):
            if isinstance(expr, ast.Attribute):
                flag = self.flags.get(expr.attr)
                if flag is not None and self._rank_flag(flag, depth):
                    return True
            values = [v for v in self.values.get(_key(expr) or "", []) if v is not expr]
            if isinstance(expr, ast.Name) and expr.id in self.imports:
                return False
            return bool(values) and all(self.is_rank(v, depth + 1) for v in values)
        return False

    # -- helpers -------------------------------------------------------------------------------
    def _rank_flag(self, call: ast.Call, depth: int) -> bool:
        """A command-line flag that holds the rank: the legacy launcher's (read from LOCAL_RANK
        by the conversion), or one whose default reads it from the environment."""
        flags = [a.value for a in call.args if isinstance(a, ast.Constant)]
        if any(f in LEGACY_FLAGS for f in flags):
            return True
        default = next((k.value for k in call.keywords if k.arg == "default"), None)
        return default is not None and self.is_rank(default, depth + 1)

    def _no_group(self, test: ast.AST) -> bool:
        return (
            isinstance(test, ast.UnaryOp)
            and isinstance(test.op, ast.Not)
            and isinstance(test.operand, ast.Call)
            and self.qualname(test.operand.func) in NO_GROUP
        )

    def _returns(self, name: str) -> list[ast.expr]:
        fns = self.funcs.get(name, [])
        if len(fns) != 1 or id(fns[0]) in self._busy:
            return []
        fn = fns[0]
        if fn.args.args or fn.args.posonlyargs or fn.args.kwonlyargs:
            return []
        self._busy.add(id(fn))
        try:
            return [
                r.value
                for r in ast.walk(fn)
                if isinstance(r, ast.Return) and r.value is not None
            ]
        finally:
            self._busy.discard(id(fn))

    def _returns_test(self, func: ast.AST, depth: int) -> bool | None:
        """is_main_process(): a function of the script whose every return is a rank test (or
        True where there is no process group)."""
        if not isinstance(func, ast.Name):
            return None
        rets = self._returns(func.id)
        fns = self.funcs.get(func.id, [])
        if not rets or not fns:
            return None
        self._busy.add(id(fns[0]))
        try:
            verdicts = [
                self.verdict(r, depth + 1) for r in rets if _const(r) is not True
            ]
        finally:
            self._busy.discard(id(fns[0]))
        if verdicts and all(v is True for v in verdicts):
            return True
        if verdicts and all(v is False for v in verdicts):
            return False
        return None

    def _value_test(self, expr: ast.AST, depth: int) -> bool | None:
        """`is_master = rank == 0` ... `if is_master:`: a name bound only to rank tests."""
        values = [v for v in self.values.get(_key(expr) or "", []) if v is not expr]
        verdicts = [self.verdict(v, depth + 1) for v in values]
        if verdicts and all(v is True for v in verdicts):
            return True
        return None


_FLIP = {ast.Lt: ast.Gt(), ast.Gt: ast.Lt(), ast.LtE: ast.GtE(), ast.GtE: ast.LtE()}


def _key(node: ast.AST) -> str | None:
    """A name, or `.attr` for an attribute (args.rank, self.rank): values are pooled by
    attribute name, wherever the object comes from."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return "." + node.attr
    return None


def _const(node: ast.AST):
    if isinstance(node, ast.Constant):
        return node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and isinstance(node.operand.value, int)
    ):
        return -node.operand.value
    return None


def _consts(node: ast.AST) -> list[int] | None:
    if not isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return None
    vals = [_const(e) for e in node.elts]
    if not vals or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in vals
    ):
        return None
    return vals  # type: ignore[return-value]
