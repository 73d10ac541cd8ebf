"""Code that is compiled, not run as Python: a function under a compiler's decorator
(`@triton.jit`, `@torch.jit.script`, `@numba.jit`, `@numba.cuda.jit`, ...) and the C++/CUDA
source handed to an extension builder (`torch.utils.cpp_extension.load_inline`,
`cupy.RawKernel`, ...). Such code cannot read Python globals such as RANK, and a call there
that looks like a write (`tl.store(output_ptr + offs, x)`) writes device memory, not a file: it
is never edited or guarded. Shared by the planners (Analysis.skipped) and the invariant gate,
which both ask for the source lines it covers.
"""

from __future__ import annotations

import ast
import re

# decorators whose function is compiled; a call of one (`@triton.jit(do_not_specialize=...)`)
# counts too
COMPILERS = frozenset(
    {
        "triton.jit",
        "triton.autotune",
        "triton.heuristics",
        "torch.jit.script",
        "torch.jit.script_if_tracing",
        "numba.jit",
        "numba.njit",
        "numba.vectorize",
        "numba.guvectorize",
        "numba.stencil",
        "numba.cfunc",
        "numba.cuda.jit",
        "cupyx.jit.rawkernel",
        "taichi.kernel",
        "taichi.func",
        "warp.kernel",
        "warp.func",
    }
)
# calls whose arguments are source code of another language
EXTENSION_BUILDERS = frozenset(
    {
        "torch.utils.cpp_extension.load_inline",
        "torch.utils.cpp_extension.load",
        "cupy.RawKernel",
        "cupy.RawModule",
        "cupy.ElementwiseKernel",
        "cupy.ReductionKernel",
        "pycuda.compiler.SourceModule",
        "torch.cuda.jiterator._create_jit_fn",
        "torch.cuda.jiterator._create_multi_output_jit_fn",
    }
)
# a quick test on the text before any parse: most scripts have none of these
_MAYBE = re.compile(
    r"\b(jit|njit|triton|numba|cpp_extension|load_inline|RawKernel|RawModule|"
    r"ElementwiseKernel|ReductionKernel|SourceModule|jiterator|taichi|warp|rawkernel)\b"
)


def compiled_lines(source: str) -> set[int]:
    """The lines of `source` that hold compiled code (1-based); empty when it does not parse."""
    if not _MAYBE.search(source):
        return set()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    names = _imports(tree)

    def qualname(node: ast.AST) -> str:
        if isinstance(node, ast.Call):
            node = node.func
        if isinstance(node, ast.Name):
            return names.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = qualname(node.value)
            return f"{base}.{node.attr}" if base else ""
        return ""

    lines: set[int] = set()
    sources: set[str] = set()  # names handed to an extension builder
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(qualname(d) in COMPILERS for d in node.decorator_list):
                first = min(d.lineno for d in node.decorator_list)
                lines |= set(range(first, (node.end_lineno or node.lineno) + 1))
        elif isinstance(node, ast.Call) and qualname(node.func) in EXTENSION_BUILDERS:
            for arg in list(node.args) + [k.value for k in node.keywords]:
                lines |= set(range(arg.lineno, (arg.end_lineno or arg.lineno) + 1))
                sources |= {n.id for n in ast.walk(arg) if isinstance(n, ast.Name)}
    if sources:
        # `cuda_src = """..."""` handed over by name: the text it binds is source code too
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Assign)
                and any(
                    isinstance(t, ast.Name) and t.id in sources for t in node.targets
                )
                and _text(node.value)
            ):
                v = node.value
                lines |= set(range(v.lineno, (v.end_lineno or v.lineno) + 1))
    return lines


def _text(node: ast.AST) -> bool:
    """A string, an f-string, or a list, tuple or sum of them."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, (ast.List, ast.Tuple)):
        return bool(node.elts) and all(_text(e) for e in node.elts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) and _text(node.right)
    return False


def _imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted name it imports (`import triton.language as tl`: tl ->
    triton.language; `from numba import cuda`: cuda -> numba.cuda)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    out[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out
