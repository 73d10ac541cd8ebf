"""lint's speed over the reported-bug scripts, the controls and the real-script corpus: ms per
file for `lint_source` (each file alone), beside a bare LibCST parse of the same files in the same
run (the ratio is what to compare across machines).

    python bench/lintbugs/lint_speed.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import libcst as cst

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from ddpify.lint import lint_source  # noqa: E402

sys.path.insert(0, str(HERE))
from fp_lint import extract  # noqa: E402


def corpus(tmp: Path) -> list[tuple[str, str]]:
    files = [
        (p.name, p.read_text())
        for p in sorted((HERE / "bugs").glob("*.py"))
        + sorted((HERE / "clean").glob("*.py"))
    ]
    roots: dict[tuple[str, str], Path] = {}
    for s in tomllib.loads((HERE / "fp_corpus.toml").read_text())["script"]:
        key = (s["repo"], s["commit"])
        try:
            roots.setdefault(key, extract(s["repo"], s["commit"], tmp))
        except Exception:
            continue  # no mirror here: the bug scripts and controls still count
        files.append((f"{s['repo']}:{s['path']}", (roots[key] / s["path"]).read_text()))
    return files


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = corpus(Path(tmp))
    lint_ms, parse_ms = [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for _, text in files:
            cst.parse_module(text)
        parse_ms.append(1000 * (time.perf_counter() - t0) / len(files))
        t0 = time.perf_counter()
        for name, text in files:
            lint_source(text, path=name)
        lint_ms.append(1000 * (time.perf_counter() - t0) / len(files))
    lint, parse = statistics.median(lint_ms), statistics.median(parse_ms)
    lines = sum(t.count("\n") for _, t in files)
    print(f"{len(files)} files, {lines} lines; median of {args.rounds} rounds")
    print(
        f"lint: {lint:.1f} ms/file; LibCST parse alone: {parse:.1f} ms/file; ratio {lint / parse:.1f}x"
    )


if __name__ == "__main__":
    main()
