"""ddpify lint over real code: bench/realworld's already-distributed entries (real, working DDP
scripts: lint must report no error on them) and the converter's outputs of the corpus (every
script ddpify writes must lint clean).

    python bench/lint/corpus_lint.py                       # distributed entries, from the mirrors
    python bench/lint/corpus_lint.py --convert             # + convert the single-GPU entries whose mirror is here, lint the outputs
    python bench/lint/corpus_lint.py --outputs DIR         # + lint every .py under DIR (e.g. run.py --keep's folders)
    python bench/lint/corpus_lint.py --results bench/lint/corpus_results.txt

Sources come from git mirrors laid out as bench/realworld/run.py reads them (--mirrors, default
/work/.mirror: OWNER+NAME/repo); an entry whose mirror is missing is listed as skipped. Each
entry is extracted with `git archive` at its pinned commit into a temp dir; nothing from the
repositories is written into this one. The held-back split (bench/realworld/heldback/) is not read.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MANIFEST = ROOT / "bench" / "realworld" / "manifest.toml"


def git_dir(mirrors: Path, repo: str) -> Path | None:
    base = mirrors / repo.replace("/", "+") / "repo"
    for cand in (base, base / ".git", mirrors / repo.replace("/", "+"), mirrors / repo):
        if (cand / "objects").is_dir():
            return cand
    return None


def extract(entry: dict, gd: Path, dest: Path) -> None:
    paths = sorted(
        {entry["path"], *entry.get("siblings", []), *entry.get("convert", [])}
    )
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "--git-dir", str(gd), "archive", entry["commit"], "--", *paths],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + (
        os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else ""
    )
    return e


def lint(paths: list[str], cwd: Path) -> tuple[int, dict, float]:
    """(exit status, JSON document, seconds) of `ddpify lint --output-format json PATHS`."""
    t = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "ddpify", "lint", "--output-format", "json", *paths],
        cwd=cwd,
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    secs = time.perf_counter() - t
    try:
        doc = json.loads(res.stdout)
    except ValueError:
        doc = {"files": [], "summary": res.stderr.strip()[-300:]}
    return res.returncode, doc, secs


def findings(doc: dict, severity: str) -> list[str]:
    return [
        f"{f['path']}:{x['line']}:{x['col']}: {x['code']} {x['message']}"
        for f in doc.get("files", [])
        for x in f.get("findings", [])
        if x["severity"] == severity
    ]


def lint_distributed(
    entries: list[dict], mirrors: Path, out: list[str]
) -> tuple[int, int]:
    checked = clean = 0
    for e in entries:
        gd = git_dir(mirrors, e["repo"])
        if gd is None:
            out.append(f"{e['name']}: skipped (no mirror of {e['repo']})")
            continue
        with tempfile.TemporaryDirectory(prefix=f"lint-{e['name']}-") as tmp:
            src = Path(tmp) / "src"
            extract(e, gd, src)
            here = src / Path(e["path"]).parent
            rc, doc, secs = lint([Path(e["path"]).name], here)
        errors, notes = findings(doc, "error"), findings(doc, "note")
        checked += 1
        clean += not errors and rc == 0
        out.append(
            f"{e['name']} ({e['repo']}:{e['path']}): exit {rc}, {len(errors)} errors, {len(notes)} notes, {secs:.2f} s"
        )
        out += [f"    error: {x}" for x in errors] + [f"    note: {x}" for x in notes]
    return checked, clean


def convert_and_lint(
    entries: list[dict], mirrors: Path, out: list[str]
) -> tuple[int, int]:
    checked = clean = 0
    for e in entries:
        gd = git_dir(mirrors, e["repo"])
        if gd is None:
            continue
        with tempfile.TemporaryDirectory(prefix=f"lintc-{e['name']}-") as tmp:
            src = Path(tmp) / "src"
            extract(e, gd, src)
            given = [e["path"]] if e.get("project") else e.get("convert", [e["path"]])
            before = {p: p.read_bytes() for p in src.rglob("*.py")}
            conv = subprocess.run(
                [sys.executable, "-m", "ddpify", "-q", *given],
                cwd=src,
                env=env(),
                capture_output=True,
                text=True,
                timeout=600,
            )
            changed = [p for p in src.rglob("*.py") if before.get(p) != p.read_bytes()]
            if conv.returncode != 0 or not changed:
                out.append(
                    f"{e['name']}: not converted (exit {conv.returncode}): nothing to lint"
                )
                continue
            rc, doc, secs = lint([str(Path(g)) for g in given], src)
        errors, notes = findings(doc, "error"), findings(doc, "note")
        checked += 1
        clean += not errors
        out.append(
            f"{e['name']} converted ({len(changed)} files): lint exit {rc}, {len(errors)} errors, {len(notes)} notes"
        )
        out += [f"    error: {x}" for x in errors]
    return checked, clean


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mirrors", default=os.environ.get("RW_MIRRORS", "/work/.mirror"))
    ap.add_argument(
        "--convert",
        action="store_true",
        help="also convert the single-GPU entries whose mirror is here and lint the outputs",
    )
    ap.add_argument(
        "--outputs", help="also lint every .py under this folder (converter outputs)"
    )
    ap.add_argument("--results", help="write the report here too")
    args = ap.parse_args()
    entries = tomllib.loads(MANIFEST.read_text())["entry"]
    mirrors = Path(args.mirrors)
    out = [
        f"# ddpify lint over bench/realworld, {time.strftime('%Y-%m-%d %H:%M:%S %z')}",
        "",
        "command: python "
        + " ".join(
            [
                str(Path(sys.argv[0]).relative_to(ROOT))
                if Path(sys.argv[0]).is_absolute()
                else sys.argv[0],
                *sys.argv[1:],
            ]
        ),
        "",
    ]
    dist_entries = [e for e in entries if e.get("kind") == "distributed"]
    out.append(
        f"## already-distributed entries ({len(dist_entries)}): no error-level finding expected"
    )
    checked, clean = lint_distributed(dist_entries, mirrors, out)
    out.append(
        f"=> {clean} of {checked} linted entries without an error-level finding ({len(dist_entries) - checked} skipped)"
    )
    if args.convert:
        single = [e for e in entries if e.get("kind") != "distributed"]
        out += [
            "",
            f"## converter outputs of the single-GPU entries whose mirror is here ({len(single)} entries in all)",
        ]
        c_checked, c_clean = convert_and_lint(single, mirrors, out)
        out.append(
            f"=> {c_clean} of {c_checked} converted entries lint without an error-level finding"
        )
    if args.outputs:
        rc, doc, secs = lint([args.outputs], Path.cwd())
        errors = findings(doc, "error")
        out += [
            "",
            f"## every .py under {args.outputs}: exit {rc}, {len(doc.get('files', []))} files, {len(errors)} errors, {secs:.1f} s",
        ]
        out += [f"    error: {x}" for x in errors]
    text = "\n".join(out) + "\n"
    print(text, end="")
    if args.results:
        Path(args.results).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
