"""--optimize: opt-in only (without it nothing changes), each speed-up named by a finding, the
option's spellings, and `verify --optimize`, whose parity check fails on a changed training."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpify import Options, convert_source
from ddpify.cli import convert_command
from ddpify.options import OPTIMIZATIONS

ROOT = Path(__file__).resolve().parent.parent
OPT_FIXTURES = sorted(
    p
    for p in (ROOT / "fixtures").iterdir()
    if p.name.split("_")[0].isdigit() and 160 <= int(p.name.split("_")[0]) <= 179
)
CODES = {
    "channels-last": "DDP130",
    "fused-optimizer": "DDP131",
    "ddp-buckets": "DDP132",
    "static-graph": "DDP133",
    "cudnn-benchmark": "DDP134",
    "loader-workers": "DDP135",
}


@pytest.mark.parametrize("d", OPT_FIXTURES, ids=[p.name for p in OPT_FIXTURES])
def test_without_the_flag_the_output_has_none_of_it(d):
    src = (d / "input.py").read_text()
    plain = convert_source(src, Options(), path="input.py")
    assert not any(f.code in CODES.values() for f in plain.findings)
    for word in (
        "channels_last",
        "fused=",
        "gradient_as_bucket_view",
        "static_graph",
        "cudnn.benchmark",
        "persistent_workers",
    ):
        assert word not in plain.source or word in src


def test_each_speed_up_is_applied_by_one_fixture_and_refused_by_another():
    applied, refused = set(), set()
    for d in OPT_FIXTURES:
        for line in (d / "expected.txt").read_text().splitlines():
            for name, code in CODES.items():
                if f" {code} " in line:
                    (applied if "[*]" in line else refused).add(name)
    assert applied == set(OPTIMIZATIONS)
    assert refused == set(OPTIMIZATIONS)


@pytest.mark.parametrize("name", OPTIMIZATIONS)
def test_optimize_only_adds_that_one_speed_up(name):
    src = (ROOT / "fixtures/160_optimize_cnn_applied/input.py").read_text()
    res = convert_source(src, Options(optimize=(name,)), path="input.py")
    fixed = {f.code for f in res.findings if f.fixed and f.code in CODES.values()}
    assert fixed == {CODES[name]}


def test_model_class_read_from_the_module_beside_the_script(tmp_path):
    """The benchmark's CNN imports ResNet50 from benchmodels.py: it is read there."""
    for f in ("cnn_single.py", "benchmodels.py"):
        (tmp_path / f).write_text((ROOT / "bench/gpu" / f).read_text())
    src = (tmp_path / "cnn_single.py").read_text()
    res = convert_source(
        src, Options(optimize=("channels-last",)), path=str(tmp_path / "cnn_single.py")
    )
    line = "model = model.to(memory_format=torch.channels_last)"  # the script has it once, under --channels-last
    assert res.source.count(line) == src.count(line) + 1
    alone = convert_source(
        src,
        Options(optimize=("channels-last",)),
        path=str(tmp_path / "elsewhere" / "x.py"),
    )
    assert alone.source.count(line) == src.count(line)
    assert any(
        f.code == "DDP130" and "neither in this file" in f.message
        for f in alone.findings
    )


def test_cli_flags(tmp_path):
    script = tmp_path / "train.py"
    script.write_text((ROOT / "fixtures/160_optimize_cnn_applied/input.py").read_text())
    runner = CliRunner()
    res = runner.invoke(
        convert_command, ["--diff", "--optimize-only", "fused-optimizer", str(script)]
    )
    assert "fused=LOCAL_DEVICE.type" in res.output and "static_graph" not in res.output
    res = runner.invoke(convert_command, ["--diff", "--optimize", str(script)])
    assert "static_graph=True" in res.output
    res = runner.invoke(
        convert_command, ["--diff", "--optimize-only", "warp-speed", str(script)]
    )
    assert res.exit_code == 2 and "warp-speed" in res.output


# ---------------------------------------------------------------- verify --optimize (real runs, gloo)


def _verify(tmp_path, converter=None):
    pytest.importorskip("torch")
    from ddpify.verify import run_verify

    lines: list[str] = []
    outcome = run_verify(
        str(ROOT / "fixtures/167_optimize_mlp_module_level/input.py"),
        [],
        nproc=2,
        steps=6,
        backend="gloo",
        timeout=120.0,
        baseline=False,
        options=Options(optimize=True),
        compare_plain=True,
        echo=lines.append,
        **({"converter": converter} if converter else {}),
    )
    return outcome, {c.name: c for c in outcome.checks}


@pytest.mark.runs
def test_verify_optimize_passes_and_compares_with_the_plain_conversion(tmp_path):
    outcome, checks = _verify(tmp_path)
    assert outcome.exit_code == 0, [c.to_dict() for c in outcome.checks]
    assert checks["optimize-parity"].status == "PASS"
    assert checks["optimize-parity"].data["compared"] >= 12


@pytest.mark.runs
def test_verify_optimize_fails_when_the_optimised_training_differs(tmp_path):
    """An 'optimisation' that changes what is computed (here a 10x learning rate) must fail."""

    def converter(source, options, path="<stdin>"):
        res = convert_source(source, options, path=path)
        if options.optimize:
            res.source = res.source.replace("lr=0.05", "lr=0.5")
        return res

    outcome, checks = _verify(tmp_path, converter)
    assert checks["optimize-parity"].status == "FAIL", checks[
        "optimize-parity"
    ].to_dict()
    assert outcome.exit_code == 1


def test_channels_last_refused_for_a_view_in_a_function_that_runs_the_model():
    """A segmentation-style evaluation that views the 4-d output: it would raise on channels-last."""
    src = (ROOT / "fixtures/160_optimize_cnn_applied/input.py").read_text()
    helper = """

def pixel_scores(model, images):
    out = model(images)
    return out.view(out.size(0), -1)
"""
    src = src.replace("\n\ndef main():", helper + "\n\ndef main():")
    line = '        print(f"epoch {epoch} loss {loss.item():.4f}")'
    src = src.replace(line, "        pixel_scores(model, images)\n" + line)
    res = convert_source(src, Options(optimize=("channels-last",)), path="input.py")
    (finding,) = [f for f in res.findings if f.code == "DDP130"]
    assert not finding.fixed and ".view(...)" in finding.message
    assert "channels_last" not in res.source


def test_pyproject_optimize_key(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.ddpify]\noptimize = ["fused-optimizer"]\n'
    )
    script = tmp_path / "train.py"
    script.write_text((ROOT / "fixtures/160_optimize_cnn_applied/input.py").read_text())
    res = CliRunner().invoke(convert_command, ["--diff", str(script)])
    assert "fused=LOCAL_DEVICE.type" in res.output and "static_graph" not in res.output
    (tmp_path / "pyproject.toml").write_text('[tool.ddpify]\noptimize = "yes"\n')
    res = CliRunner().invoke(convert_command, ["--diff", str(script)])
    assert res.exit_code == 2 and "optimize must be" in res.output
