"""Every blocking message must be true: for each blocking code, its example (a refused fixture)
shows that the stated cause holds. The partial conversion (what ddpify would write without the
refusal) is run as 2 gloo ranks under verify's probe, and the failure the message predicts is
seen: unsharded data, an epoch order that repeats, ranks out of sync, a rank that crashes on a
tracker that is None there, a file every rank writes, a module script that fails, episodes whose
length differs per rank."""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

import pytest
from conftest import ROOT, fixture_options, free_port

from ddpify import Options, convert_source

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.runs  # every test here runs scripts

FIX = ROOT / "fixtures"


def blocking(src: str, **opts) -> list:
    res = convert_source(src, Options(**opts))
    return res.blocking


def partial(d: Path, src: str | None = None) -> str:
    src = src if src is not None else (d / "input.py").read_text()
    return convert_source(
        src,
        Options(**{**fixture_options(d), "partial": True, "mark_unresolved": False}),
    ).source


def two_ranks(script: Path, cwd: Path, forkrun, args=()):
    """The script as 2 ranks under verify's probe, to its end: (the run, verify's checks by name)."""
    from ddpify.verify.checks import Context, run_checks
    from ddpify.verify.runner import PROBE, RunResult, _collect

    run_dir = cwd / f"verify-{uuid.uuid4().hex[:6]}"
    run_dir.mkdir()
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "DDPIFY_VERIFY_DIR": str(run_dir),
        "DDPIFY_VERIFY_STEPS": str(10**6),
        "DDPIFY_VERIFY_MAIN_FILE": str(script),
    }
    run = forkrun.run(
        Path(PROBE), [str(script), *args], cwd, nproc=2, env=env, timeout=240
    )
    assert not run.timed_out, run.stderr[-3000:]
    cand = RunResult(
        role="candidate", nproc=2, run_dir=run_dir, returncode=run.returncode
    )
    _collect(cand)
    checks = {
        c.name: c
        for c in run_checks(Context(cand, None, 2, 10**6, str(script), timeout=240))
    }
    return cand, checks


def codes(findings) -> list[str]:
    return [f.code for f in findings]


def test_ddp024_no_batch_source_it_can_follow_leaves_the_data_unsharded(
    tmp_path, forkrun
):
    d = FIX / "133_generator_batches_refused"
    assert codes(blocking((d / "input.py").read_text())) == ["DDP024"]
    (tmp_path / "train.py").write_text(partial(d))
    _, checks = two_ranks(tmp_path / "train.py", tmp_path, forkrun)
    assert checks["data-sharding"].status == "FAIL", checks[
        "data-sharding"
    ].figure  # every rank trained on the same batches


def test_ddp027_no_set_epoch_repeats_the_order_every_epoch(tmp_path, forkrun):
    d = FIX / "86_ignore_comment_accepts"
    src = (d / "input.py").read_text().replace("  # ddpify: ignore[DDP027]", "")
    found = blocking(src)
    assert codes(found) == ["DDP027"] and "built inside a call" in found[0].message
    (tmp_path / "train.py").write_text(partial(d, src))
    _, checks = two_ranks(tmp_path / "train.py", tmp_path, forkrun)
    assert checks["epoch-shuffle"].status == "FAIL", checks["epoch-shuffle"].figure


BARE_TENSORS = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(256, 4)
y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
w = torch.zeros(4, requires_grad=True)
b = torch.zeros(1, requires_grad=True)
opt = torch.optim.SGD([w, b], lr=0.05)
for epoch in range(2):
    for xb, yb in loader:
        loss = ((xb @ w + b - yb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
print("w", w.tolist())
"""


def test_ddp034_tensors_no_module_holds_train_out_of_sync(tmp_path, forkrun):
    found = blocking(BARE_TENSORS)
    assert codes(found) == ["DDP034"] and "no module holds" in found[0].message
    out = convert_source(BARE_TENSORS, Options(partial=True, mark_unresolved=False))
    (tmp_path / "train.py").write_text(out.source)
    _, checks = two_ranks(tmp_path / "train.py", tmp_path, forkrun)
    assert checks["params-in-sync"].status == "FAIL", checks["params-in-sync"].figure


def test_ddp063_a_tracker_none_on_other_ranks_crashes_them(tmp_path, forkrun):
    d = FIX / "289_tracker_read_in_callback_refused"
    found = blocking((d / "input.py").read_text())
    assert codes(found) == ["DDP063"] and "run.name" in found[0].message
    (tmp_path / "train.py").write_text(partial(d))
    cand, _ = two_ranks(tmp_path / "train.py", tmp_path, forkrun)
    assert cand.returncode != 0
    assert "'NoneType' object has no attribute 'name'" in cand.outputs.get(1, ""), (
        cand.outputs.get(1, "")[-2000:]
    )


def test_ddp064_every_rank_writes_the_file(tmp_path, forkrun):
    d = FIX / "97_memmap_cache_every_rank"
    found = blocking((d / "input.py").read_text())
    assert codes(found) == ["DDP064"] and "np.memmap" in found[0].message
    (tmp_path / "train.py").write_text(partial(d))
    _, checks = two_ranks(tmp_path / "train.py", tmp_path, forkrun)
    # np.memmap(mode="w+") opens the file for writing on each rank (the probe records every open)
    assert (
        checks["rank0-writes"].status == "FAIL"
        and "features_cache.dat" in checks["rank0-writes"].figure
    ), checks["rank0-writes"].figure


def test_ddp102_the_module_run_as_a_script_fails(tmp_path, forkrun):
    from ddpify.project import convert_project

    d = FIX / "rules" / "DDP102"
    shutil.copytree(d / "input", tmp_path / "p")
    res = convert_project(str(tmp_path / "p" / "train.py"))
    assert [f.code for f in res.blocking] == ["DDP102"]
    message = res.blocking[0].message
    assert "process group" in message and "DistributedSampler" in message
    done = convert_project(
        str(tmp_path / "p" / "train.py"), Options(partial=True, mark_unresolved=False)
    )
    for r in done.files:
        Path(r.path).write_text(r.output)
    run = forkrun.run(
        tmp_path / "p" / "loop.py", [], tmp_path / "p", timeout=120
    )  # as `python loop.py`
    # the sampler built at import asks for the world size before the block can set up a group
    assert run.returncode != 0 and "process group" in run.stderr, run.stderr[-2000:]


def test_ddp116_updates_gated_by_the_episode_differ_per_rank(tmp_path, forkrun):
    d = FIX / "297_updates_per_episode_refused"
    src = (d / "input.py").read_text()
    found = blocking(src)
    assert codes(found) == ["DDP116"] and "while not done" in found[0].message
    # the stated cause: with each rank's own draws (a seed per rank), the episodes, and so the
    # number of training steps, differ
    counts = []
    for rank in range(2):
        text = src.replace("random.seed(0)", f"random.seed({rank})").replace(
            "loss.backward()", "loss.backward()\n            STEPS.append(1)"
        )
        text = (
            text.replace("eps = 0.5", "STEPS = []\neps = 0.5")
            + "\nprint('steps', len(STEPS))\n"
        )
        (tmp_path / f"r{rank}.py").write_text(text)
        run = forkrun.run(tmp_path / f"r{rank}.py", [], tmp_path, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        counts.append(int(re.search(r"steps (\d+)", run.stdout).group(1)))
    assert counts[0] != counts[1], counts


def test_ddp116_rollouts_seeded_alike_are_the_same_on_every_rank(tmp_path, forkrun):
    d = FIX / "381_rollouts_seeded_alike_refused"
    found = blocking((d / "input.py").read_text())
    assert codes(found) == ["DDP116"] and "seeded alike on every process" in (
        found[0].message
    )
    (tmp_path / "train.py").write_text(partial(d))
    _, checks = two_ranks(tmp_path / "train.py", tmp_path, forkrun)
    # the model's training inputs are the same on both ranks at every step
    assert checks["data-sharding"].status == "FAIL", checks["data-sharding"].figure


@pytest.mark.parametrize(
    "name, code", [("rules/DDP022", "DDP022"), ("91_chained_streams", "DDP023")]
)
def test_ddp022_ddp023_a_loader_it_cannot_shard_feeds_every_rank_everything(
    name, code, tmp_path, forkrun
):
    d = FIX / name
    assert codes(blocking((d / "input.py").read_text())) == [code]
    (tmp_path / "train.py").write_text(partial(d))
    _, checks = two_ranks(tmp_path / "train.py", tmp_path, forkrun)
    assert checks["data-sharding"].status == "FAIL", checks["data-sharding"].figure


def _per_rank_value(out: dict, tag: str) -> list[str]:
    return [re.search(rf"{tag} (\S+)", out.get(r, "")).group(1) for r in range(2)]


def test_ddp146_a_draw_among_the_imports_differs_per_rank(tmp_path, forkrun):
    d = FIX / "194_draw_among_imports_refused"
    assert codes(blocking((d / "input.py").read_text())) == ["DDP146"]
    src = (
        partial(d)
        + '\nimport sys\nprint("PROJ", float(PROJECTION.sum()), file=sys.stderr)\n'
    )
    (tmp_path / "train.py").write_text(src)
    cand, _ = two_ranks(tmp_path / "train.py", tmp_path, forkrun)
    a, b = _per_rank_value(cand.outputs, "PROJ")
    assert a != b  # each rank drew its own projection


def test_ddp147_an_unseeded_generator_of_the_script_differs_per_rank(tmp_path, forkrun):
    d = FIX / "205_own_generator_under_flag"
    assert codes(blocking((d / "input.py").read_text())) == ["DDP147"]
    (tmp_path / "train.py").write_text(
        partial(d) + '\nimport sys\nprint("DATA", float(x.sum()), file=sys.stderr)\n'
    )
    cand, _ = two_ranks(tmp_path / "train.py", tmp_path, forkrun, args=["--fresh-data"])
    a, b = _per_rank_value(cand.outputs, "DATA")
    assert a != b  # each rank trained on data of its own


def test_ddp005_the_output_would_read_an_undefined_name(tmp_path, forkrun):
    d = FIX / "200_loader_rebuilt_per_call_refused"
    found = blocking((d / "input.py").read_text())
    assert codes(found) == ["DDP005"]
    name = re.search(r"would read (\w+)", found[0].message).group(1)
    (tmp_path / "train.py").write_text(partial(d))
    cand, _ = two_ranks(tmp_path / "train.py", tmp_path, forkrun)
    assert f"NameError: name '{name}' is not defined" in cand.outputs.get(0, ""), (
        cand.outputs.get(0, "")[-2000:]
    )
