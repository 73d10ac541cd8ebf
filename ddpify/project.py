"""Project mode: an entry script and the local modules it imports, converted as one program.

The modules' texts are placed, in import order, after the entry's imports in one merged source
(each between two marker functions; every import of a local module and every module's own
`if __name__ == "__main__":` block stands in as a placeholder import), the merged source goes
through the one-file pipeline, and the result is split back into files. So the analysis sees the
model, optimizer, loaders, step and epoch loop wherever they are; the set-up (ddp_setup(), the
teardown) lands in the entry, and each module gets the generated names it uses (the import-safe
rank constants, imports, helpers) in a small header of its own: no process group at import time.
Findings come back with the line of the file they concern.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace

from ddpify.analysis.entries import console_functions
from ddpify.analysis.project import ModuleFile, local_modules
from ddpify.directives import ignored_codes
from ddpify.findings import Finding
from ddpify.formatting import fit_lines
from ddpify.gate import modules as gate_modules
from ddpify.merge import merge, split, where
from ddpify.options import Options
from ddpify.partial import mark_unresolved
from ddpify.pipeline import ConversionError, convert_source, undefined_findings
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP100",
    "project-lazy-import",
    "project mode: training code in a local module it cannot follow (imported inside a function)",
    severity="blocking",
)
declare(
    "DDP101",
    "project-shared-module",
    "project mode: a module shared by several entry scripts would be converted differently for each",
    severity="blocking",
)
declare(
    "DDP102",
    "project-module-is-script",
    'project mode: a module that is also a script (`if __name__ == "__main__":`) whose block would fail on code converted for the entry',
    severity="blocking",
)


@dataclass
class FileResult:
    path: str  # absolute
    source: str  # the original text
    output: str  # converted text (== source when unchanged or refused)
    findings: list[Finding] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.output != self.source


@dataclass
class ProjectResult:
    entry: str
    root: str
    status: str
    files: list[FileResult]

    @property
    def blocking(self) -> list[Finding]:
        return [f for r in self.files for f in r.findings if f.blocking]


def is_project(entry: str) -> bool:
    """Whether the entry imports a local module at top level (project mode applies)."""
    try:
        _, files = local_modules(entry)
    except (SyntaxError, OSError, UnicodeDecodeError, ValueError):
        return False
    return len(files) > 1


def convert_project(
    entry: str, options: Options | None = None, read=None
) -> ProjectResult:
    """Convert entry and its local modules as one program. Nothing is written here."""
    options = options or Options()
    root, files = local_modules(entry, read)
    merged = merge(files)
    # converted in full even where a finding blocks: whether a module's own __main__ block runs
    # code the conversion changes (DDP102) is read from the outputs; nothing is written here.
    # Lines are wrapped file by file, after the split (fit_lines compares each with its input).
    console = tuple(
        (k, f) for k, mod in enumerate(files) for f in console_functions(mod.path)
    )
    result = convert_source(
        merged.text,
        replace(
            options, partial=True, line_length=0, mark_unresolved=False, console=console
        ),
        path=entry,
    )
    per_file: list[list[Finding]] = [[] for _ in files]
    for f in result.findings:
        index, line = where(merged, f.line) if f.line else (0, f.line)
        per_file[index].append(
            Finding(line, f.col, f.code, f.message, f.fixed, f.severity)
        )
    # a project already distributed (Accelerate, DDP, ...) is converted in no file: what would make
    # a conversion of its modules wrong does not apply
    untouched = result.status == "already-distributed"
    for k, mod in enumerate(files if not untouched else []):
        for line, path in mod.lazy:
            if _trains(path):
                rel = os.path.relpath(path, os.path.dirname(mod.path))
                per_file[k].append(
                    Finding(
                        line,
                        1,
                        "DDP100",
                        f"{rel} holds a training step (backward) but is imported inside a function here, and project mode follows top-level imports only: move this import to the top of the file, or convert {rel} by hand",
                        False,
                    )
                )
    if not untouched and result.changed:
        # the invariant gate's own reading of what the program imports (ddpify/gate/modules.py)
        index = {m.path: k for k, m in enumerate(files)}
        for path, line, col, message in gate_modules.check(
            entry, root, {m.path: m.text for m in files}
        ):
            per_file[index[path]].append(
                Finding(line, col, "DDP155", message, False, "blocking")
            )
    per_file = [_kept(fs, m.text, options) for fs, m in zip(per_file, files)]
    outputs = [m.text for m in files]
    status = result.status
    blocked = any(f.blocking for fs in per_file for f in fs)
    if result.changed:
        try:
            outputs = [
                fit_lines(m.text, out, options.line_length)
                for m, out in zip(files, split(result.source, merged, files))
            ]
        except ConversionError:
            if options.partial or not blocked:
                raise  # a tree the split cannot take apart is a bug, and no file is written
        else:
            if options.partial or not blocked:
                # each file on its own: a name another of the project's files binds is not defined here
                for k, (mod, out) in enumerate(zip(files, outputs)):
                    if out != mod.text:
                        per_file[k] = sorted(
                            set(per_file[k])
                            | set(
                                _kept(
                                    undefined_findings(mod.text, out), mod.text, options
                                )
                            )
                        )
    for k, mod in enumerate(files[1:], start=1):
        found = _script_running_changes(mod, outputs[k])
        if found:
            line, what = found
            name = os.path.basename(mod.path)
            per_file[k] += _kept(
                [
                    Finding(
                        line,
                        1,
                        "DDP102",
                        f'{name} is also a script, and `python {name}` would fail: its `if __name__ == "__main__":` block runs {what}. Move that block into a script of its own (and convert that one too), or convert by hand',
                        False,
                    )
                ],
                mod.text,
                options,
            )
    if (
        options.partial and options.mark_unresolved and result.changed
    ):  # the draft raises where a blocking finding remains
        outputs = [
            mark_unresolved(m.text, out, [f for f in fs if f.blocking])
            if out != m.text
            else out
            for m, out, fs in zip(files, outputs, per_file)
        ]
    if any(f.blocking for fs in per_file for f in fs) and not options.partial:
        status = (
            "refused"  # a wrong program is worse than none: every file stays as it is
        )
        per_file = [[f for f in fs if f.blocking] for fs in per_file]
        outputs = [m.text for m in files]
    return ProjectResult(
        os.path.realpath(entry),
        root,
        status,
        [
            FileResult(m.path, m.text, out, sorted(set(fs)))
            for m, out, fs in zip(files, outputs, per_file)
        ],
    )


def _script_running_changes(mod: ModuleFile, output: str) -> tuple[int, str] | None:
    """(line of the guard, why) when a module's own `if __name__ == "__main__":` block would fail
    on code the conversion changed: a function or class of the module it reaches (through the
    module's own functions) that now calls `loader.sampler.set_epoch(...)` while the block builds
    its own loader (not converted: no DistributedSampler), or reads `model.module` of a model it
    does not wrap itself; or top-level code, which runs before the block sets up a group, that
    now needs one. Other changes (rank-0 guards, autocast, a wrap: the block then sets up a group
    of one, merge.py) keep the script working, and a demo block that only uses what the
    conversion left as it is (a model's smoke test, a loss's gradient check) is no reason to
    refuse: the entry imports the module, and importing it runs no such block."""
    import ast

    if mod.main_guard is None or output == mod.text:
        return None
    try:
        new = ast.parse(output)
    except SyntaxError:
        return None

    def parts(tree: ast.Module, text: str) -> tuple[dict[str, str], list[str]]:
        defs, others = {}, []
        for n in tree.body:
            seg = ast.get_source_segment(text, n) or ""
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defs[n.name] = seg
            elif "__main__" not in seg:
                others.append(seg)
        return defs, others

    old_defs, old_others = parts(mod.tree, mod.text)
    new_defs, new_others = parts(new, output)
    line = mod.main_guard[0]
    added = [seg for seg in new_others if seg not in old_others]
    needs_group = next(
        (
            seg
            for seg in added
            if re.search(r"\bDistributedSampler\(|\bDDP\(|\bdist\.\w+\(", seg)
        ),
        None,
    )
    if needs_group:
        return (
            line,
            f"after the module's top-level code, which now needs a process group before the block can set one up (`{needs_group.splitlines()[0]}`)",
        )
    guard = next(
        n for n in mod.tree.body if getattr(n, "lineno", 0) == mod.main_guard[0]
    )
    nodes = {
        n.name: n
        for n in mod.tree.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    reached: list[str] = []
    work: list[ast.AST] = [guard]
    while work:
        for n in ast.walk(work.pop()):
            if isinstance(n, ast.Name) and n.id in nodes and n.id not in reached:
                reached.append(n.id)
                work.append(nodes[n.id])
    builds_loader = "DataLoader(" in (
        ast.get_source_segment(mod.text, guard) or ""
    ) or any(
        "DataLoader(" in old_defs[n] for n in reached if new_defs.get(n) == old_defs[n]
    )
    for name in reached:
        before, after = old_defs[name], new_defs.get(name, old_defs[name])
        if after == before:
            continue
        fresh = [ln for ln in after.splitlines() if ln not in before.splitlines()]
        calls = [
            mt
            for ln in fresh
            for mt in [re.search(r"([\w.]+)\.sampler\.set_epoch\(", ln)]
            if mt
        ]
        # `if hasattr(loader.sampler, "set_epoch"):` before it: a plain loader passes through
        epoch = next(
            (
                mt.group(0)
                for mt in calls
                if f'hasattr({mt.group(1)}.sampler, "set_epoch")' not in after
            ),
            None,
        )
        if epoch and builds_loader:
            return line, (
                f"`{name}`, which now calls `{epoch}...)` as converted for the entry, while the loader the block "
                "builds is left as it is, with no DistributedSampler (AttributeError)"
            )
        wrapped = {
            mt.group(1)
            for ln in fresh
            for mt in [re.search(r"([\w.]+) = DDP\(", ln)]
            if mt
        }
        plain = next(
            (
                mt.group(1)
                for ln in fresh
                for mt in [re.search(r"([\w.]+)\.module\b", ln)]
                if mt and mt.group(1) not in wrapped
            ),
            None,
        )
        if plain:
            return line, (
                f"`{name}`, which now reads `{plain}.module` as converted for the entry, where the model is wrapped "
                "in DDP, while the block passes a plain model (AttributeError)"
            )
    return None


def _trains(path: str) -> bool:
    try:
        if not os.path.isfile(path):
            return False
        with open(path, encoding="utf-8") as f:
            return ".backward(" in f.read()
    except (OSError, UnicodeDecodeError):
        return False


def _kept(findings: list[Finding], text: str, options: Options) -> list[Finding]:
    """Project-level findings obey `# ddpify: ignore[CODE]` and --ignore like the others."""
    marks = ignored_codes(text)

    def kept(f: Finding) -> bool:
        if f.code in options.ignore:
            return False
        codes = marks.get(f.line, frozenset())
        return not (codes is None or f.code in codes)

    return [f for f in findings if f.code not in ("DDP100", "DDP102") or kept(f)]


def convert_projects(
    entries: list[tuple[str, Options]], read=None, errors: tuple = ()
) -> list[ProjectResult | str]:
    """Several entry scripts (`ddpify DIR`): each project converted from the files as they are.
    A module shared by several projects must come out the same in each, and stays as it is when
    one of them is refused: otherwise those projects are refused too (DDP101). An entry that cannot
    be read or parsed gives an error text instead of a result."""
    done: list[ProjectResult | str] = []
    for path, options in entries:
        try:
            done.append(convert_project(path, options, read=read))
        except (
            SyntaxError,
            ConversionError,
            OSError,
            UnicodeDecodeError,
            *errors,
        ) as exc:
            done.append(
                f"{path}: error: project mode: {getattr(exc, 'message', None) or exc}; no file of the project was changed"
            )
    results = [r for r in done if isinstance(r, ProjectResult)]
    outputs: dict[str, dict[str, str]] = {}  # module -> entry -> its output
    for res in results:
        for r in res.files[1:]:
            outputs.setdefault(r.path, {})[res.entry] = r.output
    for res in results:
        for r in res.files[1:]:
            other = next(
                (e for e, out in outputs[r.path].items() if out != r.output), None
            )
            if other is not None:
                _refuse(
                    res,
                    r,
                    f"this module is part of the projects of {os.path.basename(res.entry)} and {os.path.basename(other)}, which would convert it differently: make both use it the same way, or convert it by hand",
                )
                break
    changed = True
    while changed:  # a module shared with a refused project stays as it is: so do its other projects
        changed = False
        refused = {
            r.path: res.entry
            for res in results
            if res.status == "refused"
            for r in res.files[1:]
        }
        for res in results:
            hit = next(
                (
                    r
                    for r in res.files[1:]
                    if r.path in refused and res.status != "refused"
                ),
                None,
            )
            if hit is not None:
                _refuse(
                    res,
                    hit,
                    f"this module is also part of the project of {os.path.basename(refused[hit.path])}, which is refused: it stays as it is, and so does this project",
                )
                changed = True
    return done


def _refuse(res: ProjectResult, where: FileResult, message: str) -> None:
    res.status = "refused"
    for r in res.files:
        r.output = r.source
        r.findings = [f for f in r.findings if f.blocking]
    where.findings.append(Finding(1, 1, "DDP101", message, False))
