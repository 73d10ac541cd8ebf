"""shards: every loader that feeds a training step is sharded by rank. The loops around each
backward (in its function and, through the callers, around the calls that lead to it) and the
`next(...)` draws near it are followed to the DataLoader calls that build what they iterate,
through names, attributes, tuples, dicts, helpers that return loaders, wrappers such as
enumerate/tqdm/zip and generators such as cycle(loader). A DataLoader found there must take a
sampler or batch sampler that splits the data by rank, or a data set that does; a loop over
something that is not followed is left to the planners (the loaders they shard, verify at run
time)."""

from __future__ import annotations

import ast

from ddpify.gate.common import DISTRIBUTED_SAMPLERS, Violation, mentions
from ddpify.gate.program import Program
from ddpify.rules import declare

declare(
    "DDP151",
    "invariant-shards",
    "the output would feed a training step from a loader that is not sharded by "
    "rank (every rank would train on all of the data): not converted",
    severity="blocking",
    tool="gate",
)


def is_loader(p: Program, call: ast.Call) -> bool:
    name = p.call_name(call)
    if name.endswith("DataLoader"):
        return True
    for cls in p.classes.get(p.last(call), []):
        if any(p.qualname(b).endswith("DataLoader") for b in cls.bases):
            return True
    return False


def sharded(p: Program, call: ast.Call) -> bool:
    """The loader splits its data by rank: a distributed sampler (or one that draws a per-rank
    share: num_samples // WORLD_SIZE with a per-rank generator), or a data set that shards."""
    ranks = {"RANK", "WORLD_SIZE", "DDP_RANK", "DDP_WORLD_SIZE"}
    samplers = [
        k.value for k in call.keywords if k.arg in ("sampler", "batch_sampler")
    ] + call.args[3:5]
    datasets = [k.value for k in call.keywords if k.arg == "dataset"] + call.args[:1]
    for part in (
        samplers + datasets + p.classes.get(p.last(call), [])
    ):  # a subclass passes a sampler up
        texts = [part] + [
            o.node
            for sub in ast.walk(part)
            if isinstance(sub, ast.Name)
            for o in p.origins(sub)
            if o.node is not sub
        ]
        for t in texts:
            if (
                DISTRIBUTED_SAMPLERS.search(p.unparse(t))
                or part in samplers
                and mentions(t, ranks)
            ):
                return True
    return False


def sources(
    p: Program, expr: ast.AST, depth: int = 0, seen: set | None = None
) -> list[ast.Call]:
    """The DataLoader calls an iterated expression reaches."""
    seen = set() if seen is None else seen
    if depth > 6 or id(expr) in seen:
        return []
    seen.add(id(expr))
    out: list[ast.Call] = []
    for o in p.origins(expr):
        node = o.node
        if o.path:
            continue
        if isinstance(node, ast.Call):
            if is_loader(p, node):
                out.append(node)
                continue
            fns = p.callees(node)
            if fns:  # cycle(loader), a generator over its argument: what it is handed
                for fn in fns:
                    if p.yields(fn):
                        out += [
                            s for a in node.args for s in sources(p, a, depth + 1, seen)
                        ]
                continue
            if p.last(node) in p.classes:
                continue  # the script's own batch iterator class: not a DataLoader
            # enumerate(loader), tqdm(loader), zip(a, b), iter(loader), itertools.cycle(loader)
            out += [s for a in node.args for s in sources(p, a, depth + 1, seen)]
        elif isinstance(node, ast.Subscript):
            out += [
                s
                for v in _all_values(p, node.value)
                for s in sources(p, v, depth + 1, seen)
            ]
        elif isinstance(node, (ast.Dict, ast.List, ast.Tuple)) and depth > 0:
            values = node.values if isinstance(node, ast.Dict) else node.elts
            out += [s for v in values for s in sources(p, v, depth + 1, seen)]
    return out


def _all_values(p: Program, expr: ast.AST) -> list[ast.AST]:
    """loaders[phase] with a key that is not a literal: every value the dict may hold."""
    out = []
    for o in p.origins(expr):
        if isinstance(o.node, ast.Dict):
            out += o.node.values
        elif isinstance(o.node, ast.DictComp):
            out.append(o.node.value)
    return out


def training_loops(p: Program) -> list[tuple[ast.AST, ast.AST]]:
    """(what is iterated or drawn from, the backward it feeds) around every backward."""
    out: list[tuple[ast.AST, ast.AST]] = []
    for bw in p.backwards():
        work = [(bw, 0)]
        seen: set[int] = set()
        while work:
            node, depth = work.pop()
            if id(node) in seen or depth > 3:
                continue
            seen.add(id(node))
            fn = p.function_of(node)
            for anc in p.ancestors(node):
                if isinstance(anc, (ast.For, ast.AsyncFor)):
                    out.append((anc.iter, bw))
                if anc is fn:
                    break
            region = fn if fn is not None else p.tree
            for sub in p.calls_in(region):
                if (
                    isinstance(sub.func, ast.Name)
                    and sub.func.id == "next"
                    and sub.args
                ):
                    if _same_loop(p, sub, node) and _feeds(p, sub, node):
                        out.append((sub.args[0], bw))
            if fn is not None:
                work += [(c, depth + 1) for c in p.callers(fn)]
    return out


def _feeds(p: Program, draw: ast.AST, target: ast.AST) -> bool:
    """The draw's statement is in a block that also holds the training step (not a peek at a
    validation batch in a branch of its own)."""
    stmt = p.statement(draw)
    par = p.parent.get(stmt)
    for field in ("body", "orelse", "finalbody"):
        block = getattr(par, field, None)
        if isinstance(block, list) and stmt in block:
            return any(p.inside(target, s) for s in block)
    return True


def _same_loop(p: Program, a: ast.AST, b: ast.AST) -> bool:
    loops_a = [x for x in p.ancestors(a) if isinstance(x, (ast.For, ast.While))]
    return bool(loops_a) and any(p.inside(b, x) for x in loops_a)


def check(p: Program) -> list[Violation]:
    out: list[Violation] = []
    done: set[int] = set()
    for expr, bw in training_loops(p):
        if DISTRIBUTED_SAMPLERS.search(ast.unparse(expr)):
            continue
        for loader in sources(p, expr):
            if id(loader) in done or sharded(p, loader):
                continue
            done.add(id(loader))
            out.append(
                Violation(
                    loader,
                    "DDP151",
                    f"shards: this loader feeds the training step whose backward is at "
                    f"line {bw.lineno}, and it is not sharded by rank (no DistributedSampler), so every "
                    "rank would train on all of the data",
                )
            )
    return out
