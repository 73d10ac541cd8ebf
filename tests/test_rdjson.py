"""--output-format rdjson: the conversion as reviewdog suggestions. On every fixture (single files
and projects), the suggestions applied to the input give the expected output byte for byte, both
as reviewdog.proto defines a range and as reviewdog's GitHub reporter turns a suggestion into a
suggested change of whole lines; each is one hunk of a line diff; the document is valid against
a schema written from reviewdog.proto (tests/schemas/rdjson.schema.json).

DDPIFY_RDJSON_SCHEMA_DIR may name a folder with reviewdog's own generated schemas
(proto/rdf/jsonschema/): the documents are then validated against DiagnosticResult.json too.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
import shutil
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner
from conftest import FIXTURES, PROJECTS, ROOT

from ddpify.cli import convert_command
from ddpify.findings import Finding
from ddpify.report import FileResult, rdjson

SCHEMA = json.loads((ROOT / "tests" / "schemas" / "rdjson.schema.json").read_text())


def _inline(node, defs):
    """The schema with its "#/definitions/..." references replaced by what they name (it has no
    cycles): validating ~300 documents then takes a second, not half a minute."""
    if isinstance(node, dict):
        if "$ref" in node:
            return _inline(defs[node["$ref"].rsplit("/", 1)[1]], defs)
        return {k: _inline(v, defs) for k, v in node.items() if k != "definitions"}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


jsonschema.Draft7Validator.check_schema(SCHEMA)
VALIDATOR = jsonschema.Draft7Validator(_inline(SCHEMA, SCHEMA["definitions"]))
OFFICIAL = os.environ.get("DDPIFY_RDJSON_SCHEMA_DIR")

_FINDING = re.compile(
    r"^(?P<path>.+?):(?P<line>\d+):(?P<col>\d+): (?P<code>DDP\d{3})(?P<mark> \[\*\]| \[blocking\])? (?P<msg>.*)$"
)


def findings_of(expected_txt: str) -> dict[str, list[Finding]]:
    """expected.txt's lines as Findings, by path."""
    out: dict[str, list[Finding]] = {}
    for line in expected_txt.splitlines():
        mo = _FINDING.match(line)
        assert mo, line
        mark = mo["mark"] or ""
        f = Finding(
            int(mo["line"]),
            int(mo["col"]),
            mo["code"],
            mo["msg"],
            fixed=mark == " [*]",
            severity="blocking" if mark == " [blocking]" else "note",
        )
        out.setdefault(mo["path"], []).append(f)
    return out


# ----------------------------------------------------------------------------- appliers


@functools.lru_cache(maxsize=8)
def line_starts(data: bytes) -> list[int]:
    """The offset of each line's first byte; a line ends after its b"\\n"."""
    return [0] + [m.end() for m in re.finditer(b"\n", data) if m.end() < len(data)]


def offset(data: bytes, pos: dict) -> int:
    """reviewdog.proto's Position: line from 1, column from 1 in UTF-8 bytes; the start of the line
    after a final newline is the end of the file."""
    line, col = pos["line"], pos["column"]
    starts = line_starts(data)
    assert line >= 1 and col >= 1, pos
    if line == len(starts) + 1:
        assert data.endswith(b"\n") and col == 1, pos
        return len(data)
    assert line <= len(starts), pos
    end = starts[line] - 1 if line < len(starts) else len(data) - data.endswith(b"\n")
    at = starts[line - 1] + col - 1
    assert at <= end, (
        f"column past the end of line {line}: {pos}"
    )  # the newline is the next line's start
    assert at == len(data) or data[at] & 0xC0 != 0x80, (
        f"column inside a UTF-8 character: {pos}"
    )
    return at


def apply(data: bytes, diagnostics: list[dict], path: str) -> bytes:
    """Every suggestion for `path`: its range [start, end) replaced by its text."""
    edits = []
    for d in diagnostics:
        if d["location"]["path"] != path:
            continue
        for s in d.get("suggestions", []):
            r = s["range"]
            start, end = (
                offset(data, r["start"]),
                offset(data, r.get("end", r["start"])),
            )
            assert start <= end, r
            edits.append((start, end, s["text"].encode("utf-8")))
    edits.sort(key=lambda e: (e[0], e[1]))
    for (_, e1, _), (s2, _, _) in zip(edits, edits[1:]):
        assert e1 <= s2, "overlapping suggestions"
    for start, end, text in reversed(edits):
        data = data[:start] + text + data[end:]
    return data


def apply_as_github(data: bytes, diagnostics: list[dict], path: str) -> bytes:
    """As reviewdog's github-pr-review reporter posts a suggestion with columns: the lines from the
    range's start line to its end line become start_line[:column-1] + text + end_line[column-1:],
    and GitHub replaces those lines with it. Its comment covers the diagnostic's lines, which must
    be the suggestion's."""
    lines = data.decode("utf-8").split(
        "\n"
    )  # the last item is "" after a final newline
    real = len(lines) - (lines[-1] == "")
    edits = []
    for d in diagnostics:
        if d["location"]["path"] != path or not d.get("suggestions"):
            continue
        (s,) = d["suggestions"]
        r = s["range"]
        assert d["location"]["range"] == r, (
            "the comment's lines and the suggestion's must be the same"
        )
        first, last = r["start"]["line"], r["end"]["line"]
        assert 1 <= first <= last <= real, f"reviewdog has no source line for {r}"
        head = lines[first - 1].encode()[: r["start"]["column"] - 1].decode()
        tail = lines[last - 1].encode()[r["end"]["column"] - 1 :].decode()
        edits.append((first, last, head + s["text"] + tail))
    edits.sort()
    for (_, l1, _), (f2, _, _) in zip(edits, edits[1:]):
        assert l1 < f2, "two suggestions on one line"
    for first, last, body in reversed(edits):
        lines[first - 1 : last] = body.split("\n")
    return "\n".join(lines).encode("utf-8")


def kept_lines_outside(
    data: bytes, converted: bytes, diagnostics: list[dict], path: str
) -> None:
    """Minimal hunks: a line the line diff keeps is in no suggestion's range (its newline may be,
    where a hunk at the end of the file starts at the end of the line before it)."""
    a = data.decode().splitlines(keepends=True)
    b = converted.decode().splitlines(keepends=True)
    spans = []
    for d in diagnostics:
        if d["location"]["path"] == path:
            for s in d.get("suggestions", []):
                spans.append(
                    (offset(data, s["range"]["start"]), offset(data, s["range"]["end"]))
                )
    starts = line_starts(data)
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(
        None, a, b, autojunk=False
    ).get_opcodes():
        if tag != "equal":
            continue
        for i in range(i1, i2):
            lo = starts[i]
            hi = lo + len(a[i].rstrip("\r\n").encode())
            for s, e in spans:
                assert not (s < hi and lo < e and hi > lo), (
                    f"kept line {i + 1} is inside a suggestion {s}-{e}"
                )


def check_document(doc: dict) -> None:
    VALIDATOR.validate(doc)
    if (
        OFFICIAL
    ):  # reviewdog's generated schema (draft-04, its references inside the file)
        schema = json.loads((Path(OFFICIAL) / "DiagnosticResult.json").read_text())
        jsonschema.Draft4Validator(schema).validate(doc)


def check_file(
    path: str, original: bytes, expected: bytes, findings: list[Finding]
) -> dict:
    result = FileResult(
        path, findings, [], original.decode("utf-8"), expected.decode("utf-8")
    )
    doc = rdjson.document([result], "convert")
    check_document(doc)
    diags = doc["diagnostics"]
    assert apply(original, diags, path) == expected
    assert apply_as_github(original, diags, path) == expected
    kept_lines_outside(original, expected, diags, path)
    hunks = [d for d in diags if d.get("suggestions")]
    if original == expected:
        assert not hunks
    else:
        assert hunks
    # every finding is a diagnostic: its own, or folded into the message of the change that makes it
    for f in findings:
        assert any(
            f"{f.code}: {f.message}" in d["message"]
            or (d["message"] == f.message and d.get("code", {}).get("value") == f.code)
            for d in diags
        ), f
    return doc


@pytest.mark.parametrize(
    "d",
    FIXTURES,
    ids=[p.name if p.parent.name != "rules" else f"rules-{p.name}" for p in FIXTURES],
)
def test_suggestions_rebuild_the_converted_file(d):
    original, expected = (d / "input.py").read_bytes(), (d / "expected.py").read_bytes()
    check_file(
        "input.py",
        original,
        expected,
        findings_of((d / "expected.txt").read_text()).get("input.py", []),
    )


@pytest.mark.parametrize("d", PROJECTS, ids=[p.name for p in PROJECTS])
def test_suggestions_rebuild_every_file_of_a_project(d):
    found = findings_of((d / "expected.txt").read_text())
    files = sorted(p.relative_to(d / "input") for p in (d / "input").rglob("*.py"))
    assert files
    for rel in files:
        expected = d / "expected" / rel
        if not expected.exists():
            continue  # outside the project: not converted
        check_file(
            str(rel),
            (d / "input" / rel).read_bytes(),
            expected.read_bytes(),
            found.get(str(rel), []),
        )


@pytest.mark.parametrize(
    "before, after",
    [
        ("", "a\n"),
        ("a\n", ""),
        ("a\nb\n", "a\nb\nc\n"),  # insertion at the end
        ("a\nb\nc\n", "a\nb\n"),  # deletion at the end
        ("a\nb\nc\n", "b\nc\n"),  # deletion at the start
        ("x\n", "y\n"),  # the only line
        ("a\nb", "a\nc"),  # no final newline
        ("a\nb", "a\nb\n"),  # a final newline added
        ("a\nb\n", "a\nb"),  # and removed
        ("a\r\nb\r\nc\r\n", "a\r\nB\r\nc\r\nd\r\n"),  # CRLF
        ("é = 1\nß = 2\n", "é = 1\n# 𐐀\nß = 3\n"),  # multi-byte characters
        ("a\n\nb\n\n", "a\n\nB\n\nc\n"),
    ],
)
def test_edge_cases(before, after):
    result = FileResult("f.py", [], [], before, after)
    doc = rdjson.document([result], "convert")
    VALIDATOR.validate(doc)
    assert apply(before.encode(), doc["diagnostics"], "f.py") == after.encode()
    # GitHub's suggestions are lines: one cannot take away the final newline
    if (
        before
        and after
        and "\r" not in before
        and not (before.endswith("\n") and not after.endswith("\n"))
    ):
        assert (
            apply_as_github(before.encode(), doc["diagnostics"], "f.py")
            == after.encode()
        )


def test_columns_are_utf8_bytes():
    line = "x = 'é𐐀'; y = 1\n"
    f = Finding(1, line.index("y") + 1, "DDP060", "a message")
    doc = rdjson.document([FileResult("f.py", [f], [], line, None)], "convert")
    (d,) = doc["diagnostics"]
    assert d["location"]["range"]["start"] == {
        "line": 1,
        "column": line.encode().index(b"y") + 1,
    }
    assert d["severity"] == "INFO" and d["code"] == {"value": "DDP060"}


# ----------------------------------------------------------------------------- through the CLI


def _cli_case(
    tmp_path, monkeypatch, fixture: Path, inputs: list[str]
) -> tuple[dict, int]:
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(
        convert_command,
        ["--check", "--output-format", "rdjson", *inputs],
        catch_exceptions=False,
    )
    return json.loads(res.stdout), res.exit_code


def test_cli_single_file(tmp_path, monkeypatch):
    d = ROOT / "fixtures" / "02_mnist_classic"
    shutil.copy(d / "input.py", tmp_path / "train.py")
    doc, code = _cli_case(tmp_path, monkeypatch, d, ["train.py"])
    assert code == 1  # --check: the file would change
    check_document(doc)
    assert (
        apply((d / "input.py").read_bytes(), doc["diagnostics"], "train.py")
        == (d / "expected.py").read_bytes()
    )
    assert (tmp_path / "train.py").read_bytes() == (
        d / "input.py"
    ).read_bytes()  # nothing written
    carried = [d for d in doc["diagnostics"] if d.get("suggestions") and "code" in d]
    assert any("DDP020:" in d["message"] for d in carried)


def test_cli_project(tmp_path, monkeypatch):
    d = next(
        p
        for p in PROJECTS
        if not (p / "options.json").exists()
        and (p / "expected").is_dir()
        and len(list((p / "expected").rglob("*.py"))) > 1
        and not (p / "entry.txt").exists()
    )
    shutil.copytree(d / "input", tmp_path / "proj")
    doc, _ = _cli_case(tmp_path, monkeypatch, d, [str(Path("proj") / "train.py")])
    check_document(doc)
    changed = 0
    for p in sorted((d / "expected").rglob("*.py")):
        rel = p.relative_to(d / "expected")
        before = (d / "input" / rel).read_bytes()
        assert (
            apply(before, doc["diagnostics"], str(Path("proj") / rel)) == p.read_bytes()
        ), rel
        changed += before != p.read_bytes()
    assert changed >= 1
