"""What a converted fixture saves loads where the original's does: in a plain process, with no
process group. Each fixture whose input saves with torch.save runs twice, the original
(input.py, one process) and its conversion (2 gloo ranks, to the end); then one plain process
loads every file either run wrote and describes it (a module: its class and state-dict keys; a
dict: its keys and what each holds; a tensor: its dtype). A file of the conversion must load,
and describe the same as the original's: no `module.` prefix, no pickled
DistributedDataParallel (whose unpickling needs a process group), nothing missing."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import (
    FIXTURES,
    NOT_IN_SHARE,
    PROJECTS,
    fixture_args,
    fixture_options,
    free_port,
    in_ci_share,
    is_refused,
    needs_apex,
    needs_cuda,
    project_entry,
)

pytest.importorskip("torch")
pytestmark = pytest.mark.runs  # every test here runs scripts

# One plain process loads every file: classes defined in a script's __main__ are not importable
# there, so they load as stand-in modules (their state dicts are still compared); classes of a
# project's modules are the real ones (the run's folder is on sys.path).
LOADER = r"""
import json, os, pickle, sys, types
import torch

assert not torch.distributed.is_initialized()


class Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except (AttributeError, ImportError):
            return type(name, (torch.nn.Module,), {"__module__": module})


stub = types.ModuleType("pickle_with_stand_ins")
stub.Unpickler, stub.load, stub.__name__ = Unpickler, pickle.load, "pickle"


def describe(v, depth=0):
    if isinstance(v, torch.nn.Module):
        return {"module": type(v).__name__, "keys": sorted(v.state_dict())}
    if isinstance(v, torch.Tensor):
        return f"tensor {v.dtype}"
    if isinstance(v, torch.optim.Optimizer):
        return {"optimizer": type(v).__name__, "groups": len(v.param_groups)}
    if isinstance(v, dict):
        if depth > 5:
            return "dict"
        return {"dict": {str(k): describe(x, depth + 1) for k, x in v.items()}}
    if isinstance(v, (list, tuple)):  # lengths may differ (a history per step); what they hold may not
        return {type(v).__name__: sorted({json.dumps(describe(x, depth + 1), sort_keys=True) for x in v})}
    return type(v).__name__


out = {}
for root in sys.argv[1:]:
    sys.path.insert(0, root)
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if rel.endswith((".py", ".pyc")) or "__pycache__" in rel:
                continue
            try:
                files[rel] = describe(torch.load(path, map_location="cpu", weights_only=False, pickle_module=stub))
            except Exception as e:  # not a torch file, or one that does not load without a group
                files[rel] = {"error": type(e).__name__, "message": str(e).splitlines()[0][:200] if str(e) else ""}
    sys.path.remove(root)
    out[root] = files
print(json.dumps(out))
"""


def _saves(texts: list[str]) -> bool:
    return any("torch.save" in t for t in texts)


def _saves_objects(text: str) -> bool:
    """Something other than a bare `x.state_dict()` is saved (a dict, a model, an EMA copy, ...):
    where a wrapper or a `module.` prefix could slip in. Bare state dicts are read from the
    plain model by construction (tests/test_two_names.py), so a sample of them runs here."""
    calls = re.findall(r"torch\.save\(\s*([^,]+?),", text)
    return not all(
        re.fullmatch(r"[\w.\[\]\"']+\.state_dict\(\)", c.strip()) for c in calls
    )


# originals that import apex with no fallback do not run here (no apex): their conversions are
# run by tests/test_fixture_runs.py, and their saves by bench/gpu_session/apex_gpu.sh
_CANDIDATES = [
    d
    for d in FIXTURES
    if d.parent.name == "fixtures"
    and not is_refused(d)
    and not needs_cuda(d)
    and not needs_apex(d / "input.py")
    and fixture_options(d).get("amp") != "apex"
    and _saves([(d / "input.py").read_text()])
]
# every fixture that saves objects, and one in four of those that save bare state dicts (the suite's time)
# the identity fixtures (240-259: one model, two names) all run
SINGLE = [
    d
    for i, d in enumerate(_CANDIDATES)
    if _saves_objects((d / "input.py").read_text())
    or i % 4 == 0
    or d.name[:2] in ("24", "25")
]
PROJ = [
    d
    for d in PROJECTS
    if not is_refused(d)
    and not any(needs_apex(p) for p in (d / "input").rglob("*.py"))
    and _saves([p.read_text() for p in (d / "input").rglob("*.py")])
]


def _run_both(
    forkrun,
    tmp_path: Path,
    original: Path,
    converted: Path,
    script: str,
    args: list[str],
):
    """(what the original wrote, what the conversion wrote), each as the loader describes it."""
    runs = {}
    for role, src, nproc in (("original", original, 1), ("converted", converted, 2)):
        work = tmp_path / role
        shutil.copytree(
            src,
            work,
            ignore=shutil.ignore_patterns(
                "expected*", "__pycache__", "*.txt", "*.json"
            ),
        )
        env = (
            {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
            if nproc > 1
            else {}
        )
        run = forkrun.run(work / script, args, work, nproc=nproc, env=env)
        assert not run.timed_out and run.returncode == 0, (
            f"{role}: {run.stderr[-3000:]}"
        )
        runs[role] = work
    (tmp_path / "load.py").write_text(LOADER)
    load = forkrun.run(
        tmp_path / "load.py",
        [str(runs["original"]), str(runs["converted"])],
        tmp_path,
        timeout=120,
    )
    assert load.returncode == 0, load.stderr[-3000:]
    described = json.loads(load.stdout.strip().splitlines()[-1])
    return described[str(runs["original"])], described[str(runs["converted"])]


def _compare(before: dict, after: dict) -> None:
    saved = {
        k: v for k, v in before.items() if not (isinstance(v, dict) and "error" in v)
    }
    if not before and not after:
        pytest.skip(
            "no file saved with the fixture's arguments (a save behind a flag, into a buffer)"
        )
    assert saved, f"the original saved nothing torch.load reads: {sorted(before)}"
    for name, what in saved.items():
        assert name in after, (
            f"{name}: the original saved it, the conversion did not ({sorted(after)})"
        )
        assert after[name] == what, (
            f"{name}:\n original:  {json.dumps(what, sort_keys=True)[:1500]}\n converted: {json.dumps(after[name], sort_keys=True)[:1500]}"
        )
    for name, what in after.items():
        if name not in before:  # a file only the conversion wrote must still load
            assert not (
                isinstance(what, dict)
                and "error" in what
                and what["error"] != "UnpicklingError"
            ), f"{name}: {what}"


@pytest.mark.parametrize("fixture", SINGLE, ids=[d.name for d in SINGLE])
def test_saved_files_load_like_the_originals(fixture, tmp_path, forkrun):
    if not in_ci_share(fixture, 8):
        pytest.skip(NOT_IN_SHARE)
    src = tmp_path / "src"
    for role, name in (("original", "input.py"), ("converted", "expected.py")):
        (src / role).mkdir(parents=True)
        shutil.copy(fixture / name, src / role / "train.py")
    before, after = _run_both(
        forkrun,
        tmp_path,
        src / "original",
        src / "converted",
        "train.py",
        fixture_args(fixture),
    )
    _compare(before, after)


@pytest.mark.parametrize("project", PROJ, ids=[d.name for d in PROJ])
def test_saved_files_of_projects_load_like_the_originals(project, tmp_path, forkrun):
    if not in_ci_share(project, 2):
        pytest.skip(NOT_IN_SHARE)
    entry = str(project_entry(project).relative_to(project / "input"))
    if (
        project / "launch.txt"
    ).exists():  # how the project is started (a console script)
        entry = (project / "launch.txt").read_text().strip()
    before, after = _run_both(
        forkrun, tmp_path, project / "input", project / "expected", entry, []
    )
    _compare(before, after)


def test_the_set_covers_every_identity_family():
    names = {d.name for d in SINGLE + PROJ}
    for family in (
        "240_",
        "241_",
        "242_",
        "243_",
        "244_",
        "245_",
        "246_",
        "249_",
        "250_",
        "257_",
    ):
        assert any(n.startswith(family) for n in names), family
