"""lint over real distributed training scripts (bench/lintbugs/fp_corpus.toml): each repository is
read from its `fetch` mirror at the pinned commit (extracted to a temporary folder, never
committed) and each script is linted in project mode, with the local modules it imports.

    python bench/lintbugs/fp_lint.py [--out bench/lintbugs/fp_findings.txt]

Exit 1 when an error-level finding remains (the corpus must have none)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from ddpify.lint import lint_project  # noqa: E402
from ddpify.lint.cli import severity  # noqa: E402

MIRRORS = Path("/work/.mirror")


def extract(repo: str, commit: str, into: Path) -> Path:
    """The repository's Python files at the commit (the snapshot may lack its large data files)."""
    git = MIRRORS / repo.replace("/", "+") / "repo"
    root = into / repo.replace("/", "+")
    listing = subprocess.run(
        ["git", "-C", str(git), "ls-tree", "-r", commit],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    wanted = []
    for line in listing.splitlines():
        meta, path = line.split("\t", 1)
        mode, kind, sha = meta.split()
        if kind == "blob" and path.endswith(".py") and mode != "120000":
            wanted.append((sha, path))
    batch = subprocess.run(
        ["git", "-C", str(git), "cat-file", "--batch"],
        input="".join(f"{sha}\n" for sha, _ in wanted).encode(),
        capture_output=True,
        check=True,
    ).stdout
    pos = 0
    for sha, path in wanted:
        header_end = batch.index(b"\n", pos)
        header = batch[pos:header_end].split()
        pos = header_end + 1
        if len(header) < 3 or header[1] == b"missing":
            continue
        size = int(header[2])
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(batch[pos : pos + size])
        pos += size + 1
    return root


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE / "fp_findings.txt"))
    ap.add_argument("--repo", default=None, help="only the scripts of this repository")
    args = ap.parse_args()
    scripts = tomllib.loads((HERE / "fp_corpus.toml").read_text())["script"]
    if args.repo:
        scripts = [s for s in scripts if s["repo"] == args.repo]
    lines, errors, notes = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        roots: dict[tuple[str, str], Path] = {}
        for s in scripts:
            key = (s["repo"], s["commit"])
            if key not in roots:
                roots[key] = extract(s["repo"], s["commit"], Path(tmp))
            entry = roots[key] / s["path"]
            t0 = time.time()
            results = lint_project(str(entry))
            print(
                f"{s['repo']}:{s['path']}: {time.time() - t0:.1f} s",
                file=sys.stderr,
                flush=True,
            )
            status = results[0].status if results else "?"
            found = [(r, f) for r in results for f in r.findings]
            lines.append(
                f"{s['repo']}:{s['path']} ({status}): {sum(severity(f) == 'error' for _, f in found)} errors, {sum(severity(f) == 'note' for _, f in found)} notes"
            )
            for r, f in found:
                rel = (
                    Path(r.path).resolve().relative_to(roots[key].resolve())
                    if Path(r.path).resolve().is_relative_to(roots[key].resolve())
                    else r.path
                )
                lines.append(
                    f"  {rel}:{f.line}:{f.col}: {f.code} [{severity(f)}] {f.message}"
                )
                errors += severity(f) == "error"
                notes += severity(f) == "note"
    lines.append(
        f"{len(scripts)} scripts: {errors} error-level findings, {notes} notes"
    )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
