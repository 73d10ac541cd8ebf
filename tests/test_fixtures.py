"""Every fixture pair: input -> expected output and findings; the output is a fixed point;
lines the conversion had no reason to touch are byte-identical. Project fixtures (a folder of
files: fixtures/1NN_*/input/ and expected/) are tested by tests/test_projects.py."""

from __future__ import annotations

import difflib
import functools

from conftest import fixture_options

from ddpify import Options, convert_source


def convert(d):
    return _convert((d / "input.py").read_text(), Options(**fixture_options(d)))


@functools.lru_cache(maxsize=None)
def _convert(source: str, options: Options):
    """Three tests read each fixture's conversion: the converter is deterministic, so it runs once
    per input text and options (a changed input.py is converted again). Tests only read the result."""
    return convert_source(source, options, path="input.py")


def test_expected_output(fixture_dir):
    result = convert(fixture_dir)
    expected = (fixture_dir / "expected.py").read_text()
    assert result.source == expected, "".join(
        difflib.unified_diff(
            expected.splitlines(True),
            result.source.splitlines(True),
            "expected.py",
            "converted",
        )
    )


def test_expected_findings(fixture_dir):
    result = convert(fixture_dir)
    got = [f.format("input.py") for f in result.findings]
    assert got == (fixture_dir / "expected.txt").read_text().splitlines()


def test_output_is_fixed_point(fixture_dir):
    expected = (fixture_dir / "expected.py").read_text()
    again = convert_source(
        expected, Options(**fixture_options(fixture_dir)), path="expected.py"
    )
    assert not again.changed
    assert again.source == expected
    if (fixture_dir / "input.py").read_text() != expected:
        assert again.status == "already-distributed"


def test_untouched_lines_survive(fixture_dir):
    """Every input line is either kept byte-for-byte (possibly re-indented under a new
    guard/with block) or is part of a change the findings account for."""
    if (fixture_dir / "expected_apex.py").exists():
        return  # legacy-apex modernisation rewrites whole recipes: tests/test_apex.py checks those
    src = (fixture_dir / "input.py").read_text().splitlines()
    out = (fixture_dir / "expected.py").read_text().splitlines()
    out_stripped = {line.strip() for line in out}
    changed_lines = {f.line for f in convert(fixture_dir).findings if f.fixed}
    sm = difflib.SequenceMatcher(a=src, b=out, autojunk=False)
    lost = []
    for tag, i1, i2, _j1, _j2 in sm.get_opcodes():
        if tag in ("replace", "delete"):
            for i in range(i1, i2):
                if src[i].strip() in out_stripped:
                    continue  # moved under a new block: same text, new indent
                lost.append(i + 1)
    # a rewritten line must be near a fixed finding (multi-line statements span a few lines)
    unexplained = [n for n in lost if not any(abs(n - c) <= 12 for c in changed_lines)]
    assert not unexplained, f"lines changed without a finding: {unexplained}"


def test_comments_survive(fixture_dir):
    src = (fixture_dir / "input.py").read_text()
    out = (fixture_dir / "expected.py").read_text()
    for line in src.splitlines():
        if line.strip().startswith("#"):
            assert line.strip() in out, f"comment lost: {line.strip()}"


def test_every_sharded_training_loader_gets_set_epoch_or_a_finding(fixture_dir):
    """A DistributedSampler without set_epoch repeats the same order every epoch: ddpify adds
    set_epoch, or says plainly that it could not (DDP027) or was told not to (DDP098, or an
    ignore comment). Never neither."""
    findings = (fixture_dir / "expected.txt").read_text()
    if "DDP020" in findings:
        said = ("DDP021", "DDP027", "DDP098")
        assert (
            any(c in findings for c in said)
            or "ignore[DDP027]" in (fixture_dir / "input.py").read_text()
        ), findings
