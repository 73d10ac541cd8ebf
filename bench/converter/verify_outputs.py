"""Byte-for-byte guard for converter speed work: record every output, compare later.

    PYTHONPATH=<copy of the old code> python bench/converter/verify_outputs.py save /tmp/ref.json
    python bench/converter/verify_outputs.py compare /tmp/ref.json
    python bench/converter/verify_outputs.py walk  # Analysis's walk and positions against LibCST's

Inputs: every .py under fixtures/ and examples/, the benchmark corpus (make_corpus), and
deterministic fuzz mutations of the fixtures (bench/fuzz/fuzzlib), each under several option
sets. Recorded per case: output text, status, formatted findings, or the exception raised.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# ddpify from PYTHONPATH when set (a reference copy), else this checkout
sys.path[:0] = [str(HERE), str(REPO / "bench" / "fuzz")]
sys.path.append(str(REPO))

import make_corpus  # noqa: E402

from ddpify import Options, convert_source  # noqa: E402

OPTION_SETS = [
    {},
    {"amp": "apex"},
    {"amp": "bf16", "sync_bn": True},
    {"amp": "none", "shard_eval": True},
    {"amp": "fp16", "opt_level": "O2"},
]


def sources(tmp: Path) -> list[tuple[str, str]]:
    out = []
    for p in sorted(
        [*(REPO / "fixtures").rglob("*.py"), *(REPO / "examples").rglob("*.py")]
    ):
        out.append((str(p.relative_to(REPO)), p.read_text()))
    for p in sorted(
        (REPO / "fixtures").glob("*/input.py")
    ):  # tab-indented and CRLF files
        text = p.read_text()
        out.append((f"{p.parent.name}/tabs", text.replace("    ", "\t")))
        out.append((f"{p.parent.name}/crlf", text.replace("\n", "\r\n")))
    for p in make_corpus.generate(tmp, 240)["paths"]:
        out.append((Path(p).name, Path(p).read_text()))
    import fuzzlib

    fixtures = fuzzlib.fixture_sources()
    rng = random.Random(1234)
    for i in range(300):
        src = fuzzlib.mutate(rng.choice(fixtures), rng)
        if fuzzlib.compiles(src):
            out.append((f"fuzz{i}", src))
    return out


def run(name: str, src: str, opts: dict) -> dict:
    try:
        r = convert_source(src, Options(**opts), path="x.py")
    except Exception as e:  # noqa: BLE001 - recorded, compared
        return {"error": f"{type(e).__name__}: {e}"}
    return {
        "source": r.source,
        "status": r.status,
        "changed": r.changed,
        "findings": [f.format("x.py") for f in r.findings],
    }


def collect() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        srcs = sources(Path(tmp))
    res = {}
    for name, src in srcs:
        for k, opts in enumerate(OPTION_SETS):
            res[f"{name}#{k}"] = run(name, src, opts)
    return res


# texts LibCST does not print back as parsed (form feed, BOM, lone backslash), "\r", no final
# newline, repeated lines, match, tabs: where positions take their other paths
EDGE_CASES = [
    "\x0cimport os\nx = f'{a!r:>{w}}' + \\\n  (lambda q: q)(1)\ntry:\n    pass\nexcept* E as e:\n    pass\n",
    "\ufeffx = 1\nx = 1\n",
    "x = 1\n\\\ny = 2\n",
    "x = 1\r\ny = f(a,\r\n  b)\r\nif x:\r\n    z = 'é' + g(1)\r\n",
    "x = '''a\r\nb'''\nprint(x)\r",
    "x = 1\ny = f(a,\n  b)",
    "def f():\n\tif x:\n\t\treturn 'ü'; y(1)\n# c\n\n",
    "match x:\n    case [1, *r] if r:\n        pass\n    case {'a': b, **kw}:\n        pass\n  # tail\n",
    "class A:\n    def f(self):\n        if x:\n            a()\n        a()\n    def g(self):\n        if x:\n            a()\n        a()\n",
    "a()\nif x:\n    a()\nfor i in y: a()\nwhile 1:\n  if b:\n      a()\n  a()\n",
]


def positions_agree(Analysis, module, src, seen, ref) -> bool:
    """Analysis.pos is computed on demand, so the order of questions matters: every range in
    tree order, every start in reverse order, and single questions on fresh analyses."""
    a = Analysis(module, src)
    if any(ref[n] != a.pos[n] for n in seen):
        return False
    a = Analysis(module, src)
    if any(ref[n].start != a.pos.start(n) for n in reversed(seen)):
        return False
    rng = random.Random(len(seen))
    for n in rng.sample(seen, min(len(seen), 12)):
        if (
            Analysis(module, src).pos.start(n) != ref[n].start
            or Analysis(module, src).pos[n] != ref[n]
        ):
            return False
    return True


def walk_check() -> int:
    """The collecting walk numbers nodes in the order LibCST's visitor reaches them, with the
    same parents; Analysis.pos gives every node the range LibCST's PositionProvider does."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider

    from ddpify.analysis import _WHITESPACE, Analysis

    with tempfile.TemporaryDirectory() as tmp:
        srcs = sources(Path(tmp)) + [
            (f"edge{i}", text) for i, text in enumerate(EDGE_CASES)
        ]
    bad = 0
    for name, src in srcs:
        try:
            module = cst.parse_module(src)
        except Exception:  # noqa: BLE001
            continue
        seen: list = []
        parents: dict = {}

        class V(cst.CSTVisitor):
            stack: list = []

            def on_visit(self, node):
                seen.append(node)
                if self.stack:
                    parents[node] = self.stack[-1]
                self.stack.append(node)
                return True

            def on_leave(self, node):
                self.stack.pop()

        module.visit(V())
        ref = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        a = Analysis(module, src)
        got = sorted(a._order, key=a._order.get)
        # the walk leaves whitespace out: the rest in the visitor's order, with its parents
        walked = [n for n in seen if not isinstance(n, _WHITESPACE)]
        walked_parents = {
            n: p for n, p in parents.items() if not isinstance(n, _WHITESPACE)
        }
        if [id(n) for n in walked] != got or walked_parents != a.parent:
            bad += 1
            print("order or parents differ:", name)
        elif not positions_agree(Analysis, module, src, seen, ref):
            bad += 1
            print("positions differ:", name)
    print(f"walk and positions: {len(srcs) - bad} of {len(srcs)} sources identical")
    return 1 if bad else 0


def main() -> int:
    mode = sys.argv[1]
    if mode == "walk":
        return walk_check()
    path = Path(sys.argv[2])
    res = collect()
    if mode == "save":
        path.write_text(json.dumps(res))
        print(f"{len(res)} cases saved")
        return 0
    ref = json.loads(path.read_text())
    diff = [k for k in ref if ref[k] != res.get(k)] + [k for k in res if k not in ref]
    for k in diff[:20]:
        print(
            "differs:", k, "ref:", str(ref.get(k))[:300], "now:", str(res.get(k))[:300]
        )
    print(f"{len(res) - len(diff)} of {len(res)} cases identical")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
