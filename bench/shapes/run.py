"""Generate single-GPU training scripts from the shapes grammar, convert each with ddpify, and judge
the conversion with an oracle that does not trust ddpify (see README.md).

    python bench/shapes/run.py --n 150 --seed 1 -j 2 --json out.json [--shrink] [--no-verify]
    python bench/shapes/run.py --seed 1 --index 17 --keep /tmp/case17      # one case again
    python bench/shapes/run.py --case bench/shapes/found/NAME              # a shrunk case again
    python bench/shapes/run.py --table out.json --md table.md              # the table by dimension
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gen import Program, draw, generate  # noqa: E402
from grammar import DIMENSIONS, simplest  # noqa: E402
import oracle  # noqa: E402
from oracle import disagreement, run_program, signature  # noqa: E402
from shrink import shrink  # noqa: E402

_print_lock = threading.Lock()


def say(msg: str) -> None:
    with _print_lock:
        print(msg, flush=True)


def ddpify_identity() -> dict:
    """Which ddpify is on the path: its version, folder and git commit (a subprocess: the oracle
    never imports it)."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ddpify, os; print(os.path.dirname(os.path.abspath(ddpify.__file__)))",
        ],
        capture_output=True,
        text=True,
    )
    where = out.stdout.strip()
    ver = subprocess.run(
        [sys.executable, "-m", "ddpify", "--version"], capture_output=True, text=True
    ).stdout.strip()
    commit = ""
    if where:
        g = subprocess.run(
            ["git", "-C", where, "rev-parse", "HEAD"], capture_output=True, text=True
        )
        commit = g.stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", where, "status", "--porcelain", "--", "."],
            capture_output=True,
            text=True,
        ).stdout.strip()
        if commit and dirty:
            commit += " (with uncommitted changes)"
    return {"version": ver, "path": where, "commit": commit}


def short(dims: dict[str, str]) -> str:
    base = simplest()
    return (
        " ".join(f"{k}={v}" for k, v in dims.items() if v != base[k])
        or "(all simplest)"
    )


def line_for(i, res: dict) -> str:
    v = res["verdict"]
    extra = ""
    if v == "refused":
        extra = " codes " + ",".join(
            sorted({b.split()[0] for b in res["ddpify"]["blocking"]})
        )
    elif v in ("wrong", "crash", "invalid"):
        extra = " " + res["reason"][:220].replace("\n", " ")
    ver = res.get("verify")
    vtxt = f" verify={ver['verdict']}" if ver else ""
    dis = disagreement(res)
    return f"[{i}] {v:8s}{vtxt}{extra}" + (f"  DISAGREE: {dis}" if dis else "")


def run_one(prog: Program, keep: Path | None, verify: bool) -> dict:
    if keep is not None:
        if keep.exists():
            shutil.rmtree(keep)
        keep.mkdir(parents=True)
        return run_program(prog, keep, verify=verify)
    with tempfile.TemporaryDirectory(prefix="shapes-") as tmp:
        return run_program(prog, Path(tmp), verify=verify)


def case_record(i, prog: Program, res: dict, seconds: float) -> dict:
    c = res.get("ddpify", {})
    return {
        "index": i,
        "name_seed": prog.name_seed,
        "dims": prog.dims,
        "argv": prog.argv,
        "expect_steps": prog.steps,
        "ddpify_exit": c.get("exit"),
        "ddpify_codes": c.get("codes", []),
        "blocking": c.get("blocking", []),
        "verdict": res["verdict"],
        "failed": res.get("failed", []),
        "reason": res.get("reason", ""),
        "verify": res.get("verify"),
        "disagreement": disagreement(res),
        "records": res.get("records"),
        "converted": {
            k: v for k, v in (res.get("converted") or {}).items() if k != "stderr_tail"
        },
        "seconds": round(seconds, 1),
    }


def save_found(
    root: Path, prog: Program, res: dict, orig_case: dict, runs: int
) -> Path:
    sig = signature(res)
    base = simplest()
    head = re.sub(r"[^A-Za-z0-9]+", "-", sig[1] or sig[0]).strip("-")[:48].rstrip("-")
    parts = [head] + [f"{k}-{v}" for k, v in prog.dims.items() if v != base[k]]
    name = "_".join(parts).replace("__", "_")[:110].rstrip("_-")
    out = root / name
    if out.exists():
        shutil.rmtree(out)
    (out / "files").mkdir(parents=True)
    prog.write(out / "files")
    (out / "dims.json").write_text(
        json.dumps(
            {
                "dims": prog.dims,
                "name_seed": prog.name_seed,
                "argv": prog.argv,
                "entry": prog.entry_file,
                "expect_steps": prog.steps,
                "signature": list(sig),
                "found_as": {
                    "seed": orig_case.get("seed"),
                    "index": orig_case["index"],
                    "dims": orig_case["dims"],
                },
                "shrink_runs": runs,
            },
            indent=2,
        )
        + "\n"
    )
    c = res.get("ddpify", {})
    run_line = " ".join(prog.argv)
    md = [
        f"# {name}",
        "",
        f"Minimal dimensions (all others at their simplest): `{short(prog.dims)}`",
        "",
        f"Oracle verdict: **{res['verdict']}** (first failing check: `{sig[1]}`)",
        "",
        "What goes wrong:",
        "",
        *[f"- {r.strip()}" for r in res.get("reason", "").split("; ") if r.strip()],
        "",
        f"ddpify exit {c.get('exit')}, codes: {', '.join(c.get('codes', [])) or 'none'}",
        "",
        f"Found as case {orig_case['index']} of seed {orig_case.get('seed')} ({short(orig_case['dims'])}); shrunk in {runs} runs.",
        "",
        "Reproduce:",
        "",
        "```",
        f"python bench/shapes/run.py --case {_from_repo(out)}",
        f"# or by hand, in files/: python -m ddpify {prog.entry_file} && torchrun --standalone --nproc_per_node=2 {run_line}",
        "```",
        "",
    ]
    ver = res.get("verify")
    if ver:
        md += [
            f"verify (--no-convert --to-end --no-baseline, gloo): {ver['verdict']}"
            + (
                f", failed checks: {', '.join(ver['failed'])}"
                if ver.get("failed")
                else ""
            ),
            "",
        ]
    (out / "expected.md").write_text("\n".join(md))
    return out


def _from_repo(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(HERE.parent.parent))
    except ValueError:
        return str(p)


def load_case(path: Path) -> Program:
    meta = json.loads((path / "dims.json").read_text())
    return generate(meta["dims"], meta["name_seed"])


def table(doc: dict) -> str:
    cases = doc["cases"]
    n = len(cases)
    tot = {
        v: sum(1 for c in cases if c["verdict"] == v)
        for v in ("correct", "wrong", "crash", "refused", "invalid")
    }
    lines = [
        "# Shapes: outcome by dimension",
        "",
        f"{n} generated scripts (seed {doc.get('seed')}), {doc.get('ddpify', {}).get('version', 'ddpify')} "
        f"at {doc.get('ddpify', {}).get('commit', '?')}: "
        f"{tot['correct']} correct, {tot['wrong'] + tot['crash']} wrong ({tot['crash']} of them ddpify crashes), "
        f"{tot['refused']} refused"
        + (f", {tot['invalid']} invalid" if tot["invalid"] else "")
        + ".",
        "",
        f"Command: `{doc.get('command', '')}`",
        "",
        "Each row: the scripts that have this variant (every script has one variant of each dimension), "
        "and how their conversions came out. `wrong %` is of all scripts with the variant.",
        "",
    ]
    for dim, variants in DIMENSIONS.items():
        lines += [
            f"## {dim}",
            "",
            "| variant | scripts | correct | wrong | refused | wrong % |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for v in variants:
            cs = [c for c in cases if c["dims"].get(dim) == v]
            k = len(cs)
            cor = sum(c["verdict"] == "correct" for c in cs)
            wr = sum(c["verdict"] in ("wrong", "crash") for c in cs)
            ref = sum(c["verdict"] == "refused" for c in cs)
            pct = f"{100 * wr / k:.0f}" if k else "-"
            lines.append(f"| {v} | {k} | {cor} | {wr} | {ref} | {pct} |")
        lines.append("")
    fails: dict[str, int] = {}
    for c in cases:
        for f in c.get("failed", []) if c["verdict"] == "wrong" else []:
            fails[f] = fails.get(f, 0) + 1
    if fails:
        lines += [
            "## Failing checks (wrong scripts)",
            "",
            "| check | scripts |",
            "|---|---:|",
        ]
        lines += [
            f"| {k} | {v} |" for k, v in sorted(fails.items(), key=lambda kv: -kv[1])
        ]
        lines.append("")
    codes: dict[str, int] = {}
    for c in cases:
        if c["verdict"] == "refused":
            for b in c.get("blocking", []):
                codes[b.split()[0]] = codes.get(b.split()[0], 0) + 1
    if codes:
        lines += [
            "## Blocking codes (refused scripts)",
            "",
            "| code | findings |",
            "|---|---:|",
        ]
        lines += [
            f"| {k} | {v} |" for k, v in sorted(codes.items(), key=lambda kv: -kv[1])
        ]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=20, help="scripts to generate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-j", "--jobs", type=int, default=1, help="scripts run at once")
    ap.add_argument("--json", help="write every script's record here")
    ap.add_argument(
        "--keep",
        help="keep each script's folder (generated files, runs, records) under this folder",
    )
    ap.add_argument(
        "--index",
        type=int,
        action="append",
        help="run only these indices of the seed (repeatable)",
    )
    ap.add_argument(
        "--case", help="run a saved case folder (found/NAME, with dims.json) again"
    )
    ap.add_argument("--no-verify", action="store_true", help="skip `ddpify verify`")
    ap.add_argument(
        "--torchrun",
        action="store_true",
        help="start the ranks with the real torchrun (default: forked from one process that imported torch, "
        "with torchrun's environment)",
    )
    ap.add_argument(
        "--shrink",
        action="store_true",
        help="shrink wrong and crashed scripts, one per way of failing",
    )
    ap.add_argument(
        "--shrink-max", type=int, default=12, help="at most this many shrinks"
    )
    ap.add_argument("--shrink-budget", type=int, default=30, help="runs per shrink")
    ap.add_argument(
        "--found", default=str(HERE / "found"), help="where shrunk cases go"
    )
    ap.add_argument(
        "--reshrink",
        help="shrink the wrong scripts of a JSON written by --json (its seed), skipping the "
        "ways of failing already under --found",
    )
    ap.add_argument(
        "--table",
        help="a JSON written by --json: print its table by dimension (Markdown)",
    )
    ap.add_argument("--md", help="with --table: write the table to this file")
    a = ap.parse_args(argv)

    if a.table:
        text = table(json.loads(Path(a.table).read_text()))
        if a.md:
            Path(a.md).write_text(text + "\n")
        else:
            print(text)
        return 0

    keep = Path(a.keep) if a.keep else None
    oracle.USE_TORCHRUN = a.torchrun
    try:
        return _main(a, argv, keep)
    finally:
        oracle.close_launchers()


def _main(a, argv, keep) -> int:
    if a.reshrink:
        doc = json.loads(Path(a.reshrink).read_text())
        a.seed = doc["seed"]
        results = {c["index"]: (draw(a.seed, c["index"]), c) for c in doc["cases"]}
        have = set()
        for f in Path(a.found).glob("*/dims.json"):
            have.add(tuple(json.loads(f.read_text())["signature"]))
        found = do_shrink(
            a, [c["index"] for c in doc["cases"]], results, keep, skip=have
        )
        doc["found"] = doc.get("found", []) + found
        Path(a.reshrink).write_text(json.dumps(doc, indent=1) + "\n")
        return 0
    if a.case:
        prog = load_case(Path(a.case))
        res = run_one(prog, keep, not a.no_verify)
        say(line_for(Path(a.case).name, res))
        say(res.get("reason", ""))
        return 0 if res["verdict"] in ("correct", "refused") else 1

    indices = a.index if a.index else list(range(a.n))
    t_start = time.time()
    ident = ddpify_identity()
    cases: dict[int, dict] = {}
    results: dict[int, tuple[Program, dict]] = {}

    def work(i: int) -> None:
        prog = draw(a.seed, i)
        t0 = time.time()
        res = run_one(prog, keep / str(i) if keep else None, not a.no_verify)
        cases[i] = case_record(i, prog, res, time.time() - t0)
        results[i] = (prog, res)
        say(line_for(i, res))

    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        list(ex.map(work, indices))

    ordered = [cases[i] for i in indices]
    counts = {
        v: sum(1 for c in ordered if c["verdict"] == v)
        for v in ("correct", "wrong", "crash", "refused", "invalid")
    }
    found = []
    if a.shrink:
        found = do_shrink(a, indices, results, keep)
    doc = {
        "command": "python bench/shapes/run.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "seed": a.seed,
        "n": len(indices),
        "ddpify": ident,
        "seconds": round(time.time() - t_start),
        "counts": counts,
        "cases": ordered,
        "found": found,
        "disagreements": [
            {"index": c["index"], "what": c["disagreement"]}
            for c in ordered
            if c["disagreement"]
        ],
    }
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
    wrong = counts["wrong"] + counts["crash"]
    tail = f" ({counts['crash']} ddpify crashes)" if counts["crash"] else ""
    tail += (
        f", {counts['invalid']} invalid (generator bugs)" if counts["invalid"] else ""
    )
    say(
        f"shapes: {counts['correct']} correct, {wrong} wrong, {counts['refused']} refused of {len(indices)}{tail}"
    )
    return 0


def do_shrink(a, indices, results, keep, skip=frozenset()) -> list[dict]:
    """One shrink per way of failing (signature), in index order; each saved under --found."""
    groups: dict[tuple, list[int]] = {}
    for i in indices:
        prog, res = results[i]
        if res["verdict"] in ("wrong", "crash") and signature(res) not in skip:
            groups.setdefault(signature(res), []).append(i)
    found = []
    seen_min: set[tuple] = set()
    lock = threading.Lock()

    def one(sig, idxs):
        i = idxs[0]
        prog, res = results[i]
        say(
            f"shrinking [{i}] ({sig[0]}: {sig[1]}), {len(idxs)} script(s) fail this way"
        )
        last: dict = {}

        def fails(d: dict[str, str]) -> bool:
            p = generate(d, prog.name_seed)
            r = run_one(p, None, False)
            ok = signature(r) == sig
            if ok:
                last["prog"], last["res"] = p, r
            return ok

        minimal, runs = shrink(
            prog.dims, fails, log=lambda m: say(f"[{i}]{m}"), budget=a.shrink_budget
        )
        if "prog" not in last:
            last["prog"], last["res"] = prog, res
        p, r = last["prog"], last["res"]
        key = tuple(sorted(p.dims.items()))
        with lock:
            if key in seen_min:
                return
            seen_min.add(key)
        if not a.no_verify:
            with tempfile.TemporaryDirectory(prefix="shapes-") as tmp:
                r = run_program(p, Path(tmp), verify=True)
        out = save_found(
            Path(a.found), p, r, {"index": i, "seed": a.seed, "dims": prog.dims}, runs
        )
        say(f"  -> {out.name}: {short(p.dims)}: {r.get('reason', '')[:200]}")
        with lock:
            found.append(
                {
                    "name": out.name,
                    "signature": list(sig),
                    "dims": p.dims,
                    "from_index": i,
                    "same_way": idxs,
                    "reason": r.get("reason", ""),
                    "verify": (r.get("verify") or {}).get("verdict"),
                    "shrink_runs": runs,
                }
            )

    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        list(ex.map(lambda kv: one(*kv), list(groups.items())[: a.shrink_max]))
    found.sort(key=lambda f: f["from_index"])
    return found


if __name__ == "__main__":
    sys.exit(main())
