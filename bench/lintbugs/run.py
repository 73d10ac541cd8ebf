"""Lint (and with --verify, run under `ddpify verify`) every reported bug of bugs.toml and every
clean control, and write results.md.

    python bench/lintbugs/run.py [--split dev|heldback|heldback2|verify-set|all] [--verify] [--out results.md]

Splits: `heldback` is the first collection's held-back third (b01-b56, measured once, before the
second collection); `heldback2` the second collection's (b57 on), drawn before any rule was
written from it; `dev` every bug outside heldback2; `verify-set` the 20 second-collection bugs
drawn for verify (verify_set.txt).

lint counts a bug as found when a finding of a code of its family (FAMILY_CODES) is reported,
anywhere in the script; `at line` says whether one is on the line the header marks. verify counts
a bug as found when a failing check of its family (FAMILY_CHECKS) fails with a cause that names
it (the cause matches the family's pattern). A control must get no error-level lint finding and
pass verify.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from ddpify.lint import lint_source  # noqa: E402

# the lint codes that name each family (a finding of one of them names the bug's family)
FAMILY_CODES = {
    "rank-collective": {"DDP210"},
    "rank-exit": {"DDP211"},
    "uneven-batches": {"DDP212"},
    "unused-params": {"DDP260"},
    "checkpoint-keys": {"DDP250", "DDP252"},
    "checkpoint-device": {"DDP230", "DDP234"},
    "file-race": {"DDP220", "DDP222", "DDP223"},
    "writer-local-rank": {"DDP221"},
    "rank-device": {"DDP230", "DDP231", "DDP232", "DDP233", "DDP282", "DDP283"},
    "replica-drift": {"DDP240", "DDP241", "DDP242", "DDP245"},
    "data-sharding": {"DDP200", "DDP203", "DDP204", "DDP205"},
    "metric-one-shard": {"DDP225", "DDP226", "DDP227"},
    "mixed-precision": {"DDP270", "DDP271"},
    "collective-shape": {"DDP213"},
    "double-reduce": {"DDP244"},
    "rank-randomness": set(),
}
# verify: (checks that may name the family, a pattern the failing check's cause must match)
FAMILY_CHECKS = {
    "rank-collective": (
        {"no-hang", "ranks"},
        r"rank \d+ (waits|ran ahead|is the only)|only where|inside `if|never join",
    ),
    "rank-exit": (
        {"no-hang", "ranks"},
        r"left the loop|ran ahead|raised|failed first.*(Error|exit)|returned",
    ),
    "uneven-batches": (
        {"no-hang", "ranks", "even-batches"},
        r"batches|ran out|more steps|different numbers",
    ),
    "unused-params": (
        {"ranks"},
        r"no gradient|not used in producing loss|find_unused_parameters",
    ),
    "checkpoint-keys": (
        {"ranks", "loads"},
        r"module\.|[Mm]issing key|[Uu]nexpected key|matched no|loaded none|no key",
    ),
    "checkpoint-device": ({"devices"}, r"cuda:0|GPU 0|map_location"),
    "file-race": (
        {"rank0-writes", "ranks"},
        r"written by|wrote|both|same path|not found|corrupt",
    ),
    "writer-local-rank": ({"rank0-writes"}, r"written by|wrote|both|same path"),
    "rank-device": ({"devices", "ranks"}, r"cuda|GPU|process group|initialis"),
    "replica-drift": (
        {"params-in-sync", "model-state", "ranks", "no-hang"},
        r"differ|diverge|not in sync|all-reduce|drift",
    ),
    "data-sharding": (
        {"data-sharding", "epoch-shuffle", "ranks", "even-batches"},
        r"overlap|same order|set_epoch|whole data|sample|shard|batches",
    ),
    "metric-one-shard": (
        {"metrics", "rank0-output"},
        r"one shard|shard|rank 0's own|not reduced|duplicat|count",
    ),
    "mixed-precision": ({"loss"}, r"NaN|inf|diverge"),
    "collective-shape": (
        {"no-hang", "ranks"},
        r"size|shape|[Mm]ismatch|ran ahead|waits|different collectives",
    ),
    "double-reduce": ({"params-in-sync"}, r"differ"),
    "rank-randomness": ({"data-sharding"}, r"same"),
}


def ids(name: str) -> set[str]:
    return {
        ln.strip()
        for ln in (HERE / name).read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    }


def load(split: str) -> tuple[list[dict], list[Path]]:
    bugs = tomllib.loads((HERE / "bugs.toml").read_text())["bug"]
    bugs.sort(key=lambda b: int(b["id"][1:]))
    if split == "dev":
        bugs = [b for b in bugs if b["id"] not in ids("heldback2.txt")]
    elif split == "heldback":
        bugs = [b for b in bugs if b["id"] in ids("heldback.txt")]
    elif split == "heldback2":
        bugs = [b for b in bugs if b["id"] in ids("heldback2.txt")]
    elif split == "verify-set":
        bugs = [b for b in bugs if b["id"] in ids("verify_set.txt")]
    return bugs, sorted((HERE / "clean").glob("*.py"))


def lint(path: Path) -> list:
    return lint_source(path.read_text(), path=str(path)).findings


def run_verify(path: Path, family: str | None, timeout: float) -> dict:
    """`ddpify verify --no-convert` on 2 gloo ranks, to the script's end; the JSON report."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        args = [
            sys.executable,
            "-m",
            "ddpify",
            "verify",
            str(path),
            "--no-convert",
            "--no-baseline",
            "--nproc",
            "2",
            "--backend",
            "gloo",
            "--to-end",
            "--timeout",
            str(timeout),
            "--json",
            str(report),
        ]
        if family == "writer-local-rank":
            args += ["--nnodes", "2"]  # the bug needs more than one node
        args += ["--", "--out", tmp]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        t0 = time.time()
        proc = subprocess.run(
            args, cwd=tmp, env=env, capture_output=True, text=True, timeout=600
        )
        try:
            doc = json.loads(report.read_text())
        except (OSError, ValueError):
            doc = {"checks": [], "error": (proc.stderr or proc.stdout)[-400:]}
        doc["seconds"] = round(time.time() - t0, 1)
        return doc


def verify_names(doc: dict, family: str) -> tuple[bool, str]:
    checks, pattern = FAMILY_CHECKS[family]
    fails = [c for c in doc.get("checks", []) if c["status"] == "FAIL"]
    for c in fails:
        text = f"{c.get('figure') or ''} {c.get('cause') or ''}"
        if c["name"] in checks and re.search(pattern, text):
            return (
                True,
                f"{c['name']}: {(c.get('cause') or c.get('figure') or '')[:160]}",
            )
    if fails:
        c = fails[0]
        return (
            False,
            f"(other) {c['name']}: {(c.get('cause') or c.get('figure') or '')[:160]}",
        )
    return False, "no check failed" if doc.get(
        "checks"
    ) else f"no report: {doc.get('error', '')[:160]}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--split",
        choices=("dev", "heldback", "heldback2", "verify-set", "all"),
        default="dev",
    )
    ap.add_argument("--verify", action="store_true")
    ap.add_argument(
        "--timeout",
        type=float,
        default=20.0,
        help="verify: seconds without progress before a hang",
    )
    ap.add_argument("--out", default=str(HERE / "results.md"))
    args = ap.parse_args()
    bugs, controls = load(args.split)
    rows, lint_hits, lint_line, verify_hits = [], 0, 0, 0
    for b in bugs:
        path = HERE / b["file"]
        got = lint(path)
        codes = FAMILY_CODES[b["family"]]
        named = [f for f in got if f.code in codes]
        hit = bool(named)
        at_line = any(f.line == b["line"] for f in named)
        lint_hits += hit
        lint_line += at_line
        shown = ", ".join(sorted({f"{f.code}:{f.line}" for f in got})) or "nothing"
        row = {
            "id": b["id"],
            "family": b["family"],
            "kind": b["kind"],
            "lint": hit,
            "at_line": at_line,
            "lint_found": shown,
        }
        if args.verify:
            doc = run_verify(path, b["family"], args.timeout)
            ok, why = verify_names(doc, b["family"])
            verify_hits += ok
            row.update(verify=ok, verify_why=why, seconds=doc.get("seconds"))
        rows.append(row)
        print(
            f"{b['id']} {b['family']:18} lint {'yes' if hit else 'NO '} {shown[:70]}"
            + (
                f" | verify {'yes' if row['verify'] else 'NO '} {row['verify_why'][:90]}"
                if args.verify
                else ""
            ),
            flush=True,
        )
    crows = []
    for c in controls:
        errors = [f for f in lint(c) if f.blocking]
        crow = {
            "file": c.name,
            "lint_errors": ", ".join(f"{f.code}:{f.line}" for f in errors) or "none",
        }
        if args.verify:
            doc = run_verify(c, None, args.timeout)
            fails = [x["name"] for x in doc.get("checks", []) if x["status"] == "FAIL"]
            crow["verify"] = (
                "pass"
                if doc.get("checks") and not fails
                else ("FAIL " + ", ".join(fails) if fails else "no report")
            )
        crows.append(crow)
        print(
            f"control {c.name}: lint errors {crow['lint_errors']}"
            + (f" | verify {crow['verify']}" if args.verify else ""),
            flush=True,
        )
    write(args, rows, crows, lint_hits, lint_line, verify_hits)


def write(args, rows, crows, lint_hits, lint_line, verify_hits) -> None:
    n = len(rows)
    pct = lambda k: f"{k}/{n} = {100 * k / n:.0f}%" if n else "0/0"  # noqa: E731
    out = [
        f"# Reported DDP bugs: lint{' and verify' if args.verify else ''} ({args.split} split)",
        "",
        f"`python bench/lintbugs/run.py --split {args.split}{' --verify' if args.verify else ''}`",
        "",
        f"- lint names the family: {pct(lint_hits)} (a finding on the marked line: {pct(lint_line)})",
    ]
    if args.verify:
        out.append(f"- verify names the cause: {pct(verify_hits)}")
    clean_lint = sum(c["lint_errors"] == "none" for c in crows)
    out.append(
        f"- clean controls without a lint error: {clean_lint}/{len(crows)}"
        + (
            f"; passing verify: {sum(c.get('verify') == 'pass' for c in crows)}/{len(crows)}"
            if args.verify
            else ""
        )
    )
    out += [
        "",
        "| bug | family | kind | lint | findings | "
        + ("verify | verify's cause |" if args.verify else ""),
        "|---|---|---|---|---|" + ("---|---|" if args.verify else ""),
    ]
    for r in rows:
        line = f"| {r['id']} | {r['family']} | {r['kind']} | {'yes' if r['lint'] else 'no'}{'' if r['at_line'] or not r['lint'] else ' (elsewhere)'} | {r['lint_found']} |"
        if args.verify:
            line += f" {'yes' if r['verify'] else 'no'} | {r['verify_why'].replace('|', '/')} |"
        out.append(line)
    out += [
        "",
        "| control | lint errors |" + (" verify |" if args.verify else ""),
        "|---|---|" + ("---|" if args.verify else ""),
    ]
    for c in crows:
        out.append(
            f"| {c['file']} | {c['lint_errors']} |"
            + (f" {c['verify']} |" if args.verify else "")
        )
    Path(args.out).write_text("\n".join(out) + "\n")
    print(
        f"lint {lint_hits}/{n}"
        + (f", verify {verify_hits}/{n}" if args.verify else "")
        + f" -> {args.out}"
    )


if __name__ == "__main__":
    main()
