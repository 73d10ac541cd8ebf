"""Project mode's text mechanics: the entry and its modules merged into one source that the
one-file pipeline converts (each module between two marker functions; its imports of local
modules and its own `if __name__ == "__main__":` block as placeholder imports), and the converted
source split back into files, each module with a header of the generated names it uses.
ddpify/project.py drives it."""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from ddpify.analysis.project import ModuleFile
from ddpify.result import ConversionError

BEGIN = "def __ddpify_begin_{}__(): pass\n"
END = "def __ddpify_end_{}__(): pass\n"
IMPORT = "import __ddpify_import_{}__\n"
MARK_RE = re.compile(r"__ddpify_(begin|end)_(\d+)__$")
PLACE_RE = re.compile(
    r"^([ \t]*)import __ddpify_import_(\d+)(?:_\d+)?__(?: as .*)?[ \t]*\r?\n", re.M
)
HEADER_NOTE = "# ddpify: ranks read from torchrun's environment (import-safe); the process group is set up by the entry script\n"


@dataclass
class _Merged:
    text: str
    segments: list[
        tuple[int, int, int, int]
    ]  # (merged first line, count, file index, file first line)
    restore: dict[int, str]  # placeholder number -> original statement text
    modules: list[int]  # file index of each region


def _lines(text: str) -> list[str]:
    out = text.splitlines(keepends=True)
    if out and not out[-1].endswith("\n"):
        out[-1] += "\n"
    return out


def merge(files: list[ModuleFile]) -> _Merged:
    restore: dict[int, str] = {}
    counter = [0]

    index = {f.path: k for k, f in enumerate(files)}

    def placeholder(
        lines: list[str],
        start: int,
        end: int,
        modules: list[str] = (),
        paths: list[str] = (),
    ) -> str:
        counter[0] += 1
        restore[counter[0]] = "".join(lines[start - 1 : end])
        if (
            modules
        ):  # `import utils`: utils.f() still names the module's f for the analysis,
            # and the placeholder the file it is (getattr(module_data, name)(...) builds its classes)
            names = [
                f"__ddpify_import_{counter[0]}_{index[p]}__"
                if p in index
                else f"__ddpify_import_{counter[0]}__"
                for p in list(paths) + [""] * (len(modules) - len(paths))
            ]
            return f"import {', '.join(f'{mod} as {name}' for mod, name in zip(names, modules))}\n"
        return IMPORT.format(counter[0])

    def pieces(mod: ModuleFile) -> list[tuple[str, int]]:
        """(text, original first line) runs of the file with its placeholders in."""
        lines = _lines(mod.text)
        spans = [(i.line, i.end, i.modules, i.module_files) for i in mod.imports]
        if mod is not files[0] and mod.main_guard is not None:
            spans.append((*mod.main_guard, [], []))
        out: list[tuple[str, int]] = []
        at = 1
        for start, end, modules, paths in sorted(spans):
            if start > at:
                out.append(("".join(lines[at - 1 : start - 1]), at))
            out.append((placeholder(lines, start, end, modules, paths), start))
            at = end + 1
        if at <= len(lines):
            out.append(("".join(lines[at - 1 :]), at))
        return out

    entry = files[0]
    prelude = (
        0  # the entry's last top-level import before its first def/class/main guard
    )
    for node in entry.tree.body:
        if node.__class__.__name__ in (
            "FunctionDef",
            "AsyncFunctionDef",
            "ClassDef",
        ) or (entry.main_guard and node.lineno == entry.main_guard[0]):
            break
        if node.__class__.__name__ in ("Import", "ImportFrom"):
            prelude = node.end_lineno or node.lineno
    text: list[str] = []
    segments: list[tuple[int, int, int, int]] = []
    line = [1]

    def emit(chunk: str, index: int, first: int, mapped: bool = True) -> None:
        n = chunk.count("\n")
        if mapped:
            if chunk.startswith("import __ddpify_import_"):
                segments.append((line[0], 1, index, first))
            else:
                segments.append((line[0], n, index, first))
        text.append(chunk)
        line[0] += n

    regions: list[int] = []

    def emit_modules() -> None:
        for k, mod in enumerate(files[1:], start=1):
            if not mod.tree.body:
                continue  # nothing runs there: nothing to convert
            regions.append(k)
            emit(BEGIN.format(k), k, 1, mapped=False)
            for chunk, first in pieces(mod):
                emit(chunk, k, first)
            emit(END.format(k), k, 1, mapped=False)

    done = prelude == 0
    if done:
        emit_modules()
    for chunk, first in pieces(entry):
        n = chunk.count("\n")
        last = first if chunk.startswith("import __ddpify_import_") else first + n - 1
        if done or last < prelude:
            emit(chunk, 0, first)
            continue
        cut = n if chunk.startswith("import __ddpify_import_") else prelude - first + 1
        lines = _lines(chunk)
        emit("".join(lines[:cut]), 0, first)
        emit_modules()
        done = True
        if lines[cut:]:
            emit("".join(lines[cut:]), 0, first + cut)
    return _Merged("".join(text), segments, restore, regions)


def where(merged: _Merged, line: int) -> tuple[int, int]:
    for start, count, index, first in merged.segments:
        if start <= line < start + max(count, 1):
            return index, first + (line - start if count > 1 or count == 0 else 0)
    return 0, 1


def _restore(text: str, merged: _Merged) -> str:
    def back(mt: re.Match) -> str:
        indent, k = mt.group(1), int(mt.group(2))
        original = merged.restore[k]
        if not indent:
            return original
        return "".join(indent + ln if ln.strip() else ln for ln in _lines(original))

    return PLACE_RE.sub(back, text)


def split(out: str, merged: _Merged, files: list[ModuleFile]) -> list[str]:
    module = cst.parse_module(out)
    entry_body: list[cst.BaseStatement] = []
    regions: dict[int, list[cst.BaseStatement]] = {}
    footers: dict[int, str] = {}
    current: int | None = None
    for stmt in module.body:
        mark = (
            MARK_RE.match(stmt.name.value)
            if isinstance(stmt, cst.FunctionDef)
            else None
        )
        if mark and mark.group(1) == "begin":
            current = int(mark.group(2))
            regions[current] = []
        elif mark:
            footers[current] = "".join(
                module.code_for_node(line) for line in stmt.leading_lines
            )
            current = None
        elif current is None:
            entry_body.append(stmt)
        else:
            regions[current].append(stmt)
    if set(regions) != set(merged.modules) or set(footers) != set(regions):
        raise ConversionError("a module's boundaries moved")
    outputs = [m.text for m in files]
    entry_body = _own_imports(
        entry_body, [s for body in regions.values() for s in body]
    )
    providers = _providers(entry_body, files[0])
    entry_body = _unused_generated(entry_body, files[0])
    entry_mod = module.with_changes(body=entry_body)
    outputs[0] = _restore(entry_mod.code, merged)
    for k, body in regions.items():
        code = _module_with_header(module, body, providers, files[k]) + footers[k]
        if files[k].main_guard is not None and _restore(code, merged) != files[k].text:
            # the module is also a script: run directly, it sets up its own process group
            dist = next(
                (
                    n
                    for p in providers
                    for n in _bound(p)
                    if "torch.distributed" in cst.parse_module("").code_for_node(p)
                    and "import" in cst.parse_module("").code_for_node(p)
                ),
                None,
            )
            if dist is not None and re.search(
                rf"\b({dist}\.|DDP\(|ddp_in_place\()", _restore(code, merged)
            ):  # it needs a group
                code = (
                    _module_with_header(
                        module, body, providers, files[k], {"ddp_setup", dist}
                    )
                    + footers[k]
                )
                code = _run_directly(_restore(code, merged), dist)
        code = _restore(code, merged)
        original = files[k].text
        if not original.endswith("\n") and code == original + "\n":
            code = original
        outputs[k] = code
    if any(PLACE_RE.search(o) for o in outputs):
        raise ConversionError("a placeholder was left behind")
    return outputs


KEPT = {
    "LOCAL_RANK",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_DEVICE",
    "ddp_setup",
}  # the entry's set-up, as in one file
# helpers the set-up block defines for the code that needs them (transforms/launch.py): the entry
# keeps one only where it uses it, as the modules do
HELPERS = {
    "rank0_decides",
    "RankShard",
    "DistributedSamplerWrapper",
    "rank_share",
    "rank_batches",
    "rank_rows",
    "in_float32",
    "rank0_seed",
    "rank0_value",
    "amp_initialize",
    "ddp_local_batch",
    "ddp_in_place",
}


def _unused_generated(
    body: list[cst.BaseStatement], entry: ModuleFile
) -> list[cst.BaseStatement]:
    """What ddpify generated for the modules only (the AMP scaler, DDP's import when the wrap is
    in a trainer module) does not stay in the entry: each module has its own copy."""
    original = {
        _EMPTY.code_for_node(s.with_changes(leading_lines=[]))
        for s in cst.parse_module(entry.text).body
    }
    names = [_names(s) for s in body]
    keep = [True] * len(body)
    changed = True
    while changed:
        changed = False
        for i, s in enumerate(body):
            top = names[i][0]
            text = _EMPTY.code_for_node(s.with_changes(leading_lines=[]))
            simple = (
                isinstance(s, cst.SimpleStatementLine)
                and len(s.body) == 1
                and isinstance(s.body[0], (cst.Assign, cst.Import, cst.ImportFrom))
            )
            simple = simple or (
                isinstance(s, (cst.FunctionDef, cst.ClassDef))
                and s.name.value in HELPERS
            )
            if (
                not keep[i]
                or not simple
                or not top
                or top & KEPT
                or text in original
                or "__ddpify_import_" in text
            ):
                continue
            if not any(
                keep[j] and top & names[j][2] for j in range(len(body)) if j != i
            ):
                keep[i] = False
                changed = True
    out = [s for s, k in zip(body, keep) if k]
    for i, s in enumerate(
        body
    ):  # a removed statement's blank lines go to the one after it
        if (
            not keep[i]
            and i + 1 < len(body)
            and keep[i + 1]
            and s.leading_lines
            and not body[i + 1].leading_lines
        ):
            out[out.index(body[i + 1])] = body[i + 1].with_changes(
                leading_lines=[ln for ln in s.leading_lines if ln.comment is None]
            )
    return out


def _own_imports(
    body: list[cst.BaseStatement], modules: list[cst.BaseStatement]
) -> list[cst.BaseStatement]:
    """The generated code of the entry may use a name (`os`) that only a module imported in the
    merged program: the entry gets its own copy of that import, before its first use."""
    bound = set().union(*(_bound(s) for s in body)) if body else set()
    imports = [
        s
        for s in modules
        if isinstance(s, cst.SimpleStatementLine)
        and all(isinstance(x, cst.Import) for x in s.body)
        and "__ddpify_import_" not in cst.parse_module("").code_for_node(s)
    ]
    out: list[cst.BaseStatement] = []
    for stmt in body:
        _, inner, read = _names(stmt)
        missing = (
            read - bound - inner
        )  # not the names a function imports or binds itself
        for imp in imports:
            names = _bound(imp)
            if len(names) == 1 and names & missing:
                out.append(imp.with_changes(leading_lines=[]))
                bound |= names
                missing -= names
        out.append(stmt)
    return out


_EMPTY = cst.parse_module("")


def _names(node: cst.CSTNode) -> tuple[set[str], set[str], set[str]]:
    """(names the top-level statement binds at its level, every name bound anywhere in it,
    names it reads), through the standard library's ast (walking LibCST children is slow)."""
    import ast

    tree = ast.parse(_EMPTY.code_for_node(node.with_changes(leading_lines=[])))
    top: set[str] = set()
    inner: set[str] = set()
    read: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            top.add(stmt.name)
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name):
                (read if isinstance(n.ctx, ast.Load) else inner).add(n.id)
                if not isinstance(n.ctx, ast.Load) and not isinstance(
                    stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
                ):
                    top.add(n.id)
            elif isinstance(n, ast.alias):
                bound = n.asname or n.name.split(".")[0]
                inner.add(bound)
                if n in getattr(stmt, "names", ()):
                    top.add(bound)
            elif isinstance(n, ast.arg):
                inner.add(n.arg)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner.add(n.name)
    return top, inner | top, read


def _bound(node: cst.CSTNode) -> set[str]:
    return _names(node)[0]


def _used(node: cst.CSTNode) -> set[str]:
    return _names(node)[2]


def _providers(
    entry_body: list[cst.BaseStatement], entry: ModuleFile
) -> list[cst.BaseStatement]:
    """Top-level statements of the converted entry a module may need a copy of: what ddpify
    generated (imports, rank constants, helpers) and the entry's own imports."""
    original = {
        cst.parse_module("").code_for_node(s.with_changes(leading_lines=[]))
        for s in cst.parse_module(entry.text).body
    }
    out = []
    empty = cst.parse_module("")
    for s in entry_body:
        text = empty.code_for_node(s.with_changes(leading_lines=[]))
        is_import = isinstance(s, cst.SimpleStatementLine) and all(
            isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body
        )
        if "__ddpify_import_" in text or isinstance(s, cst.If):
            continue
        if is_import or (text not in original and _bound(s)):
            out.append(s)
    return out


def _run_directly(code: str, dist: str) -> str:
    """`python module.py` still works: its main guard sets up the group first and tears it down."""
    tree = cst.parse_module(code)
    body = list(tree.body)
    for i, stmt in enumerate(body):
        if (
            isinstance(stmt, cst.If)
            and isinstance(stmt.body, cst.IndentedBlock)
            and "__main__" in tree.code_for_node(stmt.test)
        ):
            inner = [
                cst.parse_statement("ddp_setup()\n"),
                *stmt.body.body,
                cst.parse_statement(f"{dist}.destroy_process_group()\n"),
            ]
            body[i] = stmt.with_changes(body=stmt.body.with_changes(body=inner))
            return tree.with_changes(body=body).code
    return code


def _module_with_header(
    module: cst.Module,
    body: list[cst.BaseStatement],
    providers: list[cst.BaseStatement],
    mod: ModuleFile,
    extra: set[str] = frozenset(),
) -> str:
    own: set[str] = set()
    need = set(extra)
    for s in body:
        _, inner, read = _names(s)
        own |= inner
        need |= read
    need -= own
    chosen: list[cst.BaseStatement] = []
    changed = True
    while changed:
        changed = False
        for p in providers:
            if p in chosen:
                continue
            names = _bound(p)
            if names & need:
                chosen.append(p)
                need |= _used(p) - own - names
                changed = True
    header = [p for p in providers if p in chosen]
    if not header:
        return module.with_changes(body=body, header=[], footer=[]).code
    # after the module's own imports at the top (a docstring and __future__ first)
    at = 0
    for i, s in enumerate(body):
        if isinstance(s, (cst.FunctionDef, cst.ClassDef, cst.If)):
            break
        if isinstance(s, cst.SimpleStatementLine) and any(
            isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body
        ):
            at = i + 1
        elif (
            i == 0
            and isinstance(s, cst.SimpleStatementLine)
            and isinstance(s.body[0], cst.Expr)
            and isinstance(s.body[0].value, cst.SimpleString)
        ):
            at = 1
    imports = [
        p
        for p in header
        if isinstance(p, cst.SimpleStatementLine)
        and all(isinstance(x, (cst.Import, cst.ImportFrom)) for x in p.body)
    ]
    rest = [p for p in header if p not in imports]
    block = [s.with_changes(leading_lines=[]) for s in imports]
    if rest:
        first = rest[0]
        note = cst.EmptyLine(comment=cst.Comment(HEADER_NOTE.strip()))
        lead = [ln for ln in first.leading_lines if ln.comment is not None]
        block.append(first.with_changes(leading_lines=[cst.EmptyLine(), note, *lead]))
        block += rest[1:]
    if at < len(body) and at > 0:
        nxt = body[at]
        if not any(ln.comment is None for ln in nxt.leading_lines[:1]):
            body = [
                *body[:at],
                nxt.with_changes(leading_lines=[cst.EmptyLine(), *nxt.leading_lines]),
                *body[at + 1 :],
            ]
    return module.with_changes(
        body=[*body[:at], *block, *body[at:]], header=[], footer=[]
    ).code
