"""The lines a conversion writes keep the project's layout: within its line length, wrapped as
black and ruff wrap (ddpify/formatting.py), and checked with ruff itself over the fixtures."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from ddpify import Options, convert_source
from ddpify.formatting import fit_lines, line_length_for
from ddpify.transforms import launch

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"

# (what the conversion wrote, as black and ruff lay it out at 88 columns)
CASES = [
    # the arguments on one indented line where they fit there
    (
        'x = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=LOCAL_DEVICE.type == "cuda")\n',
        'x = torch.optim.SGD(\n    model.parameters(), lr=0.05, momentum=0.9, fused=LOCAL_DEVICE.type == "cuda"\n)\n',
    ),
    # else one a line, with a trailing comma
    (
        "loader = DataLoader(dataset, batch_size=BATCH_SIZE, sampler=DistributedSampler(dataset), num_workers=WORKERS)\n",
        "loader = DataLoader(\n    dataset,\n    batch_size=BATCH_SIZE,\n    sampler=DistributedSampler(dataset),\n"
        "    num_workers=WORKERS,\n)\n",
    ),
    # a value with operators in parentheses, split at them when it still does not fit
    (
        'LOCAL_DEVICE = torch.device("cuda", LOCAL_RANK) if torch.cuda.is_available() else torch.device("cpu")\n',
        'LOCAL_DEVICE = (\n    torch.device("cuda", LOCAL_RANK)\n    if torch.cuda.is_available()\n'
        '    else torch.device("cpu")\n)\n',
    ),
    # a tuple: parenthesised, one item a line (ruff; black would split the last call)
    (
        "def f():\n    for b in c:\n        inputs, ys = inputs.to(device, non_blocking=True), ys.to(device, non_blocking=True)\n",
        "def f():\n    for b in c:\n        inputs, ys = (\n            inputs.to(device, non_blocking=True),\n"
        "            ys.to(device, non_blocking=True),\n        )\n",
    ),
    # a block's header: split inside its call
    (
        "for x in y:\n    with torch.autocast(LOCAL_DEVICE.type, dtype=AMP_DTYPE, enabled=AMP_DTYPE is not None):\n        pass\n",
        "for x in y:\n    with torch.autocast(\n        LOCAL_DEVICE.type, dtype=AMP_DTYPE, enabled=AMP_DTYPE is not None\n"
        "    ):\n        pass\n",
    ),
    # one `with` item with an operator: in parentheses (ruff, Python >= 3.9)
    (
        "for i in y:\n    if i:\n        with contextlib.nullcontext() if (i + 1) % ACCUM_STEPS == 0 else model.no_sync():\n"
        "            pass\n",
        "for i in y:\n    if i:\n        with (\n            contextlib.nullcontext() if (i + 1) % ACCUM_STEPS == 0 else model.no_sync()\n"
        "        ):\n            pass\n",
    ),
    # a trailing comment follows the closing bracket
    (
        'SCALER = torch.amp.GradScaler("cuda", enabled=AMP_DTYPE == torch.float16)  # one scaler for every optimizer\n',
        'SCALER = torch.amp.GradScaler(\n    "cuda", enabled=AMP_DTYPE == torch.float16\n)  # one scaler for every optimizer\n',
    ),
    # a magic trailing comma keeps its pair exploded
    (
        'run(a, b)\nsave({"model": model.module.state_dict(), "opt": opt.state_dict(),}, "checkpoint-of-the-run.pt")\n',
        'run(a, b)\nsave(\n    {\n        "model": model.module.state_dict(),\n        "opt": opt.state_dict(),\n    },\n'
        '    "checkpoint-of-the-run.pt",\n)\n',
    ),
    # a string alone cannot be split: the call opens around it
    (
        'if RANK == 0:\n    print(f"epoch {epoch} train loss {train_loss:.4f} val loss {val_loss:.4f} val acc {acc:.3f}")\n',
        'if RANK == 0:\n    print(\n        f"epoch {epoch} train loss {train_loss:.4f} val loss {val_loss:.4f} val acc {acc:.3f}"\n    )\n',
    ),
    # a new comment line is wrapped at words
    (
        "# ddpify: each rank draws its own batches: its generators go on from a seed of its own (RANK added)\n",
        "# ddpify: each rank draws its own batches: its generators go on from a seed of its own\n# (RANK added)\n",
    ),
    # a top-level def the conversion adds is followed by two blank lines
    (
        "import os\n\n\ndef ddp_setup():\n    pass\n\nddp_setup()\n",
        "import os\n\n\ndef ddp_setup():\n    pass\n\n\nddp_setup()\n",
    ),
]


@pytest.mark.parametrize("after,want", CASES)
def test_written_lines_wrap_as_black_and_ruff_do(after: str, want: str):
    assert fit_lines("", after, 88) == want
    assert fit_lines("", want, 88) == want  # a fixed point
    if not want.lstrip().startswith("#"):  # ruff leaves comments as they are
        assert (
            _ruff_format(after) == want
        )  # what ruff writes, not what this test believes


def _ruff_format(text: str) -> str:
    proc = subprocess.run(
        [*_ruff(), "format", "--isolated", "-"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_lines_the_input_had_stay_as_they_are():
    long = "value = some_function(argument_one, argument_two, argument_three, argument_four_xyz)\n"
    long = long.replace("value", "value_of_the_longest_name")
    assert len(long) > 89
    assert fit_lines(long, long, 88) == long
    # in `# fmt: off` regions, black's and ruff's own rule
    off = "# fmt: off\n" + long.replace("value", "other") + "# fmt: on\n"
    assert fit_lines("", off, 88) == off
    # a statement with a comment inside, or a backslash, is left to the user
    inner = "x = f(  # why\n    aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa, bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb)\n"
    assert fit_lines("", inner, 88) == inner


def test_a_script_without_a_formatter_keeps_its_layout():
    """Hand-aligned arguments stay aligned; a too-long new line is still wrapped."""
    before = "loader = DataLoader(ds,\n                    batch_size=8,\n                    shuffle=True)\n"
    after = (
        "loader = DataLoader(ds,\n                    batch_size=8,\n                    sampler=DistributedSampler(ds),\n"
        "                    pin_memory=True)\n"
    )
    assert fit_lines(before, after, 88) == after
    longer = after.replace(
        "DistributedSampler(ds)",
        "DistributedSampler(ds, shuffle=cfg.get('shuffle', False), drop_last=False)",
    )
    assert fit_lines(before, longer, 88) != longer


def test_a_black_formatted_script_gets_an_edited_statement_joined_where_it_now_fits():
    before = 'print(\n    f"epoch {epoch} loss {loss.item():.4f} val acc {evaluate(model, loader, device):.3f}"\n)\n'
    after = 'print(\n    f"epoch {epoch} loss {loss.item():.4f} val acc {evaluate_result:.3f}"\n)\n'
    assert (
        fit_lines(before, after, 88)
        == 'print(f"epoch {epoch} loss {loss.item():.4f} val acc {evaluate_result:.3f}")\n'
    )


def test_tabbed_files_continue_with_tabs():
    after = "def f():\n\tloader = DataLoader(dataset, batch_size=BATCH_SIZE, sampler=DistributedSampler(dataset), pin_memory=True)\n"
    out = fit_lines("", after, 88)
    assert out.splitlines()[1:] == [
        "\tloader = DataLoader(",
        "\t\tdataset,",
        "\t\tbatch_size=BATCH_SIZE,",
        "\t\tsampler=DistributedSampler(dataset),",
        "\t\tpin_memory=True,",
        "\t)",
    ]


def test_the_set_up_block_fits_in_88_columns():
    """Every piece of the generated set-up (ranks, AMP, scaler, ddp_setup, the helpers), as written."""
    parts = [
        launch.RANKS,
        launch.RANKS_CPU,
        *launch.AMP.values(),
        launch.SCALER,
        launch.SETUP,
        launch.SETUP_CPU,
        launch.DECIDES,
        launch.SHARD,
        launch.SAMPLER_WRAPPER,
        launch.RANK_SHARE,
        launch.RANK_BATCHES,
        launch.RANK_ROWS,
        launch.IN_FLOAT32,
        launch.RANK0_SEED,
    ]
    text = "import os\n" + "".join(
        p.format(os="os", torch="torch", dist="dist") for p in parts
    )
    out = fit_lines("", text, 88)
    assert [ln for ln in out.splitlines() if len(ln) > 88] == []
    # and in a real conversion: the block runs from the ranks' comment to ddp_setup()
    res = convert_source((FIXTURES / "01_toplevel_regression" / "input.py").read_text())
    lines = res.source.splitlines()
    block = lines[
        lines.index(
            "# ddpify: torchrun sets these; a plain `python` run is rank 0 of 1."
        ) : lines.index("ddp_setup()")
    ]
    assert len(block) > 20 and max(map(len, block)) <= 88


def _pairs():
    """(input, expected output, line length) of every fixture file."""
    out = []
    for d in sorted(FIXTURES.iterdir()) + sorted((FIXTURES / "rules").glob("DDP*")):
        opts = (
            json.loads((d / "options.json").read_text())
            if (d / "options.json").exists()
            else {}
        )
        limit = opts.get("line_length", 88)
        if (d / "input.py").exists():
            out.append((d / "input.py", d / "expected.py", limit))
        for e in (
            sorted((d / "expected").rglob("*.py")) if (d / "expected").is_dir() else []
        ):
            out.append((d / "input" / e.relative_to(d / "expected"), e, limit))
    return [p for p in out if p[0].exists() and p[1].exists()]


def _without_strings(line: str) -> str:
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return ""  # part of a statement over several lines: its strings cannot be told apart here
    kinds = {
        tokenize.STRING,
        *(
            getattr(tokenize, n)
            for n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END")
            if hasattr(tokenize, n)
        ),
    }
    return line[: len(line) - len(line.lstrip())] + " ".join(
        t.string for t in toks if t.type not in kinds
    )


def test_new_lines_fit_unless_a_string_alone_is_too_long():
    """Over every fixture: a line the conversion wrote is within the line length, unless what
    makes it long is a string (black leaves those too) or it is in a `# fmt: off` region."""
    pairs = _pairs()
    assert len(pairs) > 150
    too_long = []
    for inp, exp, limit in pairs:
        known = set(inp.read_text().splitlines())
        off = False
        for line in exp.read_text().splitlines():
            off = {"# fmt: off": True, "# fmt: on": False}.get(line.strip(), off)
            if (
                len(line) > limit
                and line not in known
                and not off
                and len(_without_strings(line)) > limit
            ):
                too_long.append(f"{exp.relative_to(ROOT)}: {line}")
    assert too_long == []


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which(
        "ruff"
    )
    if exe is None:
        pytest.fail(
            "ruff is not installed: it is in the [test] extra (pip install -e '.[test]')"
        )
    return [exe]


def _unformatted(files: list[Path], limit: int) -> set[Path]:
    """The files `ruff format --check` would reformat (defaults but the line length)."""
    if not files:
        return set()
    proc = subprocess.run(
        [
            *_ruff(),
            "format",
            "--check",
            "--isolated",
            "--line-length",
            str(limit),
            "--output-format",
            "concise",
            *map(str, files),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return {f for f in files if str(f) in proc.stdout}


def test_fixture_outputs_stay_formatted_where_their_inputs_are():
    """For each fixture input that `ruff format --check` accepts, it accepts the output too."""
    pairs = [p for p in _pairs() if p[0].read_text() != p[1].read_text()]
    formatted = []
    for limit in sorted({p[2] for p in pairs}):
        group = [p for p in pairs if p[2] == limit]
        bad = _unformatted([p[0] for p in group], limit)
        formatted += [p for p in group if p[0] not in bad]
    assert (
        len(formatted) >= 12
    )  # the black-formatted fixtures (271, 273 among them) really are
    broken = []
    for limit in sorted({p[2] for p in formatted}):
        broken += sorted(
            map(str, _unformatted([p[1] for p in formatted if p[2] == limit], limit))
        )
    assert broken == []


@pytest.mark.runs
def test_every_fixture_formatted_by_ruff_converts_to_a_formatted_output(tmp_path: Path):
    """The fixture inputs, each formatted by ruff first: every conversion passes ruff's check."""
    sources = [d for d in sorted(FIXTURES.iterdir()) if (d / "input.py").exists()]
    for d in sources:
        shutil.copy(d / "input.py", tmp_path / f"{d.name}.py")
    subprocess.run(
        [*_ruff(), "format", "-q", "--isolated", str(tmp_path)], check=True, timeout=120
    )
    converted = []
    for d in sources:
        path = tmp_path / f"{d.name}.py"
        opts = (
            json.loads((d / "options.json").read_text())
            if (d / "options.json").exists()
            else {}
        )
        opts.pop("line_length", None)
        res = convert_source(path.read_text(), Options(**opts))
        if res.changed:
            path.write_text(res.source)
            converted.append(path)
    assert len(converted) > 100
    assert sorted(map(str, _unformatted(converted, 88))) == []


def test_the_project_line_length_is_read_like_ruff_and_black(tmp_path: Path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert line_length_for(str(tmp_path / "a" / "b" / "train.py")) == 88
    (tmp_path / "pyproject.toml").write_text("[tool.black]\nline-length = 79\n")
    (tmp_path / "a" / "pyproject.toml").write_text(
        "[project]\nname = 'x'\n"
    )  # sets none: the one above applies
    from ddpify import formatting

    formatting._length_in.cache_clear()
    assert line_length_for(str(tmp_path / "a" / "b" / "train.py")) == 79
    (tmp_path / "a" / "pyproject.toml").write_text(
        "[tool.ruff]\nline-length = 100\n[tool.black]\nline-length = 90\n"
    )
    formatting._length_in.cache_clear()
    assert (
        line_length_for(str(tmp_path / "a" / "b" / "train.py")) == 100
    )  # ruff's first, as ruff formats
    (tmp_path / "a" / "b" / "ruff.toml").write_text("line-length = 120\n")
    formatting._length_in.cache_clear()
    assert line_length_for(str(tmp_path / "a" / "b" / "train.py")) == 120


def test_the_cli_wraps_to_the_project_line_length(tmp_path: Path, monkeypatch):
    from click.testing import CliRunner

    from ddpify import formatting
    from ddpify.cli import convert_command

    monkeypatch.chdir(tmp_path)
    formatting._length_in.cache_clear()
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 120\n")
    (tmp_path / "train.py").write_text(
        (FIXTURES / "01_toplevel_regression" / "input.py").read_text()
    )
    res = CliRunner().invoke(convert_command, ["train.py"])
    assert res.exit_code == 0, res.output
    out = (tmp_path / "train.py").read_text()
    # 118 columns: one line at 120, five at 88
    assert (
        "AMP_DTYPE = (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16) if torch.cuda.is_available() else None\n"
        in out
    )
    assert max(map(len, out.splitlines())) <= 120
    formatting._length_in.cache_clear()


@pytest.mark.parametrize("limit", [30, 60])
def test_any_line_length_keeps_the_program_and_is_a_fixed_point(limit: int):
    """Every statement of real scripts, wrapped at a short length: the syntax tree is unchanged
    and wrapping again changes nothing."""
    import ast

    for path in sorted(FIXTURES.glob("*/input.py"))[::4]:
        src = path.read_text()
        out = fit_lines("", src, limit)
        assert ast.dump(ast.parse(out)) == ast.dump(ast.parse(src)), path
        assert fit_lines("", out, limit) == out, path
