"""bench/shapes: the generator of training scripts (converter tier: it runs nothing), the oracle's
own verdicts on planted conversions, and a small sample through the whole pipeline (runs)."""

from __future__ import annotations

import ast
import json
import random
import re
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ROOT / "bench" / "shapes"
sys.path.insert(0, str(SHAPES))

import grammar  # noqa: E402
from gen import Program, draw, generate  # noqa: E402
from shrink import _simplify  # noqa: E402

DRAWS = 150


@pytest.fixture(scope="module")
def programs() -> list[Program]:
    return [draw(11, i) for i in range(DRAWS)]


def test_every_variant_is_reachable(programs):
    seen = {(k, v) for p in programs for k, v in p.dims.items()}
    missing = [
        (k, v) for k, vs in grammar.DIMENSIONS.items() for v in vs if (k, v) not in seen
    ]
    assert not missing


def test_grammar_has_enough_dimensions():
    rich = [k for k, vs in grammar.DIMENSIONS.items() if len(vs) >= 4]
    assert len(rich) >= 12


def test_every_sample_is_legal_and_the_simplest_is_too(programs):
    assert all(grammar.legal(p.dims) for p in programs)
    assert grammar.legal(grammar.simplest())
    generate(grammar.simplest(), "n")


def test_generated_scripts_compile(programs):
    for p in programs:
        for rel, text in p.files.items():
            if rel.endswith(".py"):
                compile(text, rel, "exec")
        assert p.entry_file in p.files


def test_deterministic_per_seed():
    a, b = draw(5, 3), draw(5, 3)
    assert a.files == b.files and a.argv == b.argv and a.dims == b.dims
    assert draw(5, 4).files != a.files


def test_the_same_dimensions_get_other_names_with_another_name_seed():
    d = draw(5, 3).dims
    a, b = generate(d, "one"), generate(d, "two")
    assert a.dims == b.dims and a.files != b.files


def _defined_names(p: Program) -> set[str]:
    names = set()
    for rel, text in p.files.items():
        if rel.endswith(".py"):
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.add(node.id)
                elif isinstance(node, ast.arg):
                    names.add(node.arg)
        names |= {Path(rel).stem for rel in p.files}
    return names


def test_names_are_drawn_at_random(programs):
    # No script-defined name (variable, function, class, argument, module) is shared by most
    # scripts: a converter rule cannot key on one. Dunder methods and `self` are Python's.
    sets = [_defined_names(p) for p in programs[:60]]
    counts: dict[str, int] = {}
    for s in sets:
        for n in s:
            counts[n] = counts.get(n, 0) + 1
    common = sorted(
        n
        for n, c in counts.items()
        if c > len(sets) // 3
        and not re.fullmatch(r"__\w+__|self|forward|p|g|x|y|i|o", n)
    )
    assert not common, common


def test_shrink_steps_stay_legal(programs):
    rng = random.Random(0)
    for p in programs[:100]:
        dims = [k for k in grammar.DIMENSIONS if p.dims[k] != grammar.DIMENSIONS[k][0]]
        rng.shuffle(dims)
        for size in (1, 3, len(dims)):
            cand = _simplify(p.dims, dims[:size]) if dims else None
            assert cand is None or grammar.legal(cand)


def test_expected_steps_follow_the_loop():
    d = dict(grammar.simplest())
    assert grammar.expected_steps(d) == "halved"
    assert grammar.expected_steps(dict(d, data="iter_count")) == "equal"
    assert grammar.expected_steps(dict(d, data="full_batch")) == "equal"
    assert grammar.expected_steps(dict(d, step="early_stop")) == "any"


# -- the oracle on planted conversions (runs) --------------------------------------------------
ORIGINAL = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x = torch.randn(64, 6)
    y = x.sum(1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model = nn.Linear(6, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    torch.save(SAVED, "model.pt")
""")

# A hand-made conversion; each planted bug is one change to it.
CONVERTED = textwrap.dedent("""\
    import os
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    x = torch.randn(64, 6)
    y = x.sum(1, keepdim=True)
    ds = TensorDataset(x, y)
    sampler = DistributedSampler(ds, shuffle=True)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)      # SAMPLER
    model = nn.Linear(6, 1)
    net = DDP(model)                                            # WRAP
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = nn.functional.mse_loss(net(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    if rank == 0:                                               # GUARD
        torch.save(SAVED, "model.pt")
    dist.barrier()
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module", autouse=True)
def _launchers():
    yield
    from oracle import close_launchers

    close_launchers()


def _planted(
    tmp_path: Path,
    converted: str,
    saved: str = "model.state_dict()",
    saved_conv: str | None = None,
) -> dict:
    from oracle import run_program

    prog = Program(
        dims=dict(grammar.simplest()),
        name_seed="planted",
        files={"train.py": ORIGINAL.replace("SAVED", saved)},
        argv=["train.py"],
        entry_file="train.py",
        loop="epochs",
        steps="halved",
        seeded_data=True,
    )
    text = converted.replace("SAVED", saved_conv or saved)

    def plant(conv: Path, entry: str) -> dict:
        (conv / entry).write_text(text)
        return {
            "exit": 0,
            "codes": [],
            "blocking": [],
            "outcomes": {entry: "changed"},
            "errors": [],
        }

    return run_program(prog, tmp_path, verify=False, converter=plant)


@pytest.mark.runs
def test_oracle_passes_a_correct_conversion(tmp_path):
    res = _planted(tmp_path, CONVERTED)
    assert res["verdict"] == "correct", res.get("reason")


@pytest.mark.runs
def test_oracle_flags_unsynchronised_replicas(tmp_path):
    # a process group and a sampler, but no DDP: each rank trains its own model
    res = _planted(tmp_path, CONVERTED.replace("net = DDP(model)", "net = model"))
    assert res["verdict"] == "wrong" and "params" in res["failed"], res.get("reason")


@pytest.mark.runs
def test_oracle_flags_unsharded_data(tmp_path):
    conv = CONVERTED.replace(
        "loader = DataLoader(ds, batch_size=8, sampler=sampler)",
        "loader = DataLoader(ds, batch_size=8, shuffle=True)",
    )
    res = _planted(tmp_path, conv)
    assert res["verdict"] == "wrong" and {"batches", "steps"} <= set(res["failed"]), (
        res.get("reason")
    )


@pytest.mark.runs
def test_oracle_flags_two_writers(tmp_path):
    res = _planted(tmp_path, CONVERTED.replace("if rank == 0:", "if True:"))
    assert res["verdict"] == "wrong" and res["failed"] == ["writers"], res.get("reason")


@pytest.mark.runs
def test_oracle_flags_a_saved_wrapper(tmp_path):
    # the original pickles its model; the conversion pickles the DDP wrapper, which needs a
    # process group to load
    res = _planted(tmp_path, CONVERTED, saved="model", saved_conv="net")
    assert res["verdict"] == "wrong" and res["failed"] == ["load"], res.get("reason")
    assert (
        "DistributedDataParallel" in res["reason"] or "process group" in res["reason"]
    )


# -- a sample through the whole pipeline (runs) ------------------------------------------------
SAMPLE_SEED, SAMPLE_N = 2024, 6


@pytest.mark.runs
@pytest.mark.timeout(1500)
def test_sample_has_no_wrong_conversion(tmp_path):
    import importlib.util

    # a name of its own: tests/test_realworld_harness.py imports bench/realworld's run.py as `run`
    spec = importlib.util.spec_from_file_location("shapes_run", SHAPES / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)

    out = tmp_path / "sample.json"
    assert (
        run.main(
            [
                "--n",
                str(SAMPLE_N),
                "--seed",
                str(SAMPLE_SEED),
                "-j",
                "2",
                "--no-verify",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert doc["counts"]["invalid"] == 0, [
        c["reason"] for c in doc["cases"] if c["verdict"] == "invalid"
    ]
    wrong = [
        f"[{c['index']}] {c['verdict']}: {c['reason'][:200]}"
        for c in doc["cases"]
        if c["verdict"] in ("wrong", "crash")
    ]
    assert not wrong, "\n".join(wrong)
