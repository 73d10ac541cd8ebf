import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted(p for p in (ROOT / "fixtures").iterdir() if (p / "input.py").exists() and (p / "expected.py").exists())


def fixture_options(d: Path) -> dict:
    f = d / "options.json"
    return json.loads(f.read_text()) if f.exists() else {}


def fixture_args(d: Path) -> list[str]:
    f = d / "args.txt"
    return f.read_text().split() if f.exists() else []


def needs_cuda(d: Path) -> bool:
    return (d / "input.py").read_text().startswith("# requires: cuda")


@pytest.fixture(params=FIXTURES, ids=[p.name for p in FIXTURES])
def fixture_dir(request) -> Path:
    return request.param
