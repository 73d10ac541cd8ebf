import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Whole-script fixtures, then each rule's minimal example (fixtures/rules/<CODE>/, ddpify/rules.py):
# both get the same checks (expected output and findings, fixed point, runs).
FIXTURES = sorted(
    p
    for p in (ROOT / "fixtures").iterdir()
    if (p / "input.py").exists() and (p / "expected.py").exists()
)
FIXTURES += sorted(
    p
    for p in (ROOT / "fixtures" / "rules").glob("DDP*")
    if (p / "input.py").exists() and (p / "expected.py").exists()
)


# Project fixtures (project mode): input/ holds the entry script (train.py, or the one entry.txt
# names) and its local modules; expected/ mirrors input/ with every file as converted;
# expected.txt lists the findings of all files, each with its path relative to input/.
PROJECTS = sorted(p for p in (ROOT / "fixtures").iterdir() if (p / "input").is_dir())
PROJECTS += sorted(
    p for p in (ROOT / "fixtures" / "rules").glob("DDP*") if (p / "input").is_dir()
)


def project_entries(d: Path) -> list[Path]:
    f = d / "entry.txt"
    return [
        d / "input" / n for n in (f.read_text().split() if f.exists() else ["train.py"])
    ]


def project_entry(d: Path) -> Path:
    return project_entries(d)[0]


def convert_fixture_project(d: Path, base: str = "input"):
    """(ProjectResult of the first entry, findings as expected.txt lines, every file's output)
    for the project(s) under d/base: entry.txt may name several entries (`ddpify DIR`)."""
    from ddpify import Options
    from ddpify.project import convert_projects

    top = (d / base).resolve()
    opts = Options(**fixture_options(d))
    results = convert_projects(
        [(str(top / e.relative_to(d / "input")), opts) for e in project_entries(d)]
    )
    lines: list[str] = []
    outputs: dict[str, str] = {}
    for result in results:
        for r in result.files:
            name = str(Path(r.path).relative_to(top))
            if name in outputs:
                continue  # a module shared by two entries: listed once
            outputs[name] = r.output
            lines += [f.format(name) for f in r.findings]
    return results[0], lines, outputs


def fixture_options(d: Path) -> dict:
    f = d / "options.json"
    return json.loads(f.read_text()) if f.exists() else {}


def fixture_args(d: Path) -> list[str]:
    f = d / "args.txt"
    return f.read_text().split() if f.exists() else []


def is_refused(d: Path) -> bool:
    """ddpify refuses the input (a blocking finding): the expected output is the input itself."""
    return "[blocking]" in (d / "expected.txt").read_text() and not fixture_options(
        d
    ).get("partial")


def needs_apex(path: Path) -> bool:
    """The script imports NVIDIA apex with no fallback (not inside a try that catches the
    ImportError): it runs only where apex is installed, which it is not here."""
    import ast

    tree = ast.parse(path.read_text())
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            h.type is None
            or "Error" in ast.unparse(h.type)
            or "Exception" in ast.unparse(h.type)
            for h in node.handlers
        ):
            guarded |= {id(n) for s in node.body for n in ast.walk(s)}
    for node in ast.walk(tree):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        if (
            any(n == "apex" or n.startswith("apex.") for n in names)
            and id(node) not in guarded
        ):
            return True
    return False


RUNS_RECORD = ROOT / "tests" / "runs_record.txt"


def fixture_hash(d: Path) -> str:
    """What a fixture's runs depend on: its sources and options (input, expected output,
    options, arguments), not a file a run may leave behind (a checkpoint)."""
    import hashlib

    text = (".py", ".txt", ".json", ".toml", ".cfg", ".ini", ".yaml", ".yml")
    h = hashlib.sha1()
    for p in sorted(x for x in d.rglob("*") if x.is_file() and x.suffix in text):
        h.update(str(p.relative_to(d)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _recorded() -> set[str]:
    if not RUNS_RECORD.exists():
        return set()
    return {ln.strip() for ln in RUNS_RECORD.read_text().splitlines() if ln.strip()}


RECORDED = _recorded()


def in_ci_share(d: Path, share: int) -> bool:
    """Whether the default run (CI's) runs this fixture's runs: every fixture that changed since
    the last run of all of them (tests/runs_record.txt holds the `name hash` of each that passed
    it), and one in `share` of the rest, chosen by name (a fixed choice, never a flaky one).
    `DDPIFY_ALL_RUNS=1` runs every one (docs/testing.md)."""
    return ci_share(d.name, fixture_hash(d), share)


def ci_share(key: str, digest: str, share: int) -> bool:
    import os
    import zlib

    if os.environ.get("DDPIFY_ALL_RUNS") == "1" or f"{key} {digest}" not in RECORDED:
        return True
    return zlib.crc32(key.encode()) % share == 0


NOT_IN_SHARE = "unchanged since the last run of every fixture, and not in CI's share (DDPIFY_ALL_RUNS=1 runs it)"


def needs_cuda(d: Path) -> bool:
    return (d / "input.py").read_text().startswith("# requires: cuda")


@pytest.fixture(
    params=FIXTURES,
    ids=[
        p.name if p.parent.name == "fixtures" else f"rules/{p.name}" for p in FIXTURES
    ],
)
def fixture_dir(request) -> Path:
    return request.param


def clean_env(**extra: str) -> dict[str, str]:
    """No launcher variables from the outer shell; one thread (tiny models, 2 shared cores)."""
    import os

    env = dict(
        os.environ,
        CUDA_VISIBLE_DEVICES="",
        PYTHONDONTWRITEBYTECODE="1",
        OMP_NUM_THREADS="1",
    )
    for var in (
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
    ):
        env.pop(var, None)
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def forkrun():
    """Scripts forked from one process that imported torch once (see tests/forkrun.py)."""
    pytest.importorskip("torch")
    from forkrun import ForkRunner

    runner = ForkRunner(clean_env())
    yield runner
    runner.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# the longest tests first, so that the parallel workers end together instead of one of them
# running the verify tests alone at the end
LONG_FIRST = (
    "test_verify.py", "test_verify_late.py", "test_shapes.py", "test_multinode.py",
    "test_projects.py", "test_optimize.py", "test_readme.py", "test_launch.py",
)  # fmt: skip


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda it: it.path.name not in LONG_FIRST)
