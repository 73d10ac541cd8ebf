"""Fuzzing ddpify: the property every input must satisfy, and source mutations of the fixtures.

Shared by tests/test_fuzz.py (a few hundred cases) and bench/fuzz/run_fuzz.py (10,000+).

Property, for every input that compiles:
  * convert_source returns or raises ConversionError (any other exception is a crash);
  * its output compiles;
  * converting the output again changes nothing (idempotence).
"""

from __future__ import annotations

import ast
import io
import random
import tokenize
import warnings
from pathlib import Path

import libcst

from ddpify import ConversionError, Options, convert_source
from ddpify.analysis import Analysis

ROOT = Path(__file__).resolve().parents[2]
# Names the converter itself cares about or inserts: renaming to one of them makes collisions.
TRICKY_NAMES = (
    "model", "optimizer", "loader", "train_loader", "dataset", "epoch", "device", "loss", "print",
    "torch", "dist", "DDP", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_DEVICE", "ddp_setup", "main",
    "sampler", "scaler", "x", "nn", "os", "DataLoader", "range",
)  # fmt: skip


class PropertyFailure(AssertionError):
    pass


def compiles(source: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            compile(source, "<fuzz>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
    return True


def check(source: str, options: Options | None = None) -> str:
    """Run the property on one compiling input; returns converted | unchanged | refused.

    Raises PropertyFailure when the output does not compile or is not a fixed point, and lets any
    unexpected exception from the converter through (a crash).
    """
    options = options or Options()
    try:
        result = convert_source(source, options, path="fuzz.py")
    except ConversionError:
        return "refused"
    if result.status == "not-training":
        # convert_source skips the analysis when the text has no backward(); run it anyway so
        # the fuzzer still exercises it on every program
        Analysis(libcst.parse_module(source))
    out = result.source
    if not result.changed and out != source:
        raise PropertyFailure("changed is False but the source differs")
    if not compiles(out):
        raise PropertyFailure("the output does not compile")
    again = convert_source(out, options, path="fuzz.py")
    if again.source != out:
        raise PropertyFailure("converting the output again changes it")
    return "converted" if out != source else "unchanged"


def fixture_sources() -> list[str]:
    return [
        p.read_text(encoding="utf-8")
        for p in sorted((ROOT / "fixtures").glob("*/input.py"))
    ]


# --------------------------------------------------------------------------- mutations


def _whole_lines(lines: list[str], node: ast.stmt) -> tuple[int, int] | None:
    """0-based [start, end) line span of a statement that sits alone on its lines."""
    start = (
        min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    )
    end = node.end_lineno
    first = lines[start]
    if first[: node.col_offset].strip() and not getattr(node, "decorator_list", None):
        return None
    if lines[end - 1][node.end_col_offset :].strip() and not lines[end - 1][
        node.end_col_offset :
    ].lstrip().startswith("#"):
        return None
    return start, end


def _statements(tree: ast.AST) -> list[ast.stmt]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.stmt)]


def delete_statement(source: str, rng: random.Random) -> str | None:
    lines = source.splitlines(keepends=True)
    stmts = _statements(ast.parse(source))
    rng.shuffle(stmts)
    for node in stmts:
        span = _whole_lines(lines, node)
        if span is None:
            continue
        start, end = span
        indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
        return "".join(
            lines[:start] + [indent + "pass\n"] + lines[end:]
        )  # pass keeps blocks non-empty
    return None


def rename(source: str, rng: random.Random) -> str | None:
    toks = [
        t
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
        if t.type == tokenize.NAME
    ]
    names = sorted({t.string for t in toks if not _is_keyword(t.string)})
    if not names:
        return None
    old = rng.choice(names)
    new = rng.choice(TRICKY_NAMES + (old + "_2",))
    every = rng.random() < 0.7  # all occurrences, or a single one (a dangling name)
    chosen = [t for t in toks if t.string == old]
    if not every:
        chosen = [rng.choice(chosen)]
    lines = source.splitlines(keepends=True)
    for t in sorted(chosen, key=lambda t: t.start, reverse=True):
        row, col = t.start
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new + line[col + len(old) :]
    return "".join(lines)


def _is_keyword(name: str) -> bool:
    import keyword

    return keyword.iskeyword(name) or keyword.issoftkeyword(name)


def swap_statements(source: str, rng: random.Random) -> str | None:
    """Swap two adjacent statements of one block (reorders calls)."""
    lines = source.splitlines(keepends=True)
    bodies = []
    for node in ast.walk(ast.parse(source)):
        for attr in ("body", "orelse", "finalbody"):
            block = getattr(node, attr, None)
            if (
                isinstance(block, list)
                and len(block) >= 2
                and all(isinstance(s, ast.stmt) for s in block)
            ):
                bodies.append(block)
    rng.shuffle(bodies)
    for block in bodies:
        i = rng.randrange(len(block) - 1)
        a, b = _whole_lines(lines, block[i]), _whole_lines(lines, block[i + 1])
        if a is None or b is None or a[1] > b[0]:
            continue
        return "".join(
            lines[: a[0]]
            + lines[b[0] : b[1]]
            + lines[a[1] : b[0]]
            + lines[a[0] : a[1]]
            + lines[b[1] :]
        )
    return None


def duplicate_statement(source: str, rng: random.Random) -> str | None:
    lines = source.splitlines(keepends=True)
    stmts = _statements(ast.parse(source))
    rng.shuffle(stmts)
    for node in stmts:
        span = _whole_lines(lines, node)
        if span is not None:
            start, end = span
            return "".join(lines[:end] + lines[start:end] + lines[end:])
    return None


MUTATIONS = (delete_statement, rename, swap_statements, duplicate_statement)


def mutate(source: str, rng: random.Random, steps: int | None = None) -> str:
    """Apply 1-3 random mutations; each result compiles (mutations that break it are retried)."""
    steps = steps or rng.randint(1, 3)
    for _ in range(steps):
        for _attempt in range(10):
            candidate = rng.choice(MUTATIONS)(source, rng)
            if candidate is not None and candidate != source and compiles(candidate):
                source = candidate
                break
    return source


def random_options(rng: random.Random) -> Options:
    return Options(
        amp=rng.choice(("auto", "bf16", "fp16", "none", "apex")),
        sync_bn=rng.random() < 0.5,
        shard_eval=rng.random() < 0.5,
        opt_level=rng.choice(("O0", "O1", "O2", "O3")),
    )
