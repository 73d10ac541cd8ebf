"""Fuzzing (issue 6): hypothesmith programs and mutated fixtures never crash ddpify, every output
compiles, and converting an output again changes nothing. bench/fuzz/run_fuzz.py runs the same
property on 10,000+ programs.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import hypothesmith
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "ddpify_fuzzlib", ROOT / "bench" / "fuzz" / "fuzzlib.py"
)
fuzzlib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzzlib)

FIXTURES = fuzzlib.fixture_sources()


def quiet(n: int) -> settings:
    return settings(
        max_examples=n,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )


@pytest.mark.runs
@quiet(150)
@given(hypothesmith.from_grammar())
def test_hypothesmith_programs(source):
    assume(fuzzlib.compiles(source))
    assert fuzzlib.check(source) in ("converted", "unchanged", "refused")


@pytest.mark.runs
@quiet(20)
@given(hypothesmith.from_node())
def test_hypothesmith_libcst_programs(source):
    assume(fuzzlib.compiles(source))
    fuzzlib.check(source)


def test_fixtures_are_there_to_mutate():
    assert FIXTURES, "fixtures/*/input.py are the seeds of the mutation fuzzing"


@pytest.mark.runs
@pytest.mark.skipif(
    not FIXTURES, reason="no fixtures (test_fixtures_are_there_to_mutate fails)"
)
@quiet(12)
@given(st.integers(0, 10**9))
def test_mutated_fixtures(seed):
    rng = random.Random(seed)
    source = fuzzlib.mutate(rng.choice(FIXTURES), rng)
    fuzzlib.check(source, fuzzlib.random_options(rng))


def test_mutations_really_mutate():
    # The fuzzer is only as good as its mutations: each kind must change a fixture and keep it valid.
    assert FIXTURES
    rng = random.Random(1)
    src = FIXTURES[0]
    for mutation in fuzzlib.MUTATIONS:
        out = mutation(src, rng)
        assert out is not None and out != src, mutation.__name__
        assert fuzzlib.compiles(out) or mutation is fuzzlib.rename, mutation.__name__


def test_property_catches_a_broken_converter(monkeypatch):
    # A converter whose output is not a fixed point must be reported.
    from ddpify.pipeline import Result

    def unstable(source, options=None, path="<stdin>"):
        return Result(source + "x = 1\n", True, "converted", [])

    monkeypatch.setattr(fuzzlib, "convert_source", unstable)
    with pytest.raises(fuzzlib.PropertyFailure, match="again"):
        fuzzlib.check("y = 2\n")
