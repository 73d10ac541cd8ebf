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

import dataclasses
import os
from dataclasses import dataclass, field

from ddpify.analysis.project import ModuleFile, local_modules
from ddpify.directives import ignored_codes
from ddpify.findings import Finding
from ddpify.formatting import fit_lines
from ddpify.merge import merge, split, where
from ddpify.options import Options
from ddpify.pipeline import ConversionError, convert_source, undefined_findings
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare("DDP100", "project-lazy-import", "project mode: training code in a local module it cannot follow (imported inside a function)", severity="blocking")
declare("DDP101", "project-shared-module", "project mode: a module shared by several entry scripts would be converted differently for each", severity="blocking")
declare("DDP102", "project-module-is-script", "project mode: a module that is also a script (`if __name__ == \"__main__\":`) runs the training loop converted for the entry", severity="blocking")


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


def convert_project(entry: str, options: Options | None = None, read=None) -> ProjectResult:
    """Convert entry and its local modules as one program. Nothing is written here."""
    options = options or Options()
    root, files = local_modules(entry, read)
    merged = merge(files)
    # lines are wrapped file by file, after the split (fit_lines compares each with its input)
    result = convert_source(merged.text, dataclasses.replace(options, line_length=0), path=entry)
    per_file: list[list[Finding]] = [[] for _ in files]
    for f in result.findings:
        index, line = where(merged, f.line) if f.line else (0, f.line)
        per_file[index].append(Finding(line, f.col, f.code, f.message, f.fixed, f.severity))
    for k, mod in enumerate(files):
        for line, path in mod.lazy:
            if _trains(path):
                rel = os.path.relpath(path, os.path.dirname(mod.path))
                per_file[k].append(Finding(line, 1, "DDP100", f"{rel} holds a training step (backward) but is imported inside a function here, and project mode follows top-level imports only: move this import to the top of the file, or convert {rel} by hand", False))
    for k, mod in enumerate(files[1:], start=1):
        line = _script_reaching_training(mod)
        if line:
            name = os.path.basename(mod.path)
            per_file[k].append(Finding(line, 1, "DDP102", f"{name} is also a script, and its `if __name__ == \"__main__\":` block runs its training code, which project mode converts for {os.path.basename(entry)}: `python {name}` would then run it without a DistributedSampler or process group of its own. Move that block into a script of its own (and convert that one too), or convert by hand", False))
    per_file = [_kept(fs, m.text, options) for fs, m in zip(per_file, files)]
    outputs = [m.text for m in files]
    status = result.status
    if result.changed and (options.partial or not any(f.blocking for fs in per_file for f in fs)):
        # a tree the split cannot take apart is a bug: ConversionError, and no file is written
        outputs = [fit_lines(m.text, out, options.line_length) for m, out in zip(files, split(result.source, merged, files))]
        # each file on its own: a name another of the project's files binds is not defined here
        for k, (mod, out) in enumerate(zip(files, outputs)):
            if out != mod.text:
                per_file[k] = sorted(set(per_file[k]) | set(_kept(undefined_findings(mod.text, out), mod.text, options)))
    if any(f.blocking for fs in per_file for f in fs) and not options.partial:
        status = "refused"  # a wrong program is worse than none: every file stays as it is
        per_file = [[f for f in fs if f.blocking] for fs in per_file]
        outputs = [m.text for m in files]
    return ProjectResult(os.path.realpath(entry), root, status, [
        FileResult(m.path, m.text, out, sorted(set(fs))) for m, out, fs in zip(files, outputs, per_file)
    ])


def _script_reaching_training(mod: ModuleFile) -> int:
    """Line of a module's main guard that calls one of the module's functions or classes holding
    a backward(), or 0."""
    import ast

    if mod.main_guard is None or ".backward(" not in mod.text:
        return 0
    training = {n.name for n in ast.walk(mod.tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and ".backward(" in (ast.get_source_segment(mod.text, n) or "")}
    guard = next(n for n in mod.tree.body if getattr(n, "lineno", 0) == mod.main_guard[0])
    called = {n.func.id for n in ast.walk(guard) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return mod.main_guard[0] if called & training or ".backward(" in (ast.get_source_segment(mod.text, guard) or "") else 0


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


def convert_projects(entries: list[tuple[str, Options]], read=None, errors: tuple = ()) -> list[ProjectResult | str]:
    """Several entry scripts (`ddpify DIR`): each project converted from the files as they are.
    A module shared by several projects must come out the same in each, and stays as it is when
    one of them is refused: otherwise those projects are refused too (DDP101). An entry that cannot
    be read or parsed gives an error text instead of a result."""
    done: list[ProjectResult | str] = []
    for path, options in entries:
        try:
            done.append(convert_project(path, options, read=read))
        except (SyntaxError, ConversionError, OSError, UnicodeDecodeError, *errors) as exc:
            done.append(f"{path}: error: project mode: {getattr(exc, 'message', None) or exc}; no file of the project was changed")
    results = [r for r in done if isinstance(r, ProjectResult)]
    outputs: dict[str, dict[str, str]] = {}  # module -> entry -> its output
    for res in results:
        for r in res.files[1:]:
            outputs.setdefault(r.path, {})[res.entry] = r.output
    for res in results:
        for r in res.files[1:]:
            other = next((e for e, out in outputs[r.path].items() if out != r.output), None)
            if other is not None:
                _refuse(res, r, f"this module is part of the projects of {os.path.basename(res.entry)} and {os.path.basename(other)}, which would convert it differently: make both use it the same way, or convert it by hand")
                break
    changed = True
    while changed:  # a module shared with a refused project stays as it is: so do its other projects
        changed = False
        refused = {r.path: res.entry for res in results if res.status == "refused" for r in res.files[1:]}
        for res in results:
            hit = next((r for r in res.files[1:] if r.path in refused and res.status != "refused"), None)
            if hit is not None:
                _refuse(res, hit, f"this module is also part of the project of {os.path.basename(refused[hit.path])}, which is refused: it stays as it is, and so does this project")
                changed = True
    return done


def _refuse(res: ProjectResult, where: FileResult, message: str) -> None:
    res.status = "refused"
    for r in res.files:
        r.output = r.source
        r.findings = [f for f in r.findings if f.blocking]
    where.findings.append(Finding(1, 1, "DDP101", message, False))
