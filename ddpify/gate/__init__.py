"""The invariant gate: after every concern has planned and the edits are applied, and before
anything is written, one check reads the converted program (not the planners' reasons) and
lets it through only if it meets the invariants of a correct DDP script. Each invariant is a
module of its own:

  sync       every stepped optimizer's parameters are in a module a DDP wrapper holds and runs
  shards     every loader that feeds a training step is sharded by rank
  writers    every file write happens on rank 0 or at a per-rank path (one writer)
  lifetime   set-up before and teardown after training, on each path the entry runs
  callers    a helper the conversion changed stays right for every caller
  modules    every module of the project the program imports was read (project mode)
  collectives  nothing every rank must reach together runs on rank 0 alone

A violation is a blocking finding that names the invariant and the line, so an unfamiliar shape
is refused instead of written out broken. What the source cannot show but the script can check
cheaply when it runs is checked there: the output's set-up compares every optimizer's gradients
across ranks at its first step (transforms/launch.py).
"""

from __future__ import annotations

import difflib

from ddpify.analysis.kernels import compiled_lines
from ddpify.directives import skipped_lines
from ddpify.findings import Finding
from ddpify.gate import callers, collectives, lifetime, shards, sync, writers
from ddpify.gate.common import Violation, read_hand_tests
from ddpify.gate.program import Program

__all__ = ["Violation", "check", "check_program"]


def check_program(
    output: str, path: str = "", notes: frozenset[str] | set[str] = frozenset()
) -> list[Violation]:
    """Every violation of the converted program `output` (a file, or a merged project)."""
    try:
        p = Program(output)
    except SyntaxError:
        return []  # the last checks (compile, DDP005) report an output that does not parse
    read_hand_tests(p)  # the program's own rank tests count as rank 0's
    out: list[Violation] = []
    out += sync.check(p, set(notes))
    out += shards.check(p)
    out += writers.check(p)
    out += lifetime.check(p, path)
    out += callers.check(p)
    out += collectives.check(p)
    return out


def check(
    source: str,
    output: str,
    path: str = "",
    notes: frozenset[str] | set[str] = frozenset(),
) -> list[Finding]:
    """The violations as blocking findings at the lines of `source` they come from."""
    violations = check_program(output, path, notes)
    if not violations:
        return []
    back = line_map(source, output)
    # `# ddpify: off`/`skip`: the user keeps those lines as they are; compiled code (a triton
    # kernel's tl.store) writes device memory, and no conversion touches it
    skipped = skipped_lines(source) | compiled_lines(source)
    found = []
    for v in violations:
        line = getattr(v.node, "lineno", 1)
        col = getattr(v.node, "col_offset", 0) + 1
        orig = back.get(line)
        if orig is None:
            col = 1
            orig = _nearest(back, line)
        if orig in skipped:
            continue
        found.append(
            Finding(
                orig,
                col,
                v.code,
                v.message + " (ddpify's own check of the converted program; "
                "convert this part by hand, or restructure it as the message says)",
                False,
                "blocking",
            )
        )
    return sorted(set(found))


def line_map(source: str, output: str) -> dict[int, int]:
    """Output line -> source line, for the lines the conversion kept."""
    a, b = source.splitlines(), output.splitlines()
    out: dict[int, int] = {}
    for block in difflib.SequenceMatcher(
        None, a, b, autojunk=False
    ).get_matching_blocks():
        for k in range(block.size):
            out[block.b + k + 1] = block.a + k + 1
    return out


def _nearest(back: dict[int, int], line: int) -> int:
    """The source line of the nearest kept line after `line` (an added line: where it goes)."""
    after = [k for k in back if k > line]
    if after:
        return back[min(after)]
    before = [k for k in back if k < line]
    return back[max(before)] if before else 1


def example_findings(d) -> list[str]:
    """What the gate reports on a rule's example (fixtures/rules/<CODE>/): a converted program
    `output.py` that breaks the invariant, or for the modules invariant a project `output/`, its
    entry (entry.txt) and the files a conversion read (read.txt)."""
    import os
    from pathlib import Path

    from ddpify.analysis.project import project_root
    from ddpify.gate import modules

    d = Path(d)
    if (d / "output.py").exists():
        found = check_program((d / "output.py").read_text(), str(d / "output.py"))
        return [
            f"output.py:{v.node.lineno}:{v.node.col_offset + 1}: {v.code} [blocking] {v.message}"
            for v in found
        ]
    entry = d / "output" / (d / "entry.txt").read_text().strip()
    read = {
        os.path.realpath(d / "output" / n): (d / "output" / n).read_text()
        for n in (d / "read.txt").read_text().split()
    }
    found = modules.check(str(entry), project_root(str(entry)), read)
    return [
        f"{os.path.relpath(p, d / 'output')}:{line}:{col}: DDP155 [blocking] {msg}"
        for p, line, col, msg in found
    ]
