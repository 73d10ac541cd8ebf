"""What the command line prints and which files it takes: findings coloured on a terminal
(NO_COLOR and FORCE_COLOR honoured), .gitignore respected when recursing, unknown directives
reported, and the script's own arguments left as they were."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_cli import fake, write  # noqa: F401  (fake: a pytest fixture)

from ddpify import Options, convert_source
from ddpify.cli import convert_command
from ddpify.output import color_message

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
ANSI = "\x1b["


def run(*args: str, env: dict | None = None):
    return CliRunner().invoke(
        convert_command, list(args), env=env or {}, catch_exceptions=False
    )


# --------------------------------------------------------------------------- colours


def test_findings_are_plain_off_a_terminal(fake):
    write("train.py", "import torch  # TRAIN\n")
    res = run("--check", "--diff", "train.py")
    assert (
        "DDP030 [*]" in res.stderr and ANSI not in res.stderr and ANSI not in res.stdout
    )


def test_force_color_colours_findings_and_diff(fake):
    write("train.py", "import torch  # TRAIN\n")
    res = run("--check", "--diff", "train.py", env={"FORCE_COLOR": "1"})
    assert (
        "\x1b[1mtrain.py:3:1:\x1b[0m \x1b[1;32mDDP030\x1b[0m\x1b[32m [*]\x1b[0m model wrapped"
        in res.stderr
    )
    assert (
        "\x1b[1mtrain.py:2:5:\x1b[0m \x1b[1;33mDDP026\x1b[0m batch_size" in res.stderr
    )  # a note: yellow
    assert "\x1b[32m+import torch.distributed as dist\x1b[0m" in res.stdout


def test_no_color_wins_over_force_color_and_the_flags_win_over_both(fake):
    write("train.py", "import torch  # TRAIN\n")
    both = run(
        "--check", "--diff", "train.py", env={"FORCE_COLOR": "1", "NO_COLOR": "1"}
    )
    assert ANSI not in both.stderr and ANSI not in both.stdout
    flag = run("--check", "--diff", "--color", "train.py", env={"NO_COLOR": "1"})
    assert ANSI in flag.stderr and ANSI in flag.stdout
    off = run("--check", "--diff", "--no-color", "train.py", env={"FORCE_COLOR": "1"})
    assert ANSI not in off.stderr and ANSI not in off.stdout
    empty = run("--check", "train.py", env={"FORCE_COLOR": ""})  # empty: unset
    assert ANSI not in empty.stderr


def test_colours_by_kind():
    assert "\x1b[1;31mDDP024\x1b[0m\x1b[31m [blocking]" in color_message(
        "blocking", "t.py:1:2: DDP024 [blocking] no loader"
    )
    assert "\x1b[1;33mDDP026" in color_message("finding", "t.py:1:2: DDP026 batch size")
    assert color_message("error", "t.py: error: cannot read").startswith(
        "\x1b[1mt.py\x1b[0m: \x1b[1;31merror\x1b[0m:"
    )
    assert color_message("note", "3 files converted.") == "3 files converted."


# --------------------------------------------------------------------------- .gitignore


def test_gitignored_paths_are_skipped_when_recursing(fake):
    write(".git/HEAD", "ref: refs/heads/main\n")
    write(
        ".gitignore",
        "# generated\nbuild_out/\n/scratch.py\n*_tmp.py\n!keep_tmp.py\nnested/**/skip.py\n",
    )
    for name in (
        "a.py",
        "build_out/b.py",
        "scratch.py",
        "sub/scratch.py",
        "x_tmp.py",
        "keep_tmp.py",
        "nested/deep/skip.py",
        "nested/ok.py",
        "sub/local.py",
        "sub/other.py",
    ):
        write(name, "import torch  # TRAIN\n")
    write("sub/.gitignore", "local.py\n")
    res = run("--check", ".")
    seen = sorted(
        line.split()[-1]
        for line in res.stderr.splitlines()
        if line.startswith("would convert ")
    )
    assert seen == [
        "a.py",
        "keep_tmp.py",
        "nested/ok.py",
        "sub/other.py",
        "sub/scratch.py",
    ]
    # a file named on the command line is converted whatever .gitignore says, like an exclude
    assert "would convert scratch.py" in run("--check", "scratch.py").stderr


def test_gitignore_outside_a_repository_is_read_at_the_project_root(fake):
    write("pyproject.toml", "[project]\nname = 'p'\n")
    write(".gitignore", "old/\n")
    write("old/train.py", "import torch  # TRAIN\n")
    write("new/train.py", "import torch  # TRAIN\n")
    res = run("--check", ".")
    assert (
        "would convert new/train.py" in res.stderr and "old/train.py" not in res.stderr
    )


# --------------------------------------------------------------------------- directives


def test_an_unknown_directive_is_reported_with_the_known_ones():
    src = (FIXTURES / "01_toplevel_regression" / "input.py").read_text()
    src = src.replace(
        "loader = DataLoader(", "loader = DataLoader(  # ddpify: skipp\n    ", 1
    )
    found = [f for f in convert_source(src).findings if f.code == "DDP009"]
    assert len(found) == 1 and found[0].line == 20 and not found[0].blocking
    assert (
        "`# ddpify: skipp`" in found[0].message
        and "skip, off, on, ignore and ignore[CODES]" in found[0].message
    )


def test_a_misspelt_ignore_is_reported_also_when_the_file_is_refused():
    src = "import torch\nmodel = torch.nn.Linear(2, 2)  # ddpify: ignroe[DDP034]\nloss = model(torch.ones(2)).sum()\nloss.backward()\n"
    res = convert_source(src)
    assert res.status == "refused"
    assert [f.code for f in res.findings if f.code == "DDP009"] == ["DDP009"]
    assert "DDP009" not in [
        f.code for f in convert_source(src, Options(ignore=("DDP009",))).findings
    ]


def test_known_directives_and_ddpifys_own_comments_are_not_reported():
    src = (FIXTURES / "86_ignore_comment_accepts" / "input.py").read_text()
    assert "# ddpify:" in src
    assert "DDP009" not in [f.code for f in convert_source(src).findings]
    for d in (
        "01_toplevel_regression",
        "100_trainer_class_module",
        "40_apex_classifier",
        "120_random_offsets_get_batch",
    ):
        out = next(
            (FIXTURES / d).glob("expected*/*.py"), FIXTURES / d / "expected.py"
        ).read_text()
        assert "# ddpify: " in out
        assert "DDP009" not in [f.code for f in convert_source(out).findings], d


# --------------------------------------------------------------------------- the script's arguments


def _arguments(src: str) -> list[str]:
    return [
        ast.unparse(n)
        for n in ast.walk(ast.parse(src))
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "add_argument"
    ]


@pytest.mark.parametrize(
    "name",
    [
        "02_mnist_classic",
        "11_onecycle_clip",
        "171_device_flag_cpu_default",
        "272_config_from_vars_args",
    ],
)
def test_a_fresh_conversion_adds_no_argument(name: str):
    """torchrun passes no --local-rank: the script's --help and vars(args) stay as they were."""
    src = (FIXTURES / name / "input.py").read_text()
    out = (FIXTURES / name / "expected.py").read_text()
    assert _arguments(src) and _arguments(out) == _arguments(src)
    assert "--local-rank" not in out and "--local_rank" not in out


def test_a_legacy_script_keeps_its_flag_read_from_local_rank():
    out = (FIXTURES / "40_apex_classifier" / "expected.py").read_text()
    assert (
        '"--local-rank",\n        "--local_rank",' in out
        and 'os.environ.get("LOCAL_RANK", 0)' in out
    )
