"""The two names, over every converted fixture: the model keeps its name (the plain module) and the
DDP wrapper has one of its own. The wrapper is only called (a training forward), asked what DDP
answers itself (no_sync(), train(), ...), or handed to a function of the program that runs the
training forward; it is never saved, copied or asked for a state dict. `.module` appears only
where the code holds the wrapper and needs the module: on a parameter that every caller hands
the wrapper (a function that runs the training forward and also reads the model)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import FIXTURES, PROJECTS

PASSTHROUGH = {
    "no_sync",
    "train",
    "eval",
    "parameters",
    "named_parameters",
    "zero_grad",
    "to",
    "cuda",
    "cpu",
    "requires_grad_",
}
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
    return (
        inputs != outputs
        and "DistributedDataParallel" not in text
        and "apex" not in text
    )


CASES = [d for d in FIXTURES + PROJECTS if _converted(d)]


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _is_ddp(call: ast.AST) -> bool:
    return (
        isinstance(call, ast.Call)
        and (_dotted(call.func) or "").rsplit(".", 1)[-1] in DDP_NAMES
    )


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {
        child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)
    }


def _function_of(node: ast.AST, parents) -> ast.FunctionDef | None:
    cur = parents.get(node)
    while cur is not None and not isinstance(
        cur, (ast.FunctionDef, ast.AsyncFunctionDef)
    ):
        cur = parents.get(cur)
    return cur


def _param_index(fn: ast.FunctionDef, name: str) -> int | None:
    params = [a.arg for a in fn.args.args]
    return params.index(name) if name in params else None


def _argument(call: ast.Call, fn: ast.FunctionDef, param: str) -> ast.AST | None:
    for kw in call.keywords:
        if kw.arg == param:
            return kw.value
    i = _param_index(fn, param)
    if i is None:
        return None
    if (
        fn.args.args
        and fn.args.args[0].arg in ("self", "cls")
        and isinstance(call.func, ast.Attribute)
    ):
        i -= 1
    return call.args[i] if 0 <= i < len(call.args) else None


def _analyse(outputs: dict[str, str]):
    trees = {name: ast.parse(text) for name, text in outputs.items()}
    parents = {name: _parents(t) for name, t in trees.items()}
    functions = {
        f.name: f
        for t in trees.values()
        for f in ast.walk(t)
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    wrappers: set[str] = set()
    for t in trees.values():
        for node in ast.walk(t):
            if isinstance(node, ast.Assign) and _is_ddp(node.value):
                wrappers |= {d for tgt in node.targets if (d := _dotted(tgt))}
            if (
                isinstance(node, ast.Call)
                and _dotted(node.func) == "object.__setattr__"
                and len(node.args) == 3
                and _is_ddp(node.args[2])
            ):
                wrappers.add("self." + node.args[1].value)  # type: ignore[attr-defined]
    return trees, parents, functions, wrappers


def _wrapper_uses(trees, parents, functions, wrappers):
    """(holders: (function, parameter) handed the wrapper, misuses: what else names it)."""
    attrs = {w.rsplit(".", 1)[-1] for w in wrappers if "." in w}
    holders: set[tuple[str, str]] = set()
    misuses: list[str] = []
    work: list[tuple[str, ast.AST, str]] = []  # (file, node naming a wrapper, what)
    for name, t in trees.items():
        for node in ast.walk(t):
            d = _dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
            if d is None:
                continue
            if d in wrappers or (
                isinstance(node, ast.Attribute)
                and node.attr in attrs
                and _dotted(node.value) is not None
            ):
                work.append((name, node, d))
    seen: set[tuple[str, str]] = set()
    while work:
        name, node, d = work.pop()
        par = parents[name].get(node)
        if isinstance(par, ast.Attribute) and par.value is node:
            if par.attr not in PASSTHROUGH and not (
                par.attr == "module" and d not in wrappers
            ):  # a holder's plain module
                misuses.append(f"{name}:{node.lineno}: {d}.{par.attr}")
            continue
        if isinstance(par, ast.Call) and par.func is node:
            continue  # a training forward
        if isinstance(par, (ast.Assign, ast.AnnAssign)) and node in getattr(
            par, "targets", [getattr(par, "target", None)]
        ):
            continue
        if isinstance(par, ast.Call) and (
            node in par.args or any(k.value is node for k in par.keywords)
        ):
            callee = (_dotted(par.func) or "").rsplit(".", 1)[-1]
            fn = functions.get(callee)
            if fn is None and callee in DDP_NAMES | {"__setattr__"}:
                continue
            bound = par.args[0] if callee == "partial" and par.args else None
            if (
                bound is not None
                and bound is not node
                and functions.get(_dotted(bound) or "") is not None
            ):
                # functools.partial(f, a, ...): a is f's first parameter, as in a call of f
                fn = functions[_dotted(bound)]
                k = par.args.index(node) - 1
                param = fn.args.args[k].arg if 0 <= k < len(fn.args.args) else None
            else:
                param = (
                    next(
                        (
                            a.arg
                            for a in fn.args.args
                            if _argument(par, fn, a.arg) is node
                        ),
                        None,
                    )
                    if fn
                    else None
                )
            if fn is None or param is None:
                misuses.append(f"{name}:{node.lineno}: {d} handed to {callee}()")
                continue
            if (fn.name, param) not in seen:
                seen.add((fn.name, param))
                holders.add((fn.name, param))
                fname = next(
                    n for n, t in trees.items() if any(f is fn for f in ast.walk(t))
                )
                for inner in ast.walk(fn):
                    if (
                        isinstance(inner, ast.Name)
                        and inner.id == param
                        and _function_of(inner, parents[fname]) is fn
                    ):
                        work.append((fname, inner, param))
            continue
        if isinstance(par, ast.keyword):
            continue
        misuses.append(f"{name}:{node.lineno}: {d} used as {type(par).__name__}")
    return holders, misuses


def _new_lines(inputs: dict[str, str], name: str) -> set[str]:
    return {line.strip() for line in inputs.get(name, "").splitlines()}


def test_there_are_converted_fixtures():
    assert len(CASES) > 100


def test_wrapper_is_only_called_or_handed_to_the_code_that_trains():
    problems = []
    for d in CASES:
        _, outputs = _outputs(d)
        trees, parents, functions, wrappers = _analyse(outputs)
        if not wrappers:
            continue
        _, misuses = _wrapper_uses(trees, parents, functions, wrappers)
        problems += [f"{d.name}: {m}" for m in misuses]
    assert not problems, "\n".join(problems)


def test_module_only_on_a_parameter_that_holds_the_wrapper():
    problems, seen = [], 0
    for d in CASES:
        inputs, outputs = _outputs(d)
        trees, parents, functions, wrappers = _analyse(outputs)
        holders, _ = _wrapper_uses(trees, parents, functions, wrappers)
        for name, t in trees.items():
            old = _new_lines(inputs, name)
            lines = outputs[name].splitlines()
            for node in ast.walk(t):
                base = None
                if isinstance(node, ast.Attribute) and node.attr == "module":
                    base = node.value
                elif (
                    isinstance(node, ast.Call)
                    and _dotted(node.func) == "getattr"
                    and len(node.args) >= 2
                    and getattr(node.args[1], "value", None) == "module"
                ):
                    base = node.args[0]
                if base is None or lines[node.lineno - 1].strip() in old:
                    continue  # the input's own .module (DataParallel, or code that checks for it)
                seen += 1
                fn = _function_of(node, parents[name])
                if not (
                    isinstance(base, ast.Name)
                    and fn is not None
                    and (fn.name, base.id) in holders
                ):
                    problems.append(
                        f"{d.name}: {name}:{node.lineno}: {ast.unparse(node)} is not on a parameter that holds the wrapper"
                    )
    assert not problems, "\n".join(problems)
    assert seen, (
        "no fixture exercises a function that holds the wrapper and reads the model"
    )


def test_the_model_keeps_its_name():
    """Where ddpify wraps a model, the model's own name is never bound to the wrapper."""
    for d in CASES:
        _, outputs = _outputs(d)
        for text in outputs.values():
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.Assign) and _is_ddp(node.value):
                    inner = node.value.args[0]
                    inner = (
                        inner.args[0]
                        if isinstance(inner, ast.Call) and inner.args
                        else inner
                    )  # DDP(ForwardTo(model))
                    targets = {_dotted(t) for t in node.targets}
                    assert _dotted(inner) not in targets, (
                        f"{d.name}: {ast.unparse(node)}"
                    )
