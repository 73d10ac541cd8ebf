"""ddpify's command line: modes, exit codes, messages, config, parallelism, subcommand dispatch.

Mechanics tests swap the converter for a small fake (they test the CLI, not the conversion); the
end-to-end tests at the bottom run the real converter on the fixtures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from conftest import is_refused

import ddpify.pipeline as pipeline
from ddpify import cli
from ddpify.cli import convert_command
from ddpify.output import run_commands
from ddpify.findings import Finding
from ddpify.options import Options
from ddpify.pipeline import ConversionError, Result

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"

TRAIN = "import torch  # TRAIN\nmodel = torch.nn.Linear(2, 2)\n"
PLAIN = "import os\nprint(os.getcwd())\n"


class FakeConverter:
    """Adds one line to sources that contain "# TRAIN"; other markers trigger failures."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Options]] = []

    def __call__(
        self, source: str, options: Options | None = None, path: str = "<stdin>"
    ) -> Result:
        self.calls.append((path, options))
        if "RAISE_CONVERSION" in source:
            raise ConversionError("cannot convert this", 2, 5)
        if "CRASH" in source:
            raise RuntimeError("boom")
        if "BADOUT" in source:
            return Result(source + "def (:\n", True, "converted", [])
        if "# TRAIN" not in source:
            return Result(
                source,
                False,
                "not-training",
                [Finding(1, 1, "DDP099", "not a training script: nothing to convert")],
            )
        new = source.replace(
            "# TRAIN\n", "# TRAIN\nimport torch.distributed as dist\n", 1
        )
        findings = [
            Finding(3, 1, "DDP030", "model wrapped in DistributedDataParallel", True),
            Finding(1, 1, "DDP001", "process-group setup added", True),
            Finding(2, 5, "DDP026", "batch_size is per process", False),
        ]
        return Result(new, True, "converted", findings)


@pytest.fixture
def fake(monkeypatch, tmp_path):
    conv = FakeConverter()
    monkeypatch.setattr(pipeline, "convert_source", conv)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    return conv


def invoke(*args: str, input: bytes | str | None = None):
    return CliRunner().invoke(
        convert_command, list(args), input=input, catch_exceptions=False
    )


def write(path: str, text: str | bytes) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, str):
        text = text.encode()
    p.write_bytes(text)
    return p


# --------------------------------------------------------------------------- modes and exit codes


def test_no_paths_exits_0_quietly(fake):
    res = invoke()
    assert res.exit_code == 0
    assert res.stdout == "" and res.stderr == ""


def test_rewrites_in_place_with_findings_and_summary(fake):
    write("train.py", TRAIN)
    write("util.py", PLAIN)
    res = invoke("train.py", "util.py")
    assert res.exit_code == 0, res.output
    assert (
        Path("train.py").read_text()
        == "import torch  # TRAIN\nimport torch.distributed as dist\nmodel = torch.nn.Linear(2, 2)\n"
    )
    assert Path("util.py").read_text() == PLAIN
    lines = res.stderr.splitlines()
    # Findings sorted by line, in Finding.format's form; then the status and the summary.
    assert lines[:3] == [
        "train.py:1:1: DDP001 [*] process-group setup added",
        "train.py:2:5: DDP026 batch_size is per process",
        "train.py:3:1: DDP030 [*] model wrapped in DistributedDataParallel",
    ]
    assert "converted train.py" in lines
    assert "util.py:1:1: DDP099 not a training script: nothing to convert" in lines
    assert lines[-1] == "1 file converted, 1 file left unchanged."
    assert res.stdout == ""


def test_check_writes_nothing_and_exits_1(fake):
    write("train.py", TRAIN)
    res = invoke("--check", "train.py")
    assert res.exit_code == 1
    assert Path("train.py").read_text() == TRAIN
    assert "would convert train.py" in res.stderr
    assert res.stderr.splitlines()[-1] == "1 file would be converted."
    assert res.stdout == ""


def test_check_exits_0_when_nothing_would_change(fake):
    write("util.py", PLAIN)
    res = invoke("--check", "util.py")
    assert res.exit_code == 0
    assert res.stderr.splitlines()[-1] == "1 file would be left unchanged."


def test_diff_prints_unified_diff_and_writes_nothing(fake):
    write("train.py", TRAIN)
    write("util.py", PLAIN)
    res = invoke("--diff", "util.py", "train.py")
    assert res.exit_code == 0  # --diff alone is not a check
    assert Path("train.py").read_text() == TRAIN
    assert res.stdout == (
        "--- train.py\n+++ train.py\n@@ -1,2 +1,3 @@\n import torch  # TRAIN\n"
        "+import torch.distributed as dist\n model = torch.nn.Linear(2, 2)\n"
    )
    assert "\033[" not in res.stdout  # no color when stdout is not a terminal


def test_check_and_diff_combine(fake):
    write("train.py", TRAIN)
    res = invoke("--check", "--diff", "train.py")
    assert res.exit_code == 1
    assert "+import torch.distributed as dist" in res.stdout
    assert Path("train.py").read_text() == TRAIN


def test_diff_color_flags(fake):
    write("train.py", TRAIN)
    colored = invoke("--diff", "--color", "train.py").stdout
    assert "\033[32m+import torch.distributed as dist\033[0m" in colored
    assert "\033[1m--- train.py\033[0m" in colored
    plain = invoke("--diff", "--no-color", "train.py").stdout
    assert "\033[" not in plain and "+import torch.distributed as dist" in plain


def test_diff_marks_missing_final_newline(fake):
    write("train.py", TRAIN.rstrip("\n"))
    res = invoke("--diff", "train.py")
    assert res.stdout.endswith(
        " model = torch.nn.Linear(2, 2)\n\\ No newline at end of file\n"
    )


def test_one_bad_file_exits_2_and_the_others_are_converted(fake):
    write("a.py", "x = (\n")
    write("b.py", TRAIN)
    write("c.py", "import os  # RAISE_CONVERSION\n")
    res = invoke("a.py", "b.py", "c.py", "missing.py")
    assert res.exit_code == 2
    assert "import torch.distributed" in Path("b.py").read_text()
    assert Path("a.py").read_text() == "x = (\n"
    err = res.stderr
    assert "a.py:1:5: error: SyntaxError: '(' was never closed" in err
    assert "c.py:2:5: error: cannot convert this" in err
    assert "missing.py: error: no such file or directory" in err
    assert err.splitlines()[-1] == "1 file converted, 3 files failed to convert."


def test_errors_win_over_check(fake):
    write("a.py", "x = (\n")
    write("b.py", TRAIN)
    assert invoke("--check", "a.py", "b.py").exit_code == 2


def test_converter_crash_is_reported_and_file_untouched(fake):
    write("a.py", "import os  # CRASH\n")
    write("b.py", TRAIN)
    res = invoke("a.py", "b.py")
    assert res.exit_code == 2
    assert (
        "a.py: error: internal error (RuntimeError: boom); the file was left unchanged."
        in res.stderr
    )
    assert Path("a.py").read_text() == "import os  # CRASH\n"
    assert "import torch.distributed" in Path("b.py").read_text()


def test_output_that_does_not_compile_is_never_written(fake):
    write("a.py", "import os  # BADOUT\n")
    res = invoke("a.py")
    assert res.exit_code == 2
    assert "internal error: the converted code does not compile (line 2:" in res.stderr
    assert Path("a.py").read_text() == "import os  # BADOUT\n"


def test_quiet_keeps_errors_and_manual_findings_only(fake):
    write("train.py", TRAIN)
    write("bad.py", "x = (\n")
    res = invoke("-q", "train.py", "bad.py")
    assert res.exit_code == 2
    # notes (DDP026) and [*] changes need no hand fix: only the error is left
    assert res.stderr.splitlines() == [
        "bad.py:1:5: error: SyntaxError: '(' was never closed",
    ]


# --------------------------------------------------------------------------- stdin


def test_stdin_to_stdout(fake):
    res = invoke("-", input=TRAIN)
    assert res.exit_code == 0
    assert res.stdout == TRAIN.replace(
        "# TRAIN\n", "# TRAIN\nimport torch.distributed as dist\n"
    )
    assert "-:1:1: DDP001 [*] process-group setup added" in res.stderr


def test_stdin_filename_names_messages(fake):
    res = invoke("-", "--stdin-filename", "train.py", input=TRAIN)
    assert "train.py:1:1: DDP001 [*] process-group setup added" in res.stderr


def test_stdin_check_prints_nothing_on_stdout(fake):
    res = invoke("--check", "-", input=TRAIN)
    assert res.exit_code == 1 and res.stdout == ""


def test_stdin_error_echoes_the_input(fake):
    res = invoke("-", input="x = (\n")
    assert res.exit_code == 2
    assert res.stdout == "x = (\n"  # a pipeline `ddpify - < a > b` never loses the code
    assert "-:1:5: error: SyntaxError" in res.stderr


# --------------------------------------------------------------------------- files and directories


def test_directories_recurse_into_py_files_only(fake):
    write("proj/train.py", TRAIN)
    write("proj/pkg/util.py", PLAIN)
    write("proj/pkg/notes.txt", "not python")
    write("proj/pkg/nb.ipynb", "{}")
    write("proj/.hidden/train.py", TRAIN)
    write("proj/__pycache__/x.py", TRAIN)
    write("proj/myenv/pyvenv.cfg", "home = /usr\n")
    write("proj/myenv/lib/site.py", TRAIN)
    write("proj/venv/lib/x.py", TRAIN)
    write("proj/.dot.py", TRAIN)
    res = invoke("--check", "proj")
    assert sorted(p for p, _ in fake.calls) == [
        os.path.join("proj", "pkg", "util.py"),
        os.path.join("proj", "train.py"),
    ]
    assert res.exit_code == 1


def test_output_is_sorted_by_path(fake):
    for name in ("c.py", "a.py", "b.py"):
        write(name, TRAIN)
    res = invoke("c.py", "a.py", "b.py")
    statuses = [ln for ln in res.stderr.splitlines() if ln.startswith("converted ")]
    assert statuses == ["converted a.py", "converted b.py", "converted c.py"]


def test_file_given_twice_is_processed_once(fake):
    write("pkg/train.py", TRAIN)
    res = invoke("pkg/train.py", "./pkg/train.py", "pkg")
    assert res.exit_code == 0
    assert len(fake.calls) == 1
    assert Path("pkg/train.py").read_text().count("import torch.distributed") == 1


def test_directory_without_python_files_warns_and_exits_0(fake):
    Path("empty").mkdir()
    res = invoke("empty")
    assert res.exit_code == 0
    assert "empty: warning: no Python files found" in res.stderr


def test_explicit_file_without_py_suffix_is_converted(fake):
    write("train", TRAIN)
    assert invoke("train").exit_code == 0
    assert "import torch.distributed" in Path("train").read_text()


def test_notebook_is_refused(fake):
    write("nb.ipynb", '{"cells": []}')
    res = invoke("nb.ipynb")
    assert res.exit_code == 2
    assert "nb.ipynb: error: notebooks are not converted" in res.stderr
    assert Path("nb.ipynb").read_text() == '{"cells": []}'


def test_generated_file_is_left_alone(fake):
    src = "# @generated by protoc\n" + TRAIN
    write("gen.py", src)
    res = invoke("gen.py")
    assert res.exit_code == 0
    assert Path("gen.py").read_text() == src
    assert fake.calls == []
    assert "gen.py: note: marked @generated: left unchanged" in res.stderr


# --------------------------------------------------------------------------- options and config


def test_options_are_forwarded(fake):
    write("train.py", TRAIN)
    invoke(
        "--check",
        "--amp",
        "fp16",
        "--opt-level",
        "O2",
        "--sync-bn",
        "--shard-eval",
        "train.py",
    )
    assert fake.calls[-1][1] == Options(
        amp="fp16", sync_bn=True, shard_eval=True, opt_level="O2"
    )
    invoke("--check", "train.py")
    assert fake.calls[-1][1] == Options()


def test_bad_option_value_is_a_usage_error(fake):
    write("train.py", TRAIN)
    res = invoke("--amp", "fp8", "train.py")
    assert res.exit_code == 2 and "Invalid value for '--amp'" in res.stderr


def test_config_defaults_and_cli_override(fake):
    write(
        "pyproject.toml",
        '[tool.ddpify]\namp = "bf16"\nsync-bn = true\nexclude = ["legacy/", "**/gen_*.py"]\n',
    )
    write("src/train.py", TRAIN)
    write("src/gen_data.py", TRAIN)
    write("legacy/old.py", TRAIN)
    invoke("--check", ".")
    assert [p for p, _ in fake.calls] == [os.path.join("src", "train.py")]
    assert fake.calls[0][1] == Options(amp="bf16", sync_bn=True)
    fake.calls.clear()
    invoke("--check", "--no-sync-bn", "--amp", "none", "src/train.py")
    assert fake.calls[0][1] == Options(amp="none", sync_bn=False)


def test_nearest_config_wins_and_is_found_from_the_file(fake, tmp_path):
    write("pyproject.toml", '[tool.ddpify]\namp = "bf16"\n')
    write(
        "sub/pyproject.toml", '[project]\nname = "x"\n'
    )  # no [tool.ddpify]: keep walking up
    write("sub/deeper/pyproject.toml", '[tool.ddpify]\namp = "fp16"\n')
    write("sub/a.py", TRAIN)
    write("sub/deeper/b.py", TRAIN)
    os.chdir(tmp_path / "sub")
    invoke("--check", "a.py", "deeper/b.py")
    assert dict((p, o.amp) for p, o in fake.calls) == {
        "a.py": "bf16",
        os.path.join("deeper", "b.py"): "fp16",
    }


def test_explicit_files_ignore_exclude_unless_forced(fake):
    write("pyproject.toml", '[tool.ddpify]\nexclude = ["legacy"]\n')
    write("legacy/old.py", TRAIN)
    invoke("--check", "legacy/old.py")
    assert len(fake.calls) == 1
    fake.calls.clear()
    res = invoke("--check", "--force-exclude", "legacy/old.py")
    assert fake.calls == [] and res.exit_code == 0


def test_cli_exclude(fake):
    write("a/train.py", TRAIN)
    write("b/train.py", TRAIN)
    invoke("--check", "--exclude", "b", ".")
    assert [p for p, _ in fake.calls] == [os.path.join("a", "train.py")]


@pytest.mark.parametrize(
    "toml, message",
    [
        ('[tool.ddpify]\nampp = "bf16"\n', "unknown key 'ampp' in [tool.ddpify]"),
        (
            '[tool.ddpify]\namp = "fp8"\n',
            "[tool.ddpify] amp must be one of auto, bf16, fp16, none, apex, not 'fp8'",
        ),
        ("[tool.ddpify]\nsync-bn = 1\n", "[tool.ddpify] sync-bn must be true or false"),
        ("[tool.ddpify\n", "invalid TOML"),
    ],
)
def test_config_errors(fake, toml, message):
    write("pyproject.toml", toml)
    write("train.py", TRAIN)
    res = invoke("train.py")
    assert res.exit_code == 2
    assert f"pyproject.toml: error: {message}" in res.stderr
    assert Path("train.py").read_text() == TRAIN


def test_stdin_uses_config_from_cwd(fake):
    write("pyproject.toml", "[tool.ddpify]\nshard_eval = true\n")
    invoke("-", input=TRAIN)
    assert fake.calls[0][1] == Options(shard_eval=True)


# --------------------------------------------------------------------------- parallel runs


def test_jobs_output_is_deterministic_and_matches_serial(fake):
    # Only outcomes decided before the converter runs: worker processes may not see the fake.
    for i in range(6):
        write(f"bad{i}.py", f"x = {'(' * (i + 1)}\n")
        write(f"empty{i}.py", "")
        write(f"comments{i}.py", "# just a comment\n\n")
    serial = invoke("-j", "1", ".")
    parallel = invoke("-j", "3", ".")
    assert serial.exit_code == parallel.exit_code == 2
    assert serial.stderr == parallel.stderr
    assert (
        serial.stderr.splitlines()[-1]
        == "12 files left unchanged, 6 files failed to convert."
    )
    errors = [ln.split(":")[0] for ln in parallel.stderr.splitlines() if "error" in ln]
    assert errors == sorted(errors)


# --------------------------------------------------------------------------- entry point


@pytest.mark.runs
def test_main_dispatches_subcommands(monkeypatch, capsys):
    seen = {}

    @click.command()
    @click.argument("script")
    @click.option("--nproc", type=int)
    def fake_verify(script, nproc):
        seen["verify"] = (script, nproc)

    @click.command()
    @click.argument("script")
    @click.option("--nproc", type=int)
    def fake_launch(script, nproc):
        seen["launch"] = (script, nproc)

    monkeypatch.setitem(sys.modules, "ddpify.verify", types.ModuleType("ddpify.verify"))
    monkeypatch.setitem(
        sys.modules,
        "ddpify.verify.cli",
        types.SimpleNamespace(verify_command=fake_verify),
    )
    monkeypatch.setitem(
        sys.modules,
        "ddpify.launcher",
        types.SimpleNamespace(launch_command=fake_launch),
    )
    for name in ("verify", "launch"):
        with pytest.raises(SystemExit) as exc:
            cli.main([name, "train.py", "--nproc", "2"])
        assert exc.value.code == 0
        assert seen[name] == ("train.py", 2)


@pytest.mark.runs
def test_file_named_verify_is_converted_when_given_as_path(fake):
    write("verify", TRAIN)
    with pytest.raises(SystemExit) as exc:
        cli.main(["./verify"])
    assert exc.value.code == 0
    assert "import torch.distributed" in Path("verify").read_text()


@pytest.mark.runs
def test_python_dash_m_works(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-m", "ddpify", "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert res.returncode == 0
    assert "Usage: ddpify [OPTIONS] [PATHS]..." in res.stdout
    res = subprocess.run(
        [sys.executable, "-m", "ddpify", "missing.py"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert (
        res.returncode == 2
        and "missing.py: error: no such file or directory" in res.stderr
    )


# --------------------------------------------------------------------------- end to end (real converter)


def fixture_dirs() -> list[Path]:
    return sorted(
        p.parent
        for p in FIXTURES.glob("*/input.py")
        if (p.parent / "expected.py").exists()
    )


def option_flags(fixture: Path) -> list[str]:
    path = fixture / "options.json"
    if not path.exists():
        return []
    flags = []
    for key, value in json.loads(path.read_text()).items():
        name = key.replace("_", "-")
        if isinstance(value, list):
            flags += [x for v in value for x in (f"--{name}", v)]
        else:
            flags += (
                [f"--{name}" if value else f"--no-{name}"]
                if isinstance(value, bool)
                else [f"--{name}", str(value)]
            )
    return flags


def input_fixtures() -> list[Path]:
    return sorted(p.parent for p in FIXTURES.glob("*/input.py"))


def converted_fixture() -> Path:
    fixtures = input_fixtures()
    if not fixtures:
        pytest.fail("no fixtures/*/input.py")
    return fixtures[0]


def test_fixtures_exist():
    assert input_fixtures(), (
        "fixtures/*/input.py are needed by the end-to-end CLI tests"
    )


@pytest.mark.parametrize("fixture", fixture_dirs(), ids=lambda p: p.name)
def test_cli_converts_fixture_to_expected(fixture, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("train.py").write_bytes((fixture / "input.py").read_bytes())
    flags = option_flags(fixture)
    res = invoke(*flags, "train.py")
    refused = is_refused(fixture)
    assert res.exit_code == (2 if refused else 0), res.stderr
    assert Path("train.py").read_bytes() == (fixture / "expected.py").read_bytes()
    # Converting the output again changes nothing (and a refusal stays a refusal).
    again = invoke(*flags, "--check", "train.py")
    assert again.exit_code == (2 if refused else 0), again.stderr


def test_cli_end_to_end_check_diff_write(tmp_path, monkeypatch):
    fixture = converted_fixture()
    monkeypatch.chdir(tmp_path)
    original = (fixture / "input.py").read_bytes()
    Path("train.py").write_bytes(original)
    flags = option_flags(fixture)
    check = invoke(*flags, "--check", "--diff", "train.py")
    assert check.exit_code == 1
    assert check.stdout.startswith("--- train.py\n+++ train.py\n")
    assert "would convert train.py" in check.stderr
    assert Path("train.py").read_bytes() == original
    res = invoke(*flags, "train.py")
    assert res.exit_code == 0
    assert "converted train.py" in res.stderr
    assert res.stderr.splitlines()[-1] == "1 file converted."
    # A [*] finding in Finding.format's form was printed.
    assert any(
        ln.startswith("train.py:") and " [*] " in ln for ln in res.stderr.splitlines()
    )
    gpu_line, cpu_line = run_commands("train.py")
    assert f"  run it with: {gpu_line}" in res.stderr
    assert f"           or: {cpu_line}" in res.stderr
    assert "--nproc_per_node=gpu" in gpu_line and "--nproc_per_node=2" in cpu_line


def test_cli_end_to_end_parallel_matches_serial(tmp_path, monkeypatch):
    fixtures = input_fixtures()[:4]
    assert fixtures
    monkeypatch.chdir(tmp_path)
    for fixture in fixtures:
        write(f"{fixture.name}/train.py", (fixture / "input.py").read_bytes())
    write("broken.py", "x = (\n")
    serial = invoke("--check", "--diff", "-j", "1", ".")
    parallel = invoke("--check", "--diff", "-j", "2", ".")
    assert serial.exit_code == parallel.exit_code == 2
    assert serial.stdout == parallel.stdout
    assert serial.stderr == parallel.stderr


@pytest.mark.runs
def test_readme_example_is_what_ddpify_prints():
    """The README's before/after example and its findings are the converter's real output."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-m", "ddpify", "--diff", "--no-color", "examples/train.py"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    readme = (root / "README.md").read_text()
    assert proc.stdout in readme
    for line in proc.stderr.splitlines():
        if line.startswith("examples/train.py:"):
            assert line in readme, line
