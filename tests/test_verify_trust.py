"""verify's verdict must agree with an independent judgement of the same conversion (issue 28):
each false FAIL seen on real code, and the false PASS, in the shape of the script that showed it.
Also verify on one GPU (ranks sharing it) as far as a CPU machine can show it, and what the
report says about a run stopped before the script's end.

Real runs are gloo on CPU with 2 processes under torchrun; the rest looks at the pieces.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from ddpify.verify import run_verify  # noqa: E402
from ddpify.verify.checks import FAIL, PASS, Check, Context, Sources  # noqa: E402
from ddpify.verify.runner import RunResult  # noqa: E402

CASES = Path(__file__).parent / "verify_cases"
TIMEOUT = 120.0


def _verify(script, args=(), **kw) -> tuple:
    lines: list[str] = []
    kw.setdefault("baseline", False)
    kw.setdefault("convert", False)
    outcome = run_verify(str(script), list(args), nproc=2, steps=kw.pop("steps", 6), backend="gloo", timeout=TIMEOUT,
                         echo=lines.append, **kw)  # fmt: skip
    return outcome, "\n".join(lines)


def _status(outcome) -> dict[str, str]:
    return {c.name: c.status for c in outcome.checks}


def _check(outcome, name) -> Check:
    return next(c for c in outcome.checks if c.name == name)


# ---------------------------------------------------------------------------- project mode


def test_project_on_pythonpath_runs_the_converted_copies(tmp_path, monkeypatch):
    """`PYTHONPATH=. python tools/train.py`: the library at the root is found through PYTHONPATH.
    The ranks must import verify's converted copies of it (sampler, rank-0 save), not the
    originals (which read the whole dataset and save on every rank)."""
    root = tmp_path / "repo"
    shutil.copytree(CASES / "projects" / "pythonpath", root)
    monkeypatch.chdir(root)
    monkeypatch.setenv("PYTHONPATH", str(root))
    outcome, text = _verify(
        root / "tools" / "train.py", ["--epochs", "2"], baseline=True, convert=True
    )
    assert outcome.exit_code == 0, text
    status = _status(outcome)
    assert (
        status["imports"] == PASS
        and status["data-sharding"] == PASS
        and status["rank0-writes"] == PASS
    ), text
    assert "converted to a temporary copy (the whole project)" in text
    assert "(6 local modules imported from it)" in _check(outcome, "imports").figure
    assert (
        root / "checkpoints" / "epoch_0.pt"
    ).exists()  # the candidate's rank 0 saved where the script says


def test_project_module_imported_inside_a_function_is_in_the_copy(
    tmp_path, monkeypatch
):
    """`from models.vgg import vgg_tiny` inside get_network(): no top-level import reaches
    models/, yet the converted project must find it (the whole tree is mirrored)."""
    root = tmp_path / "repo"
    shutil.copytree(CASES / "projects" / "lazy_import", root)
    monkeypatch.chdir(root)
    outcome, text = _verify(root / "train.py", convert=True)
    assert outcome.exit_code == 0, text
    assert _status(outcome)["imports"] == PASS, text


def test_editable_install_and_path_entries_point_at_the_copies(tmp_path, monkeypatch):
    """An editable install (setuptools' finder MAPPING, or a .pth path entry) names the user's
    project: the ranks must import the converted copy instead."""
    from ddpify.verify.probe import use_converted_copies

    original, copy = tmp_path / "proj", tmp_path / "copy"
    (original / "src" / "pkg").mkdir(parents=True)
    (copy / "src" / "pkg").mkdir(parents=True)
    finder = types.ModuleType("__editable___pkg_0_1_finder")
    finder.MAPPING = {"pkg": str(original / "src" / "pkg"), "other": "/usr/lib/other"}
    monkeypatch.setitem(sys.modules, finder.__name__, finder)
    monkeypatch.setattr(
        sys, "path", ["/usr/lib/python3", str(original / "src"), str(original)]
    )
    done = use_converted_copies(str(original), str(copy))
    assert sys.path == ["/usr/lib/python3", str(copy / "src"), str(copy)]
    assert finder.MAPPING == {
        "pkg": str(copy / "src" / "pkg"),
        "other": "/usr/lib/other",
    }
    assert len(done) == 3


def test_imports_of_the_originals_fail_and_name_the_modules(tmp_path):
    run = RunResult("candidate", 2, tmp_path)
    run.records = {r: {"status": "stopped", "imports": {"copies": 3, "originals": [f"{tmp_path}/proj/mylib/data.py"] if r == 1 else []}}
                   for r in range(2)}  # fmt: skip
    converted = {
        str(tmp_path / "copy" / "mylib" / "data.py"): (
            f"{tmp_path}/proj/mylib/data.py",
            "",
        )
    }
    ctx = Context(
        run,
        None,
        2,
        6,
        str(tmp_path / "copy" / "train.py"),
        sources=Sources(
            converted,
            {str(tmp_path / "copy"): str(tmp_path / "proj")},
            str(tmp_path / "proj"),
        ),
    )
    from ddpify.verify.checks.processes import check_imports

    check = check_imports(ctx)
    assert (
        check.status == FAIL
        and "rank 1 imported mylib/data.py from your project" in check.cause
    )
    # a module the conversion left as it is: the original is the same code
    ctx.sources.copies.clear()
    assert check_imports(ctx).figure == (
        "every converted module came from verify's copy (3 local modules imported from it); 1 unchanged module from "
        "your project itself (the same code)"
    )
    assert (
        check_imports(Context(run, None, 2, 6, "train.py")) is None
    )  # one file: no such check


# ---------------------------------------------------------------------------- the probe and unusual values


def test_probe_reads_any_value_without_raising():
    from torch.nn.utils.rnn import pack_padded_sequence

    from ddpify.verify.probe_values import batch_len, fingerprint, sums

    dense = torch.randn(4, 3)
    values = [
        dense.to_sparse(), dense.to_sparse_csr(), torch.randn(4, 3, dtype=torch.complex64), None, "train",
        [None, "a", {"x": (dense,)}], pack_padded_sequence(torch.randn(2, 3, 4), torch.tensor([3, 2]), batch_first=True),
        torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)]), {"k": object()}, b"bytes",
        torch.quantize_per_tensor(dense, 0.1, 0, torch.qint8), torch.empty(0, 3), torch.tensor(2.0),
    ]  # fmt: skip
    for v in values:
        fingerprint(v)
        batch_len(v)
        sums(v)
    assert fingerprint(dense.to_sparse())[0] == [4, 3]
    assert fingerprint([None, "a", {"x": (dense,)}]) == fingerprint(dense)
    assert fingerprint(None) is None and fingerprint("train") is None
    assert batch_len(dense.to_sparse()) == 4


def test_probe_hook_errors_are_recorded_not_raised(tmp_path, monkeypatch):
    from ddpify.verify import probe_state as S

    monkeypatch.setattr(S, "RUN_DIR", str(tmp_path))
    probe = S.Probe(str(tmp_path / "train.py"), str(tmp_path / "train.py"))
    assert probe.safe("batch", lambda: 1 / 0) is None
    assert probe.record["probe_errors"] == [
        "batch: ZeroDivisionError: division by zero"
    ]
    with pytest.raises(
        S.StopVerify
    ):  # the one exception a hook lets through: stopping at step K
        probe.safe("step", lambda: (_ for _ in ()).throw(S.StopVerify()))
    os.close(probe.hb_fd)


def test_sparse_packed_complex_and_none_forward_inputs_run_through_the_probe(tmp_path):
    """A model fed a dict holding a sparse matrix, a PackedSequence, a complex tensor, None and a
    string (the forward hook once crashed on the sparse input: every rank reported as crashed)."""
    outcome, text = _verify(CASES / "unusual_inputs.py")
    assert outcome.exit_code == 0, text
    assert not any(
        rec.get("probe_errors") for rec in outcome.document["candidate"]["ranks"]
    ), text


# ---------------------------------------------------------------------------- writes that are not the script's


def test_a_trackers_temporary_media_is_not_a_missing_output(tmp_path, monkeypatch):
    """A tracker writes logged images into a random folder of the system temp dir, a new one per
    process: not something the candidate must write again (and the final torch.save, never reached
    in one epoch, is not its explanation)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(CASES / "site-packages"))
    outcome, text = _verify(
        CASES / "tracker_media.py", ["--out", str(tmp_path)], baseline=True, epochs=1
    )
    assert outcome.exit_code == 0, text
    saved = _check(outcome, "saved")
    assert saved.figure.startswith(
        "the candidate wrote the 1 file the baseline wrote"
    ), text
    assert _status(outcome)["rank0-writes"] == PASS, text


def test_which_writes_are_outside_the_run():
    import tempfile

    from ddpify.verify.probe_values import outside_write

    tmp = os.path.realpath(tempfile.gettempdir())
    home = os.path.expanduser("~")
    assert outside_write(
        f"{tmp}/torchinductor_me/ab/cd.py", "torch._inductor.codecache", False
    )
    assert outside_write(f"{tmp}/x.bin", "triton.runtime.cache", False)
    assert outside_write(f"{home}/.cache/torch/kernels/k.bin", "numpy.lib.npyio", False)
    assert outside_write(f"{tmp}/tmpk3x_9qa1/media/img.png", "tracker_lib", False)
    # the script's own outputs: under /tmp too when the user put them there
    assert (
        outside_write(f"{tmp}/pytest-of-me/run/checkpoint.pt", "__main__", True) is None
    )
    assert outside_write(f"{tmp}/tmpk3x_9qa1/ckpt.pt", "__main__", True) is None
    assert outside_write(f"{tmp}/outputs/arr.npy", "numpy.lib.npyio", False) is None
    assert (
        outside_write(
            "/data/run/figures/loss.png", "matplotlib.backends.backend_agg", False
        )
        is None
    )
    # a library's write (np.memmap, h5py) into the working directory is the script's, also where
    # that directory is a temporary one (verify's own copies, a test's tmp_path)
    assert outside_write(f"{tmp}/tmpk3x_9qa1/cache.dat", "numpy._core.memmap", False)
    assert (
        outside_write(
            f"{tmp}/tmpk3x_9qa1/cache.dat",
            "numpy._core.memmap",
            False,
            (f"{tmp}/tmpk3x_9qa1",),
        )
        is None
    )


def test_a_missing_file_is_explained_only_by_its_own_call(tmp_path):
    """The baseline wrote a.csv at line 5; the candidate never wrote it, and never reached the
    torch.save at line 7 either: that save is no explanation for the csv."""
    script = tmp_path / "train.py"
    script.write_text("import torch\nrank = 0\nfor i in range(2):\n    if rank == 0:\n        open('a.csv', 'w')\n"
                      "if rank == 0:\n    torch.save({}, 'final.pt')\n")  # fmt: skip
    base = RunResult("baseline", 1, tmp_path)
    base.records = {
        0: {
            "status": "stopped",
            "writes": [
                {
                    "path": "/r/a.csv",
                    "rel": "a.csv",
                    "kind": "open('w')",
                    "where": f"{script}:5",
                }
            ],
        }
    }
    cand = RunResult("candidate", 2, tmp_path)
    cand.records = {r: {"status": "stopped", "writes": []} for r in range(2)}
    from ddpify.verify.checks.files import check_saved

    saved = check_saved(Context(cand, base, 2, 6, str(script)))
    assert saved.status == FAIL
    assert saved.cause.endswith(
        "its open('w') at train.py:5 never ran on any rank, under `if rank == 0:` (line 4), a condition that was never true"
    )
    assert "final.pt" not in saved.cause and "line 7" not in saved.cause
    # its own call ran (on rank 0, into another kind of file): nothing to say about why
    cand.records[0]["writes"] = [
        {
            "path": "/r/b.log",
            "rel": "b.log",
            "kind": "open('w')",
            "where": f"{script}:5",
        }
    ]
    saved = check_saved(Context(cand, base, 2, 6, str(script)))
    assert (
        saved.cause
        == "the one-process run wrote a.csv (open('w') at train.py:5), the candidate never did"
    )


# ---------------------------------------------------------------------------- the user's file and line


def test_lines_of_the_converted_copy_map_to_the_users_file():
    from ddpify import Options, convert_source
    from ddpify.verify.checks.source import line_map

    original = (CASES / "single.py").read_text()
    converted = convert_source(original, Options(), path="single.py").source
    mapping = line_map(original, converted)
    conv = converted.splitlines()
    save = next(i for i, line in enumerate(conv) if "torch.save(" in line)
    guard = save - 1
    assert conv[guard].strip() == "if RANK == 0:"
    assert mapping[save] == (
        original.splitlines().index(
            next(s for s in original.splitlines() if "torch.save(" in s)
        )
        + 1,
        False,
    )
    assert mapping[guard][1] is True  # the conversion's own line
    setup = next(i for i, line in enumerate(conv) if line.startswith("def ddp_setup"))
    assert mapping[setup][1] is True


def test_every_rank_printing_the_log_fails_and_cites_the_users_line(tmp_path):
    """The false PASS: a helper writes the loss with sys.stdout.write on every rank. verify must
    fail rank0-output and cite the helper's line in the user's file (helper_prints.py:16), not
    the line of its converted copy (21)."""

    def converter(source, options, path):
        from ddpify import Result

        return Result(
            source=(CASES / "helper_prints_ddp.py").read_text(),
            changed=True,
            status="converted",
        )

    outcome, text = _verify(
        CASES / "helper_prints.py", convert=True, converter=converter, plain_run=False
    )
    assert outcome.exit_code == 1, text
    assert [c.name for c in outcome.checks if c.status == FAIL] == ["rank0-output"], (
        text
    )
    check = _check(outcome, "rank0-output")
    assert check.figure.startswith(
        "rank 1 printed rank 0's log lines: `epoch 0 step 0 loss"
    ), check.figure
    assert check.cause.startswith(
        "the output at helper_prints.py:16 runs on every rank"
    ), check.cause


def test_output_sent_to_devnull_is_no_output(tmp_path):
    """ddpify's set-up sends fd 1 of ranks other than 0 to os.devnull: the helper's writes there
    reach no one, so rank0-output passes (the GPU corpus run's false FAILs: pix2pix, kuangliu)."""
    quiet = (
        (CASES / "helper_prints_ddp.py")
        .read_text()
        .replace(
            '    dist.init_process_group("gloo")\n',
            '    dist.init_process_group("gloo")\n    if dist.get_rank() != 0:\n'
            "        sys.stdout.flush()\n        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)\n",
            1,
        )
    )
    assert quiet != (CASES / "helper_prints_ddp.py").read_text()

    def converter(source, options, path):
        from ddpify import Result

        return Result(
            source="import os\nimport sys\n" + quiet, changed=True, status="converted"
        )

    outcome, text = _verify(
        CASES / "helper_prints.py", convert=True, converter=converter, plain_run=False
    )
    assert _check(outcome, "rank0-output").status == PASS, text


def test_rank0_output_compares_text_the_probe_could_not_trace(tmp_path):
    """Output written around the probe (a C extension, os.write): compared as text, numbers
    aside; warnings and tracebacks are no log."""
    run = RunResult("candidate", 2, tmp_path)
    run.records = {r: {"status": "stopped", "printed": []} for r in range(2)}
    (tmp_path / "rank0.out").write_text("epoch 0 loss 1.2031\nepoch 1 loss 0.9000\n")
    (tmp_path / "rank1.out").write_text(
        "/x/y.py:3: UserWarning: loss 3 is odd\n  warnings.warn('loss 3')\n"
    )
    from ddpify.verify.checks.output import check_rank0_output

    ctx = Context(run, None, 2, 6, "train.py")
    assert check_rank0_output(ctx).status == PASS
    (tmp_path / "rank1.out").write_text("epoch 0 loss 1.1985\n")
    check = check_rank0_output(ctx)
    assert check.status == FAIL and "`epoch 0 loss 1.1985`" in check.figure


# ---------------------------------------------------------------------------- torch and CUDA


def test_missing_torch_is_named(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "torch" else real(name, *a),
    )
    outcome, text = _verify(CASES / "single.py", convert=True)
    assert outcome.exit_code == 2
    assert f"torch is not installed in this Python ({sys.executable})" in text
    assert outcome.document["error_kind"] == "no-torch"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_an_original_that_needs_cuda_suggests_no_baseline(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outcome, text = _verify(CASES / "needs_cuda.py", baseline=True, convert=True)
    assert outcome.exit_code == 2, text
    assert "the script could not run as one process" in text
    assert (
        "the original needs a GPU (there is no GPU here): run with --no-baseline"
        in text
    )


# ---------------------------------------------------------------------------- what the run covered


def test_to_end_runs_the_whole_script_and_says_so(tmp_path):
    outcome, text = _verify(
        CASES / "control.py", ["--out", str(tmp_path), "--epochs", "2"], to_end=True
    )
    assert outcome.exit_code == 0, text
    assert "ran to the script's end at step 8" in _check(outcome, "ranks").figure
    assert _check(outcome, "reached").figure.startswith(
        "the script ran to its end; ran: 2 whole training epochs (4 batches each), torch.save at control.py:48 "
        "2 times"
    )
    assert (
        "PASS: the script ran to its end on every rank (8 steps); ran: 2 whole training epochs"
        in text
    )
    assert outcome.document["to_end"] is True and outcome.document["steps"] is None


def test_a_pass_for_k_steps_says_the_end_was_not_reached(tmp_path):
    from ddpify.verify.checks import verdict

    run = RunResult("candidate", 2, tmp_path)
    run.records = {r: {"status": "stopped", "steps": 20} for r in range(2)}
    assert verdict(Context(run, None, 2, 20, "t.py"), []) == (
        "PASS for 20 steps: the script's end was not reached; run with --epochs E or --to-end to cover the end of an "
        "epoch, the evaluation, the final save and the teardown"
    )
    assert (
        verdict(
            Context(run, None, 2, 20, "t.py", epochs=1), [Check("saved", FAIL, "x")]
        )
        == "FAIL: saved"
    )
    assert verdict(Context(run, None, 2, 20, "t.py", epochs=1), []).startswith(
        "PASS for 1 epoch (step 20): the script's end"
    )


def test_the_cli_takes_the_new_options():
    from click.testing import CliRunner

    from ddpify.verify import verify_command

    result = CliRunner().invoke(
        verify_command, [str(CASES / "control.py"), "--to-end", "--epochs", "1"]
    )
    assert (
        result.exit_code == 2
        and "--to-end runs the whole script: it cannot go with --epochs"
        in result.output
    )
    assert (
        "--share-gpus / --no-share-gpus"
        in CliRunner().invoke(verify_command, ["--help"]).output
    )


# ---------------------------------------------------------------------------- the baseline's files (issue 31)


def test_the_removal_note_counts_files_as_the_saved_row_does():
    from ddpify.verify.cli import _removal_note

    one = [{"path": "/r/a.pt"}, {"path": "/r/a.pt"}]
    assert (
        _removal_note(one, ["/r/a.pt"], [])
        == "  baseline: wrote 1 file; removed it, so the candidate starts from the same files"
    )
    assert (
        _removal_note(one, [], [])
        == "  baseline: wrote 1 file, it was there before it: nothing removed"
    )
    two = [{"path": "/r/a.pt"}, {"path": "/r/b.pt"}]
    assert _removal_note(two, ["/r/a.pt"], ["/r/c"]) == (
        "  baseline: wrote 2 files; removed 1 new file and 1 new folder (1 already there before it, kept), so the "
        "candidate starts from the same files"
    )


def test_the_json_document_has_a_schema_and_names_no_deleted_folder(tmp_path):
    out = tmp_path / "report.json"
    outcome, _ = _verify(CASES / "crash.py", json_path=str(out))
    doc = json.loads(out.read_text())
    assert doc["schema"] == 1 and doc["run_dir"] is None and outcome.exit_code == 2
    assert doc["ran"] == str(
        CASES / "crash.py"
    )  # the user's own file: it is still there


# ---------------------------------------------------------------------------- verify on one GPU


def test_fewer_gpus_than_processes_share_them(monkeypatch):
    from ddpify.verify import plan
    from ddpify.verify.prepare import CannotRun

    monkeypatch.setattr(plan, "visible_gpus", lambda: 1)
    p = plan.plan_processes(2, "auto")
    assert (p.nproc, p.backend, p.hide_gpus, p.shared) == (2, "gloo", False, 1)
    assert (
        "2 processes sharing 1 GPU (--share-gpus, the default with fewer GPUs than processes), gloo"
        == p.describe(1)
    )
    assert (
        plan.plan_processes(None, "auto").backend == "nccl"
    )  # one per GPU: NCCL as before
    with pytest.raises(CannotRun, match="Leave out --no-share-gpus"):
        plan.plan_processes(2, "auto", share=False)
    with pytest.raises(CannotRun, match="NCCL refuses two processes on one GPU"):
        plan.plan_processes(2, "nccl")
    assert plan.plan_processes(
        2, "gloo"
    ).hide_gpus  # --backend gloo: the CPU path, as before
    with pytest.raises(
        CannotRun, match="processes of different nodes cannot share a GPU"
    ):
        plan.plan_processes(1, "auto", nnodes=2)
    monkeypatch.setattr(plan, "visible_gpus", lambda: 0)
    with pytest.raises(CannotRun, match="--share-gpus needs a GPU"):
        plan.plan_processes(2, "auto", share=True)


def test_devices_and_throughput_when_ranks_share_a_gpu(tmp_path):
    from ddpify.verify.checks.processes import check_devices
    from ddpify.verify.checks.training import check_throughput

    run = RunResult("candidate", 2, tmp_path)
    run.records = {r: {"local_rank": r, "ddp": [{"devices": ["cuda:0"]}], "devices": {"params": ["cuda:0"]},
                       "marks": [[0.0, 0], [1.0, 40]], "samples": 40} for r in range(2)}  # fmt: skip
    shared = check_devices(Context(run, None, 2, 6, "t.py", shared_gpus=1))
    assert (
        shared.status == PASS
        and "(2 ranks sharing 1 GPU, --share-gpus)" in shared.figure
    )
    assert (
        check_devices(Context(run, None, 2, 6, "t.py")).status == FAIL
    )  # a GPU each: a collision
    run.records[1]["ddp"] = [{"devices": ["cuda:1"]}]
    run.records[1]["devices"] = {"params": ["cuda:1"]}
    assert (
        check_devices(Context(run, None, 2, 6, "t.py", shared_gpus=1)).status == FAIL
    )  # not LOCAL_RANK % 1
    tp = check_throughput(
        Context(run, None, 2, 6, "t.py", shared_gpus=1, min_scaling=0.9)
    )
    assert (
        tp.status == "INFO" and "these figures say nothing about scaling" in tp.figure
    )


def test_a_script_that_wants_a_gpu_per_process_is_told_why(tmp_path):
    from ddpify.verify.checks.processes import check_ranks

    run = RunResult("candidate", 2, tmp_path)
    run.records = {
        0: {
            "status": "stopped",
            "steps": 6,
            "init": {"backend": "nccl", "rank": 0, "world_size": 2},
        },
        1: {
            "status": "crashed",
            "steps": 0,
            "error": "RuntimeError: CUDA error: invalid device ordinal",
            "t_end": 1.0,
        },
    }
    check = check_ranks(Context(run, None, 2, 6, "t.py", shared_gpus=1))
    assert (
        check.status == FAIL
        and "the ranks share 1 GPU (--share-gpus): a script must then pick GPU LOCAL_RANK %"
        in check.cause
    )


class _FakeCuda:
    def __init__(self, count):
        self.count = count

    def is_available(self):
        return self.count > 0

    def device_count(self):
        return self.count

    def set_device(self, device):
        self.current = device


@pytest.mark.parametrize("gpus,local_world,device,backend", [
    (1, 2, ("cuda", 0), "gloo"),  # verify on one GPU: two ranks share cuda:0 over gloo
    (2, 2, ("cuda", 1), "cpu:gloo,cuda:nccl"),  # a GPU each: as before
    (0, 2, ("cpu",), "gloo"),
])  # fmt: skip
def test_the_generated_setup_shares_the_gpus_there_are(
    gpus, local_world, device, backend, monkeypatch
):
    """The set-up ddpify writes (the same file for a normal run and a verify run): LOCAL_DEVICE
    is LOCAL_RANK % GPUs, and gloo carries the CUDA tensors when more local ranks than GPUs run."""
    from ddpify.transforms import launch

    calls = []
    fake_torch = types.SimpleNamespace(device=lambda *a: a, cuda=_FakeCuda(gpus))
    fake_dist = types.SimpleNamespace(
        init_process_group=lambda backend, **kw: calls.append((backend, kw))
    )
    env = {
        "LOCAL_RANK": "1",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": str(local_world),
        "MASTER_ADDR": "x",
    }
    monkeypatch.setattr("atexit.register", lambda *a: None)
    text = (launch.RANKS + launch.SETUP).format(os="os", torch="torch", dist="dist")
    scope = {
        "os": types.SimpleNamespace(environ=env),
        "torch": fake_torch,
        "dist": fake_dist,
    }
    exec(text, scope)
    scope["ddp_setup"]()
    assert scope["LOCAL_DEVICE"] == device
    assert calls[0][0] == backend and (calls[0][1]["device_id"] is None) == (
        backend == "gloo"
    )
    from ddpify.formatting import fit_lines

    new = [
        line for line in fit_lines("", text, 88).splitlines() if "device_count" in line
    ]
    assert len(new) == 2 and all(len(line) <= 88 for line in new)
