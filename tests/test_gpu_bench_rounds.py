"""The GPU benchmark's round logic (bench/gpu/run_gpu_bench.py), without GPUs or launches:
the launch order is a balanced Latin square, ratios are taken within a round, and the verdict
says when the rounds' spread is wider than the effect."""

import collections
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "run_gpu_bench", ROOT / "bench" / "gpu" / "run_gpu_bench.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["run_gpu_bench"] = mod  # dataclasses look the module up by name
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("run_gpu_bench", None)


@pytest.mark.parametrize("k", [2, 3, 4, 5, 6])
def test_latin_rows_balance_place_and_predecessor(bench, k):
    period = k if k % 2 == 0 else 2 * k
    rows = [bench.latin_row(k, r) for r in range(period)]
    assert all(sorted(row) == list(range(k)) for row in rows)
    places = collections.Counter((x, i) for row in rows for i, x in enumerate(row))
    pairs = collections.Counter((a, b) for row in rows for a, b in zip(row, row[1:]))
    # every variant in every place, and after every other variant, equally often
    assert set(places.values()) == {period // k} and len(places) == k * k
    assert set(pairs.values()) == {period // k} and len(pairs) == k * (k - 1)


def test_plan_rotates_order_between_rounds(bench):
    args = bench.parse_args(
        [
            "--rounds",
            "4",
            "--gpus",
            "2",
            "--precisions",
            "default",
            "--models",
            "gpt",
            "text",
            "--variants",
            "handwritten",
            "ddpify",
            "accelerate",
            "ddpify-opt",
        ]
    )
    runs = bench.plan(args)
    assert len(runs) == 4 * 2 * 4
    firsts = [
        next(r.variant for r in runs if r.round == k and r.model == "gpt")
        for k in range(1, 5)
    ]
    lasts = [
        [r.variant for r in runs if r.round == k and r.model == "gpt"][-1]
        for k in range(1, 5)
    ]
    assert sorted(firsts) == sorted(args.variants) and sorted(lasts) == sorted(
        args.variants
    )
    # the models take turns going first
    assert [next(r.model for r in runs if r.round == k) for k in range(1, 5)] == [
        "gpt",
        "text",
        "gpt",
        "text",
    ]


def test_single_pass_keeps_the_listed_order(bench):
    args = bench.parse_args(
        [
            "--gpus",
            "1",
            "--precisions",
            "default",
            "--models",
            "cnn",
            "--variants",
            "ddpify",
            "handwritten",
        ]
    )
    assert [(r.variant, r.round) for r in bench.plan(args)] == [
        ("ddpify", 0),
        ("handwritten", 0),
    ]


def _run(bench, variant, rnd, rate):
    r = bench.Run("gpt", variant, "default", 2, round=rnd)
    r.status, r.figures = "ok", {"samples_per_s": rate}
    return r


def test_ratios_are_taken_within_each_round(bench):
    # the machine speeds up from round to round: per-round ratios stay put, pooled rates would not
    runs = [_run(bench, "ddpify", k, 100.0 * k) for k in (1, 2, 3)] + [
        _run(bench, "handwritten", k, 101.0 * k) for k in (1, 2, 3)
    ]
    res = bench.Results(runs)
    med, lo, hi, n = res.ratio_stats("gpt", "ddpify", "handwritten", "default", 2)
    assert n == 3 and lo == hi == med == pytest.approx(100 / 101)
    assert bench.reading((med, lo, hi, n)).startswith("below 1 in every round")


def test_a_failed_round_drops_out_of_the_ratio(bench):
    runs = [
        _run(bench, "ddpify", 1, 100.0),
        _run(bench, "handwritten", 1, 100.0),
        _run(bench, "ddpify", 2, 90.0),
        bench.Run("gpt", "handwritten", "default", 2, round=2, status="failed"),
    ]
    assert bench.Results(runs).per_round(
        "gpt", "ddpify", "handwritten", "default", 2
    ) == {1: 1.0}


@pytest.mark.parametrize(
    "values, verdict",
    [
        (
            [0.97, 1.02, 1.08],
            "spread wider than the effect",
        ),  # median 1.02, half-spread 0.055
        ([1.04, 1.05, 1.06], "above 1 in every round"),
        ([0.99, 1.05, 1.06], "above 1 ("),  # beyond the half-spread, not in every round
        ([0.90, 0.95, 0.99], "below 1 in every round"),
    ],
)
def test_reading_compares_effect_with_half_spread(bench, values, verdict):
    assert bench.reading(bench.stats(values)).startswith(verdict)


def test_one_round_has_no_spread_to_judge(bench):
    assert bench.reading(bench.stats([1.01])) == "one round: no spread"


def test_phases_split_a_launch(bench):
    f = {
        "t_import": 103.0,
        "t_timer": 106.0,
        "t_step1": 107.5,
        "t_timed": 108.0,
        "t_end": 110.0,
    }
    assert bench.phases(f, 100.0, 111.0) == {
        "start": 3.0,
        "set-up": 3.0,
        "first step": 1.5,
        "warm-up": 0.5,
        "timed": 2.0,
        "exit": 1.0,
    }
    assert (
        bench.phases({"t_import": 1.0}, 0.5, 2.0) == {}
    )  # an older BENCH line without the marks


def test_warm_up_launch_is_on_for_gpus_and_off_for_the_cpu_smoke(bench):
    assert bench.parse_args([]).warm_up_launch is True
    assert bench.parse_args(["--smoke"]).warm_up_launch is False
    assert bench.parse_args(["--no-warm-up-launch"]).warm_up_launch is False
