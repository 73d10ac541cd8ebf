"""Every refusal of the fixtures is checked mechanically where it can be: the finding names a
file of the fixture and a line that file has, and each name it quotes in backticks (a variable,
an attribute, a call) is one that file (or, in a project, the project) binds, or one ddpify
itself writes. A refusal is a conversion still owed: what it points at must exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import ROOT

LINE = re.compile(
    r"^(?P<path>[^:]+):(?P<line>\d+):(?P<col>\d+): (?P<code>DDP\d+) \[blocking\] (?P<msg>.*)$"
)
QUOTED = re.compile(r"`([^`]+)`")
DOTTED = re.compile(r"^[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*(?:\(\.\.\.\)|\(\))?$")
# names the conversion writes (the set-up, generated helpers, torch's own) and Python's builtins
OURS = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_DEVICE",
    "DDP",
    "dist",
    "DistributedSampler",
    "torch",
    "os",
    "sys",
    "np",
    "nn",
    "self",
    "print",
    "open",
    "iter",
    "next",
    "range",
    "ForwardTo",
    "SCALER",
    "AMP_DTYPE",
    # the directives a message names (`# ddpify: skip`/`off`)
    "skip",
    "off",
    "on",
}
OURS_PREFIX = (
    "ddp_",
    "rank0_",
    "rank_",
    "torch.",
    "dist.",
    "os.",
    "np.",
    "nn.",
    "DDP(",
)


def _fixtures():
    dirs = [p for p in sorted((ROOT / "fixtures").iterdir()) if p.is_dir()]
    dirs += sorted((ROOT / "fixtures" / "rules").glob("DDP*"))
    out = []
    for d in dirs:
        exp = d / "expected.txt"
        if exp.exists() and "[blocking]" in exp.read_text():
            out.append(d)
    return out


REFUSALS = _fixtures()


def _files(d: Path) -> dict[str, str]:
    """The files a finding of this fixture may name, by the name it uses."""
    if (d / "output.py").exists():  # a gate example: the converted program itself
        return {"output.py": (d / "output.py").read_text()}
    for top in (
        "input",
        "output",
    ):  # a project; the modules invariant's example: output/
        if (d / top).is_dir():
            return {
                str(p.relative_to(d / top)): p.read_text()
                for p in (d / top).rglob("*.py")
            }
    return {"input.py": (d / "input.py").read_text()}


def _bound(text: str) -> set[str]:
    """Every name a file binds or reads, and every attribute it names (self.net, args.lr)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.alias):
            out.add((node.asname or node.name).split(".")[0])
            out.add(node.name.rsplit(".", 1)[-1])
        elif isinstance(node, ast.keyword) and node.arg:
            out.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.update(re.findall(r"[A-Za-z_]\w*", node.value))
    return out


def test_there_are_refusals_to_check():
    assert len(REFUSALS) >= 20


@pytest.mark.parametrize("d", REFUSALS, ids=[d.name for d in REFUSALS])
def test_a_refusal_names_a_line_and_objects_its_file_has(d):
    lines = [
        ln for ln in (d / "expected.txt").read_text().splitlines() if "[blocking]" in ln
    ]
    assert lines
    _check(d.name, _files(d), lines)


# scripts of the generator (bench/shapes): a seed no rule was written from, converted only
GEN_SEED, GEN_N = 7301, 12


def test_a_generated_scripts_refusals_name_lines_and_objects_it_has(tmp_path):
    import sys

    from ddpify import Options
    from ddpify.project import convert_projects

    sys.path.insert(0, str(ROOT / "bench" / "shapes"))
    try:
        from gen import draw
    finally:
        sys.path.pop(0)
    checked = 0
    for i in range(GEN_N):
        prog = draw(GEN_SEED, i)
        root = tmp_path / str(i)
        prog.write(root)
        (result,) = convert_projects([(str(root / prog.entry_file), Options())])
        lines = [
            f.format(str(Path(r.path).resolve().relative_to(root.resolve())))
            for r in result.files
            for f in r.findings
        ]
        lines = [ln for ln in lines if "[blocking]" in ln]
        if lines:
            checked += 1
            _check(f"seed {GEN_SEED} case {i}", dict(prog.files), lines)
    assert checked >= 1, "no refusal among the generated scripts: draw more"


def _check(what: str, files: dict[str, str], lines: list[str]) -> None:
    names = set().union(*(_bound(t) for t in files.values()))
    d = type("Where", (), {"name": what})
    for ln in lines:
        m = LINE.match(ln)
        assert m, f"not a finding line: {ln}"
        path, line = m["path"], int(m["line"])
        assert path in files, f"{d.name}: names {path}, which the fixture does not have"
        count = files[path].count("\n") + (0 if files[path].endswith("\n") else 1)
        assert 1 <= line <= count, (
            f"{d.name}: line {line} of {path} ({count} lines): {ln}"
        )
        for quoted in QUOTED.findall(m["msg"]):
            q = quoted.strip()
            if not DOTTED.match(q) or q in OURS or q.startswith(OURS_PREFIX):
                continue
            parts = q.split("(")[0].split(".")
            missing = [p for p in parts if p not in names and p not in OURS]
            assert not missing, (
                f"{d.name}: `{q}` names {missing}, which no file of the fixture has: {ln}"
            )
