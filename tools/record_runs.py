"""Write tests/runs_record.txt: the `name hash` of every fixture, after a run of every fixture's
runs has passed. The default run (CI's) then runs each fixture that changed since, and a fixed
share of the rest (tests/conftest.py: in_ci_share).

    DDPIFY_ALL_RUNS=1 python -m pytest -q -n auto --maxprocesses=4 -m runs && python tools/record_runs.py
    python tools/record_runs.py --except NAME ...   # leave out fixtures that failed that run
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import FIXTURES, PROJECTS, RUNS_RECORD, fixture_hash  # noqa: E402


def main(argv: list[str]) -> int:
    left_out = set(argv[argv.index("--except") + 1 :]) if "--except" in argv else set()
    dirs = {d.name: d for d in [*FIXTURES, *PROJECTS]}
    lines = [
        f"{name} {fixture_hash(d)}"
        for name, d in sorted(dirs.items())
        if name not in left_out
    ]
    RUNS_RECORD.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} fixtures recorded in {RUNS_RECORD.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
