"""The contract "a wrong script is worse than a refusal": blocking findings leave the file
untouched and exit 2; --partial, suppression comments, [tool.ddpify] ignore, --ignore, --check,
-q and --output-format json, all with the real converter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import FIXTURES, PROJECTS, is_refused

from ddpify import Options, convert_source, rules
from ddpify.cli import convert_command
from ddpify.directives import ignored_codes, skipped_lines
from ddpify.findings import BLOCKING, CODES, Finding

ROOT = Path(__file__).resolve().parent.parent
NO_LOADER = (
    ROOT / "fixtures/133_generator_batches_refused/input.py"
).read_text()  # DDP024
CONVERTS = (ROOT / "fixtures/01_toplevel_regression/input.py").read_text()


def invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(
        convert_command, list(args), input=input, catch_exceptions=False
    )


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_blocking_code_has_a_refused_fixture():
    seen = {}
    for d in FIXTURES + PROJECTS:  # project fixtures (project mode) too
        for line in (d / "expected.txt").read_text().splitlines():
            if "[blocking]" in line:
                seen.setdefault(line.split()[1], d)
    # the converter's codes only (lint's examples are lint findings); DDP098 blocks when a skip
    # comment drops the wrap or the sampler
    converter = {
        c for c in BLOCKING if rules.get(c).tool == "convert"
    }  # the gate's: tests/test_gate.py
    assert converter | {"DDP098"} <= set(seen), sorted(converter - set(seen))
    for d in seen.values():
        assert is_refused(d)


def test_severity_defaults_and_overrides():
    assert Finding(1, 1, "DDP034", "x").blocking
    assert not Finding(1, 1, "DDP026", "x").blocking
    assert not Finding(
        1, 1, "DDP034", "x", fixed=True
    ).blocking  # a change made is never blocking
    assert not Finding(1, 1, "DDP096", "x", severity="note").blocking
    assert Finding(1, 1, "DDP098", "x", severity="blocking").blocking
    assert set(BLOCKING) <= set(CODES)
    with pytest.raises(ValueError):
        Finding(1, 1, "DDP001", "x", severity="fatal")


def test_ignore_comment_parsing():
    marks = ignored_codes(
        "a = 1  # ddpify: ignore[DDP027, ddp034]\nb = 2\nc = 3  # ddpify: ignore\n"
    )
    assert marks == {1: frozenset({"DDP027", "DDP034"}), 3: None}


def test_refused_file_is_untouched_and_exit_2(here):
    Path("train.py").write_text(NO_LOADER)
    res = invoke("train.py")
    assert res.exit_code == 2
    assert Path("train.py").read_text() == NO_LOADER
    lines = res.stderr.splitlines()
    assert lines[0] == (
        "train.py:27:5: DDP024 [blocking] no training DataLoader found, and ddpify cannot follow where this step's "
        "batches come from (not random draws, slices or rows of pre-loaded tensors, a list of batches or the script's "
        "own batch iterator): it "
        "cannot give each rank its share; shard them by RANK/WORLD_SIZE by hand"
    )
    assert lines[1].startswith(
        "train.py: refused: 1 blocking finding above would make the output a wrong DDP program"
    )
    assert (
        "the file was left unchanged" in lines[1]
        and "# ddpify: ignore[CODE]" in lines[1]
    )
    assert lines[-1] == "1 file refused (blocking findings)."
    assert (
        "[*]" not in res.stderr
    )  # nothing was changed, so nothing is reported as changed


def test_partial_writes_and_still_exits_2(here):
    Path("train.py").write_text(NO_LOADER)
    res = invoke("--partial", "train.py")
    assert res.exit_code == 2
    out = Path("train.py").read_text()
    assert "ddp_in_place(model" in out and "init_process_group" in out
    assert "converted with --partial: 1 blocking finding above" in res.stderr
    assert (
        res.stderr.splitlines()[-1] == "1 file converted (1 partially, with --partial)."
    )


def test_check_fails_while_a_blocking_finding_remains(here):
    Path("train.py").write_text(NO_LOADER)
    res = invoke("--check", "train.py")
    assert res.exit_code == 2  # nothing would change, but the file still blocks
    assert res.stderr.splitlines()[-1] == "1 file would be refused (blocking findings)."


@pytest.mark.parametrize("how", ["comment", "config", "flag"])
def test_suppressed_blocking_finding_converts(here, how):
    src = NO_LOADER
    args = ["train.py"]
    if how == "comment":
        src = src.replace(
            "    loss.backward()\n", "    loss.backward()  # ddpify: ignore[DDP024]\n"
        )
    elif how == "config":
        Path("pyproject.toml").write_text('[tool.ddpify]\nignore = ["DDP024"]\n')
    else:
        args = ["--ignore", "DDP026,ddp024", "train.py"]
    Path("train.py").write_text(src)
    res = invoke(*args)
    assert res.exit_code == 0, res.stderr
    assert "ddp_in_place(model" in Path("train.py").read_text()
    assert "DDP024" not in res.stderr


def test_ignore_comment_on_another_line_does_not_suppress(here):
    Path("train.py").write_text(
        NO_LOADER.replace(
            "import torch\n", "import torch  # ddpify: ignore[DDP024]\n", 1
        )
    )
    assert invoke("train.py").exit_code == 2


def test_bad_ignore_in_config_is_an_error(here):
    Path("pyproject.toml").write_text('[tool.ddpify]\nignore = ["E501"]\n')
    Path("train.py").write_text(CONVERTS)
    res = invoke("--check", "train.py")
    assert res.exit_code == 2
    assert "ignore must be a list of codes" in res.stderr


def test_quiet_prints_only_blocking_and_errors(here):
    Path("a.py").write_text(NO_LOADER)
    Path("b.py").write_text(CONVERTS)
    res = invoke("-q", "a.py", "b.py")
    assert res.exit_code == 2
    lines = res.stderr.splitlines()
    assert (
        len(lines) == 2
        and lines[0].startswith("a.py:27:5: DDP024 [blocking]")
        and "refused" in lines[1]
    )
    assert (
        "ddp_in_place(" in Path("b.py").read_text()
    )  # the other file is still converted


def test_stdin_refused_echoes_input(here):
    res = invoke("-", "--stdin-filename", "train.py", input=NO_LOADER)
    assert res.exit_code == 2
    assert res.stdout == NO_LOADER
    assert "train.py:27:5: DDP024 [blocking]" in res.stderr
    assert "the input was echoed unchanged" in res.stderr


def test_json_output(here):
    Path("a.py").write_text(NO_LOADER)
    Path("b.py").write_text(CONVERTS)
    res = invoke("--output-format", "json", "--check", "a.py", "b.py")
    assert res.exit_code == 2
    doc = json.loads(res.stdout)
    files = {f["path"]: f for f in doc["files"]}
    assert files["a.py"]["outcome"] == "refused" and files["a.py"]["blocking"] is True
    assert files["a.py"]["findings"] == [
        {
            "line": 27,
            "col": 5,
            "code": "DDP024",
            "severity": "blocking",
            "fixed": False,
            "message": "no training DataLoader found, and ddpify cannot follow where this step's batches come from (not random draws, slices or rows of pre-loaded tensors, a list of batches or the script's own batch iterator): it cannot give each rank its share; shard them by RANK/WORLD_SIZE by hand",
        }
    ]
    assert files["b.py"]["outcome"] == "changed" and not files["b.py"]["blocking"]
    assert {f["severity"] for f in files["b.py"]["findings"]} == {"note"}
    assert doc["mode"] == "check"
    assert res.stderr == ""  # the JSON document is the whole report
    assert Path("b.py").read_text() == CONVERTS  # --check wrote nothing
    # --json is the same
    assert (
        json.loads(invoke("--json", "--check", "a.py", "b.py").stdout)["files"]
        == doc["files"]
    )


def test_json_with_stdin_write_is_a_usage_error(here):
    res = CliRunner().invoke(convert_command, ["--json", "-"], input=CONVERTS)
    assert res.exit_code == 2
    assert "--output-format json writes JSON to stdout" in res.output


def test_force_exclude_applies_to_stdin_filename(here):
    Path("pyproject.toml").write_text('[tool.ddpify]\nexclude = ["legacy/"]\n')
    res = invoke(
        "--force-exclude", "-", "--stdin-filename", "legacy/train.py", input=CONVERTS
    )
    assert res.exit_code == 0
    assert res.stdout == CONVERTS  # echoed unchanged, like black
    converted = invoke("-", "--stdin-filename", "legacy/train.py", input=CONVERTS)
    assert (
        converted.stdout != CONVERTS
    )  # without --force-exclude a named file is converted


def test_skip_on_the_optimizer_line_says_what_was_skipped():
    src = (ROOT / "fixtures/84_skip_on_model_line/input.py").read_text()
    assert "  # ddpify: skip" in src
    # the model line is left as written: the model is made distributed where its optimizer
    # takes its parameters
    assert convert_source(src, Options()).status == "converted"
    src = src.replace("  # ddpify: skip", "").replace(
        "momentum=0.9)\n", "momentum=0.9)  # ddpify: skip\n", 1
    )
    result = convert_source(src, Options())
    assert result.status == "refused"
    (f,) = [f for f in result.findings if f.blocking]
    assert f.code == "DDP098" and "`net` not made distributed" in f.message
    partial = convert_source(src, Options(partial=True))
    assert "ddp_in_place(net" not in partial.source
    assert "DistributedSampler(" in partial.source


def test_off_around_an_epoch_loop_names_the_skip_not_the_loop_shape():
    src = (ROOT / "fixtures/85_off_inside_epoch_loop/input.py").read_text()
    result = convert_source(src, Options())
    msgs = [f for f in result.findings if f.code in ("DDP027", "DDP098")]
    assert [f.code for f in msgs] == ["DDP098"]
    assert "set_epoch(epoch) at the top of this epoch loop" in msgs[0].message
    assert not msgs[
        0
    ].blocking  # the loader does not shuffle: the order is fixed anyway


def test_rules_page_code_table_matches_the_registry():
    page = (ROOT / "docs" / "rules.md").read_text()
    rows = dict(
        (line.split("|")[1].strip(), line.split("|")[2].strip())
        for line in page.splitlines()
        if line.startswith("| DDP")
    )
    assert rows == {
        c: r.title for c, r in __import__("ddpify.rules").rules.load_all().items()
    }


def test_directives_are_comments_not_text():
    src = (
        '"""Mentions # ddpify: off and # ddpify: ignore[DDP024] in a docstring."""\n'
        'x = "# ddpify: skip"\n'
        "y = 1  # ddpify: skip\n"
        "# ddpify: off\n"
        "z = 2\n"
        "# ddpify: on\n"
        "w = 3\n"
    )
    assert skipped_lines(src) == {3, 4, 5, 6}
    assert ignored_codes(src) == {}
    assert skipped_lines("a = 1\n# ddpify: off\nb = 2\n") == {2, 3, 4}  # off to the end


def test_a_module_that_trains_itself_names_the_class_and_the_manual_fix():
    # forward-forward: each layer owns an optimizer over self.parameters() and steps it itself
    src = """\
import torch
from torch import nn


class Layer(nn.Linear):
    def __init__(self, n_in, n_out):
        super().__init__(n_in, n_out)
        self.opt = torch.optim.Adam(self.parameters(), lr=0.03)

    def fit(self, x, steps=10):
        for _ in range(steps):
            loss = self.forward(x).pow(2).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()


layer = Layer(4, 4)
layer.fit(torch.randn(8, 4))
"""
    res = convert_source(src)
    assert res.status == "refused" and not res.changed
    (f,) = [
        f for f in res.findings if f.code == "DDP034"
    ]  # DDP024 too: no DataLoader here
    assert f.blocking
    assert (
        "class `Layer` builds its own optimizer" in f.message
        and "method `fit`" in f.message
    )
    assert "dist.all_reduce(p.grad)" in f.message
