"""The GPU benchmark's round logic (bench/gpu/run_gpu_bench.py), without GPUs or launches:
the launch order is a balanced Latin square, ratios are taken within a round, and the verdict
says when the rounds' spread is wider than the effect."""

import collections
import importlib.util
import json
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
            "--rounds",
            "1",
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


def test_defaults_time_enough_steps_over_enough_rounds(bench):
    args = bench.parse_args(["--gpus", "1"])
    assert args.steps >= 100 and args.warmup >= 1
    assert args.rounds >= 5 and args.min_rounds >= 5 and args.part == (1, 1)
    assert bench.need_rounds(args) == 5
    # the four variants the targets compare, at the default precision
    assert set(args.variants) == {"ddpify", "handwritten", "accelerate", "ddpify-opt"}
    assert args.precisions == ["default"]


@pytest.mark.parametrize(
    "visible, counts", [(0, [1]), (1, [1]), (2, [2]), (3, [1, 2]), (8, [1, 2, 4])]
)
def test_reports_on_the_gpus_lent(bench, visible, counts):
    assert bench.default_gpus(visible) == counts


def test_visible_gpus_follow_cuda_visible_devices(bench, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert bench.visible_gpus() == 2
    assert bench.parse_args([]).gpus == [2]


@pytest.mark.parametrize("rounds", [2, 5, 6, 7])
def test_parts_hold_every_round_once(bench, rounds):
    common = ["--gpus", "1", "--models", "gpt", "text", "--rounds", str(rounds)]
    whole = [(r.name, r.place) for r in bench.plan(bench.parse_args(common))]
    for n in range(1, rounds + 1):
        shares = [bench.part_rounds(rounds, k, n) for k in range(1, n + 1)]
        assert sum(shares, []) == list(range(rounds))
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
        # a part launches its rounds as the whole schedule would: same places, same order
        parts = [
            (r.name, r.place)
            for k in range(1, n + 1)
            for r in bench.plan(bench.parse_args(common + ["--part", f"{k}/{n}"]))
        ]
        assert parts == whole


@pytest.mark.parametrize("bad", ["0/2", "3/2", "2", "a/b", "1/6"])
def test_part_must_name_a_share_of_the_rounds(bench, bad):
    with pytest.raises(SystemExit):
        bench.parse_args(["--gpus", "1", "--rounds", "5", "--part", bad])


def _call(bench, out: Path, rounds, rate_ddpify=100.0, part="1/1"):
    """What one call leaves in its --out: rounds.csv and gpu_results.json."""
    args = bench.parse_args(
        ["--gpus", "1", "--models", "gpt", "--variants", "ddpify", "handwritten"]
        + ["--rounds", "5", "--part", part]
    )
    runs = []
    for k in rounds:
        for place, (v, rate) in enumerate(
            [("ddpify", rate_ddpify + k), ("handwritten", 100.0 + k)]
        ):
            r = bench.Run("gpt", v, "default", 1, round=k, place=place)
            r.status = "ok"
            r.figures = {
                "samples_per_s": rate,
                "chunk_rates": [rate - 1, rate + 1],
                "steps": 100,
                "seconds": 3.5,
            }
            r.phases = {ph: 1.0 for ph in bench.PHASES}
            runs.append(r)
    warm = bench.Run("gpt", "handwritten", "default", 1, place=-1, status="ok")
    warm.figures = {"samples_per_s": 50.0}
    out.mkdir()
    bench.save(args, out, runs, "machine\n", "now", 10.0, [], "", [warm])
    return runs


def test_rounds_csv_reads_back(bench, tmp_path):
    runs = _call(bench, tmp_path / "a", [1, 2])
    back, warm = bench.read_csv(tmp_path / "a" / "rounds.csv")
    assert [(r.name, r.place, r.rate) for r in back] == [
        (r.name, r.place, r.rate) for r in runs
    ]
    assert back[0].figures["chunk_rates"] == runs[0].figures["chunk_rates"]
    assert back[0].figures["steps"] == 100 and back[0].phases == runs[0].phases
    assert [w.rate for w in warm] == [
        50.0
    ]  # the warm-up launch stays out of the rounds


def test_merge_reports_a_ratio_once_five_rounds_ran(bench, tmp_path):
    _call(bench, tmp_path / "p1", [1, 2], 110.0, "1/3")
    _call(bench, tmp_path / "p2", [3, 4], 110.0, "2/3")
    # one part alone: two rounds, no ratio reported
    assert (
        "2 of 5 rounds: not reported"
        in (tmp_path / "p1" / "gpu_results.md").read_text()
    )
    assert (
        bench.main(
            [
                "merge",
                str(tmp_path / "p1"),
                str(tmp_path / "p2"),
                "--out",
                str(tmp_path / "four"),
            ]
        )
        == 0
    )
    four = json.loads((tmp_path / "four" / "gpu_results.json").read_text())
    (ratio,) = [x for x in four["ratios"] if x["ratio"] == "ddpify/handwritten"]
    assert ratio["rounds"] == 4 and ratio["reported"] is False
    assert (
        "4 of 5 rounds: not reported"
        in (tmp_path / "four" / "gpu_results.md").read_text()
    )

    _call(bench, tmp_path / "p3", [5], 110.0, "3/3")
    dirs = [str(tmp_path / p) for p in ("p1", "p2", "p3")]
    assert bench.main(["merge", *dirs, "--out", str(tmp_path / "all")]) == 0
    doc = json.loads((tmp_path / "all" / "gpu_results.json").read_text())
    (ratio,) = [x for x in doc["ratios"] if x["ratio"] == "ddpify/handwritten"]
    assert ratio["rounds"] == 5 and ratio["reported"] is True
    # the per-round ratios 111/101 ... 115/105
    assert ratio["min"] == pytest.approx(115 / 105)
    assert ratio["max"] == pytest.approx(111 / 101)
    md = (tmp_path / "all" / "gpu_results.md").read_text()
    assert "Merged from 3 calls" in md and "not reported" not in md
    assert f"{ratio['median']:.3f} [" in md
    merged, warm = bench.read_csv(tmp_path / "all" / "rounds.csv")
    assert sorted({r.round for r in merged}) == [1, 2, 3, 4, 5] and len(warm) == 3


def test_merge_refuses_a_round_run_twice(bench, tmp_path):
    _call(bench, tmp_path / "a", [1, 2])
    _call(bench, tmp_path / "b", [2, 3])
    with pytest.raises(ValueError, match="round 2"):
        bench.merge([tmp_path / "a", tmp_path / "b"])
