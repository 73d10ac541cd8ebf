"""Which calls have effects outside the training computation, by what they are handed rather
than by a list of library names: a call into an imported library that is given a path (a string
with a folder or an extension, an f-string, os.path.join(...), Path(...), `d / "x"`, a name such as
out_dir or ckpt_path) and whose value is not kept writes or sends something somewhere, whatever
the library (`gifmaker.save(frames, "out.gif")`, `plotlib.savefig("loss.png")`). What every rank
must compute is left out: torch (the model, the optimizer, the data, the collectives), the random
generators, and the standard library calls that change this process only (sys.path, os.chdir,
the environment, warnings). Readers (a value that is kept) are not writers.

Shared by the rank-0 planner (transforms/rank0.py, on LibCST) and the one-writer invariant of the
gate (gate/writers.py, on ast), which both ask it with plain strings.
"""

from __future__ import annotations

import ast
import re
from typing import Callable, Iterable

# roots of qualified names whose calls every rank must make, or that change this process only
EVERY_RANK = (
    "torch",
    "numpy.random",
    "random",
    "math",
    "builtins",
    "functools",
    "itertools",
    "operator",
    "collections",
    "copy",
    "typing",
    "dataclasses",
    "re",
    "string",
    "time.sleep",
    "time.time",
    "time.perf_counter",
    "sys",
    "os.environ",
    "os.chdir",
    "os.path",
    "os.getenv",
    "os.putenv",
    "warnings",
    "logging.getLogger",
    "importlib",
    "argparse",
    "atexit",
    "signal",
    "faulthandler",
    "gc",
    "multiprocessing",
    "threading",
    "contextlib",
    "abc",
    "enum",
    "inspect",
    "json.loads",
    "json.dumps",
    "pickle.loads",
    "pickle.dumps",
    "yaml.safe_load",
    "yaml.load",
    "numpy",
    "scipy",
    "sklearn",
    "pandas.DataFrame",
    "PIL.Image.open",
    "cv2.imread",
    "tqdm",
    "transformers",
    "datasets",
    "timm",
    "accelerate",
    "apex",
    "einops",
    "ddpify",
)
# numpy's own writers are in the table of writers (analysis/writes.py); its other calls compute
PATHISH_NAME = re.compile(
    r"(path|file|fname|dir|folder|ckpt|checkpoint|dst|dest|out_?put|save_?to|log_?dir)",
    re.I,
)
PATH_LITERAL = re.compile(r"[/\\]|\.[A-Za-z]\w{0,4}$")


def every_rank(qualname: str) -> bool:
    """A call every rank must make (or one that only changes this process)."""
    return any(qualname == r or qualname.startswith(r + ".") for r in EVERY_RANK)


def pathish_name(name: str) -> bool:
    return bool(PATHISH_NAME.search(name.rsplit(".", 1)[-1]))


def pathish_literal(text: str) -> bool:
    """A string with a folder or an extension (an f-string: its literal parts, "ckpt/{e}.pt")."""
    return bool(PATH_LITERAL.search(text.strip()))


def library_effect(
    qualname: str, imported: bool, given_path: bool, value_kept: bool
) -> bool:
    """A call into an imported library, handed a path, whose value is dropped: it writes (or
    sends) something, so rank 0 alone makes it."""
    return imported and given_path and not value_kept and not every_rank(qualname)


PATH_CALLS = ("path.join", "Path", "joinpath", "with_suffix", "with_name")


def pathish(
    node: ast.AST, values: Callable[[ast.AST], Iterable[ast.AST]] = lambda n: ()
) -> bool:
    """A path, by what the expression is: a string with a folder or an extension (its literal
    parts for an f-string, `"{}/x.gif".format(d)`, `out + ".gif"`), `d / "x"`,
    os.path.join(...)/Path(...), a name that says so (out_dir, ckpt_path), or a name whose
    value is one of those (`gif = "run.gif"`, followed by `values`, one level). The planners
    (on LibCST, through its code) and the gate (on the output's ast) both ask this."""
    return _pathish(node, values, 0)


def _pathish(node: ast.AST, values, depth: int) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and pathish_literal(node.value)
    if isinstance(node, ast.JoinedStr):
        return pathish_literal(
            "".join(
                v.value if isinstance(v, ast.Constant) else "x" for v in node.values
            )
        )
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Div):
            return True
        if isinstance(node.op, ast.Add):  # out_prefix + ".gif"
            return _pathish(node.left, values, depth) or _pathish(
                node.right, values, depth
            )
        return False
    if isinstance(node, ast.Call):
        f = node.func
        last = (
            f.attr
            if isinstance(f, ast.Attribute)
            else f.id
            if isinstance(f, ast.Name)
            else ""
        )
        name = ast.unparse(f) if isinstance(f, (ast.Name, ast.Attribute)) else last
        if last == "format" and isinstance(f, ast.Attribute):
            return _pathish(f.value, values, depth)
        return name.endswith(PATH_CALLS)
    if isinstance(node, (ast.Name, ast.Attribute)):
        if pathish_name(ast.unparse(node)):
            return True
        if depth == 0 and isinstance(node, ast.Name):
            found = [v for v in values(node) if v is not node]
            return any(_pathish(v, values, depth + 1) for v in found)
    return False
