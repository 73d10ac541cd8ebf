"""Write fixtures/*/expected.py and expected.txt (and expected_apex.* where a fixture has them)
from the current converter.

Run it after a deliberate change, then read the diff of every expected file before
committing: the expected files are reviewed snapshots, not generated truth.
    python tools/regen_fixtures.py [NAME_SUBSTRING]
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from ddpify import Options, convert_source

ROOT = Path(__file__).resolve().parent.parent


def options_for(d: Path) -> Options:
    f = d / "options.json"
    return Options(**json.loads(f.read_text())) if f.exists() else Options()


def regen_project(d: Path) -> None:
    """A project fixture: expected/ mirrors input/ with each file as converted."""
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import convert_fixture_project

    result, lines, outputs = convert_fixture_project(d)
    shutil.rmtree(
        d / "expected", ignore_errors=True
    )  # files outside the project: copied as they are
    shutil.copytree(
        d / "input", d / "expected", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name, text in outputs.items():
        (d / "expected" / name).write_text(text)
    (d / "expected.txt").write_text("".join(line + "\n" for line in lines))
    print(
        f"{d.name}: {result.status}, {len(lines)} findings (project of {len(result.files)} files)"
    )


def main() -> None:
    pattern = sys.argv[1] if len(sys.argv) > 1 else ""
    from ddpify import rules

    # lint's examples (tool "lint") hold lint findings, written by their own tests: not conversions
    examples = [
        d
        for d in sorted((ROOT / "fixtures" / "rules").glob("DDP*"))
        if getattr(rules.get(d.name), "tool", "") != "lint"
    ]
    dirs = sorted((ROOT / "fixtures").iterdir()) + examples
    for d in (
        dirs
    ):  # whole-script fixtures, then each rule's example (fixtures/rules/<CODE>/)
        if getattr(rules.get(d.name), "tool", "") == "gate" and d.name.startswith(
            pattern
        ):
            from ddpify.gate import example_findings

            lines = example_findings(d)  # a converted program that breaks the invariant
            (d / "expected.txt").write_text("".join(line + "\n" for line in lines))
            print(f"{d.name}: gate example, {len(lines)} findings")
            continue
        if (d / "input").is_dir() and d.name.startswith(pattern):
            regen_project(d)
            continue
        if not (d / "input.py").exists() or not d.name.startswith(pattern):
            continue
        result = convert_source(
            (d / "input.py").read_text(), options_for(d), path="input.py"
        )
        (d / "expected.py").write_text(result.source)
        (d / "expected.txt").write_text(
            "".join(f.format("input.py") + "\n" for f in result.findings)
        )
        print(f"{d.name}: {result.status}, {len(result.findings)} findings")
        if (
            d / "expected_apex.py"
        ).exists():  # the same input converted with --amp apex (tests/test_apex.py)
            result = convert_source(
                (d / "input.py").read_text(), Options(amp="apex"), path="input.py"
            )
            (d / "expected_apex.py").write_text(result.source)
            (d / "expected_apex.txt").write_text(
                "".join(f.format("input.py") + "\n" for f in result.findings)
            )
            print(
                f"{d.name} (--amp apex): {result.status}, {len(result.findings)} findings"
            )


if __name__ == "__main__":
    main()
