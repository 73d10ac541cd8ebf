"""lifetime: the process group is set up before the first training statement and destroyed
after the last, on every path the entry really runs: the `if __name__ == "__main__":` block (also
what `python -m pkg.mod` runs), the module's top-level code when it has no such block, and a
function that a console script of the project (pyproject.toml, setup.py, setup.cfg) starts after
importing the module. Each path is the module's top-level statements followed by that block or
function body; a statement that both sets up and trains (`main()` doing both) is read inside."""

from __future__ import annotations

import ast
import re

from ddpify.analysis.entries import console_functions, run_by_decorator
from ddpify.gate.common import Violation
from ddpify.gate.program import Program
from ddpify.gate.sync import is_ddp
from ddpify.rules import declare

declare(
    "DDP153",
    "invariant-lifetime",
    "the output would train outside the process group's lifetime on a path "
    "its entry runs (set-up missing, after training, or teardown before it): not converted",
    severity="blocking",
    tool="gate",
)

MARK = re.compile(r"__ddpify_(begin|end)_(\d+)__$")


def entry_statements(p: Program) -> list[ast.stmt]:
    """The entry file's top-level statements (a merged project's other modules left out)."""
    out, inside = [], False
    for s in p.tree.body:
        mark = MARK.match(s.name) if isinstance(s, ast.FunctionDef) else None
        if mark:
            inside = mark.group(1) == "begin"
            continue
        if not inside:
            out.append(s)
    return out


def main_guard(stmts: list[ast.stmt]) -> ast.If | None:
    for s in stmts:
        if (
            isinstance(s, ast.If)
            and "__name__" in ast.unparse(s.test)
            and "__main__" in ast.unparse(s.test)
        ):
            return s
    return None


class _Reach:
    """Which statements set up, destroy or train, through the program's functions."""

    def __init__(self, p: Program) -> None:
        self.p = p
        self.cache: dict[tuple[str, int], bool] = {}
        # functions registered by a decorator (`@cli.command()`, `@app.main`): calling anything
        # of the object that registered them (`cli()`, `app.run()`) may run them
        self.registered: dict[str, list[ast.FunctionDef]] = {}
        for fns in p.functions.values():
            for fn in fns:
                for dec in fn.decorator_list:
                    root = _root_name(dec)
                    if root:
                        self.registered.setdefault(root, []).append(fn)
                    for box in self._stores_into(
                        root
                    ):  # COMMANDS[f.__name__] = f: COMMANDS[name]() runs it
                        self.registered.setdefault(box, []).append(fn)

    def _stores_into(self, name: str | None) -> set[str]:
        """The containers a decorator function of the program puts the function it decorates in."""
        out: set[str] = set()
        for d in self.p.functions.get(name or "", []):
            params = [a.arg for a in d.args.args]
            if not params:
                continue
            for sub in self.p.walk(d):
                if (
                    isinstance(sub, ast.Assign)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == params[0]
                ):
                    out |= {
                        _root_name(t)
                        for t in sub.targets
                        if isinstance(t, ast.Subscript) and _root_name(t)
                    }
                elif (
                    isinstance(sub, ast.Call)
                    and isinstance(sub.func, ast.Attribute)
                    and sub.func.attr in ("append", "add", "setdefault", "__setitem__")
                ):
                    if any(
                        isinstance(a, ast.Name) and a.id == params[0] for a in sub.args
                    ) and _root_name(sub.func.value):
                        out.add(_root_name(sub.func.value))
        return out

    def _functions_in(self, node: ast.AST) -> list[ast.FunctionDef]:
        p = self.p
        key = ("functions_in", id(node))
        got = p._memo.get(key)
        if got is not None:
            return got  # type: ignore[return-value]
        fns: list[ast.FunctionDef] = []
        for sub in p.walk(node):
            if isinstance(sub, ast.Call):
                fns += p.callees(sub)
                root = _root_name(sub.func)
                if (
                    root
                    and not isinstance(sub.func, ast.Name)
                    or root in self.registered
                    and isinstance(sub.func, ast.Name)
                ):
                    fns += self.registered.get(root, [])
            elif (
                isinstance(sub, ast.Name)
                and isinstance(sub.ctx, ast.Load)
                and sub.id in p.functions
            ):
                par = p.parent.get(sub)
                if not (
                    isinstance(par, ast.Call) and par.func is sub
                ):  # fire.Fire(main): run by the library
                    fns += [f for f in p.functions[sub.id] if p.class_of(f) is None]
            elif (
                isinstance(sub, ast.Name)
                and isinstance(sub.ctx, ast.Load)
                and sub.id in p.classes
            ):
                par = p.parent.get(sub)
                if not (
                    isinstance(par, ast.Call) and par.func is sub
                ):  # fire.Fire(Trainer): any method
                    fns += [
                        f
                        for c in p.classes[sub.id]
                        for f in c.body
                        if isinstance(f, ast.FunctionDef)
                    ]
        p._memo[key] = fns
        return fns

    def has(self, node: ast.AST, what: str, depth: int = 0) -> bool:
        key = (what, id(node))
        if key in self.cache:
            return self.cache[key]
        self.cache[key] = False
        found = what in self._direct(node)
        if not found and depth < 6:
            found = any(
                self.has(f, what, depth + 1)
                for f in self._functions_in(node)
                if f is not node
            )
        self.cache[key] = found
        return found

    def _direct(self, node: ast.AST) -> set[str]:
        """What the calls in node itself do (setup, destroy, train), read in one pass."""
        key = ("direct", id(node))
        got = self.p._memo.get(key)
        if got is None:
            got = self.p._memo[key] = {
                what
                for c in self.p.calls_in(node)
                for what in ("train", "setup", "destroy")
                if self._is(c, what)
            }
        return got  # type: ignore[return-value]

    def _is(self, call: ast.Call, what: str) -> bool:
        last = self.p.last(call)
        if (
            what == "train"
        ):  # also what needs the group to exist: a DDP wrapper, a distributed sampler
            return (
                last == "backward"
                and isinstance(call.func, ast.Attribute)
                or last in ("DistributedSampler", "DistributedDataParallel")
                or is_ddp(self.p, call)
            )
        if what == "setup":
            return last == "init_process_group"
        return last == "destroy_process_group"


def _root_name(node: ast.AST) -> str | None:
    """cli for cli.command(), app for @app.main(...)."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _check_path(
    p: Program, reach: _Reach, stmts: list[ast.stmt], depth: int = 0
) -> tuple[ast.AST, str] | None:
    """(where, what is wrong) on this path, or None."""
    trains = [i for i, s in enumerate(stmts) if reach.has(s, "train")]
    if not trains:
        return None
    setups = [i for i, s in enumerate(stmts) if reach.has(s, "setup")]
    destroys = [i for i, s in enumerate(stmts) if reach.has(s, "destroy")]
    first, last = trains[0], trains[-1]
    if not setups or setups[0] > first:
        return stmts[
            first
        ], "the process group is not set up before this statement trains"
    early = [d for d in destroys if setups[0] <= d < last or d < first]
    if early and early[0] != first:
        return stmts[
            early[0]
        ], "the process group is destroyed here, before training that follows"
    if not any(d >= last for d in destroys):
        return stmts[
            last
        ], "the process group is not destroyed after this statement trains"
    if (setups[0] == first or early) and first == last and depth < 5:
        inner = _inner(
            p, stmts[first]
        )  # one statement sets up, trains and tears down: read it
        if inner is not None:
            return _check_path(p, reach, inner, depth + 1)
    if early:
        return stmts[
            early[0]
        ], "the process group is destroyed here, before training that follows"
    return None


def _inner(p: Program, stmt: ast.stmt) -> list[ast.stmt] | None:
    """The statements one statement runs: a compound statement's body, a called function's."""
    if isinstance(stmt, (ast.If, ast.With, ast.Try, ast.For, ast.While)):
        return list(stmt.body)
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        fns = p.callees(stmt.value)
        if len(fns) == 1:
            return list(fns[0].body)
    return None


def check(p: Program, path: str = "") -> list[Violation]:
    if not p.backwards():
        return []
    stmts = entry_statements(p)
    top = [
        s
        for s in stmts
        if not isinstance(
            s,
            (
                ast.FunctionDef,
                ast.AsyncFunctionDef,
                ast.ClassDef,
                ast.Import,
                ast.ImportFrom,
            ),
        )
    ]
    guard = main_guard(stmts)
    base = [s for s in top if s is not guard]
    paths: list[tuple[str, list[ast.stmt]]] = []
    if guard is not None:  # in source order: code after the block runs after it
        inlined = [x for s in top for x in (list(guard.body) if s is guard else [s])]
        paths.append(('the `if __name__ == "__main__":` block', inlined))
    decorated = run_by_decorator(stmts)
    for name in console_functions(path) + decorated:
        fn = next(
            (s for s in stmts if isinstance(s, ast.FunctionDef) and s.name == name),
            None,
        )
        if fn is not None:
            what = "the function its decorator runs" if name in decorated else ""
            what = what or "the console script's"
            paths.append((f"{what} `{name}()`", base + list(fn.body)))
    if not paths:
        paths.append(("the module's top-level code", base))
    reach = _Reach(p)
    out: list[Violation] = []
    trained = False
    for what, body in paths:
        if any(reach.has(s, "train") for s in body):
            trained = True
        bad = _check_path(p, reach, body)
        if bad is not None:
            out.append(Violation(bad[0], "DDP153", f"lifetime: on {what}, {bad[1]}"))
    if not trained:
        bw = p.backwards()[0]
        out.append(
            Violation(
                bw,
                "DDP153",
                "lifetime: no path the entry runs reaches this training step between "
                "the process group's set-up and its teardown",
            )
        )
    return out
