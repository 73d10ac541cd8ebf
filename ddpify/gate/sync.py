"""sync: every optimizer that steps has its parameters inside a module that a DDP wrapper holds,
and that wrapper runs. Models are what optimizers step, however they were built or passed around:
the parameters each optimizer takes are followed to the object that owns them (a constructor
call, through factories, tuples, attributes and placement calls) and compared with what each
DistributedDataParallel(...) call holds. What the source cannot show (a model from a library
call, a parameter nobody passes) is checked when the script runs: the output's set-up compares
each optimizer's gradients across ranks at its first step (ddpify/transforms/launch.py)."""

from __future__ import annotations

import ast

from ddpify.gate.common import Violation
from ddpify.gate.program import Origin, Program
from ddpify.rules import declare

declare(
    "DDP150",
    "invariant-sync",
    "the output would step an optimizer whose parameters no DistributedDataParallel wrapper "
    "synchronises (a training forward that bypasses DDP): not converted",
    severity="blocking",
    tool="gate",
)

DDP_CLASSES = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "apex.parallel.DistributedDataParallel",
    "torch.nn.parallel.DDP",
)
SHARDED = (
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_shard",
)
IN_PLACE = ("torch.distributed._composable.replicate",)
PARAM_METHODS = ("parameters", "named_parameters")


def is_ddp(p: Program, call: ast.Call) -> bool:
    """A DDP wrapper, FSDP, torch's in-place `replicate`, or a function of the program that
    applies `replicate` to the module it is handed (ddpify's ddp_in_place)."""
    name = p.call_name(call)
    return (
        name in DDP_CLASSES
        or name.startswith(SHARDED + IN_PLACE)
        or name.endswith(".DistributedDataParallel")
        or any(
            p.last(c) == "replicate"
            for fn in p.callees(call)
            for c in ast.walk(fn)
            if isinstance(c, ast.Call)
        )
    )


def optimizer_roots(p: Program, call: ast.Call, depth: int = 0) -> list[ast.AST] | None:
    """The modules whose parameters the call takes (`model.backbone` for
    model.backbone.parameters()); None when it takes none (not an optimizer)."""
    roots: list[ast.AST] = []
    seen: set[int] = set()
    work: list[ast.AST] = list(call.args) + [k.value for k in call.keywords]
    while work and len(seen) < 64:
        node = work.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        found, more = _reads(p, node, depth)
        roots += found
        work += more
    return roots if roots else None


def _reaching_parameters(p: Program) -> set[int]:
    """The expressions (by id) from which following _reads, without optimizer_roots' limit,
    meets a .parameters() call: only a call handed one of them may take parameters."""
    succ: dict[int, list[ast.AST]] = {}
    found: list[int] = []
    work: list[ast.AST] = [
        a for c in p.calls for a in list(c.args) + [k.value for k in c.keywords]
    ]
    while work:
        node = work.pop()
        if id(node) in succ:
            continue
        roots, more = _reads(p, node, 0)
        succ[id(node)] = more
        if roots:
            found.append(id(node))
        work += more
    pred: dict[int, list[int]] = {}
    for a, ms in succ.items():
        for b in ms:
            pred.setdefault(id(b), []).append(a)
    reach = set(found)
    while found:
        for a in pred.get(found.pop(), ()):
            if a not in reach:
                reach.add(a)
                found.append(a)
    return reach


def _reads(p: Program, node: ast.AST, depth: int) -> tuple[list, list]:
    """What one expression of an optimizer's arguments gives: the modules of its
    .parameters() calls, and the expressions to follow from it (what its names hold, what
    the helpers it calls return), in the order a walk of it meets them; made once a node."""
    key = ("reads", id(node), depth < 2)
    got = p._memo.get(key)
    if got is not None:
        return got  # type: ignore[return-value]
    roots: list[ast.AST] = []
    more: list[ast.AST] = []
    for sub in p.walk(node):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr in PARAM_METHODS
        ):
            roots.append(sub.func.value)
        elif isinstance(sub, ast.Call) and depth < 2 and p.callees(sub):
            # a helper that returns parameters: trainable(model), self.params()
            for fn in p.callees(sub):
                more += [r.value for r in p.returns(fn)]  # type: ignore[misc]
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
            for o in p.origins(sub):
                if o.node is not sub and isinstance(o.node, ast.AST):
                    more.append(o.node)
    p._memo[key] = (roots, more)
    return roots, more


def optimizers(p: Program) -> dict[int, tuple[ast.Call, list[ast.AST]]]:
    """Calls that build an optimizer (they take module parameters and something steps what they
    build), by id: (call, parameter roots)."""
    out: dict[int, tuple[ast.Call, list[ast.AST]]] = {}
    if not any(p.calls_named(m) for m in PARAM_METHODS):
        return out  # nothing takes a module's parameters
    reach = _reaching_parameters(p)
    for call in p.calls:
        args = list(call.args) + [k.value for k in call.keywords]
        if not any(id(a) in reach for a in args):
            continue  # no .parameters() call however far its arguments are followed
        name = p.call_name(call)
        if "lr_scheduler" in name or p.last(call) in PARAM_METHODS or is_ddp(p, call):
            continue
        roots = optimizer_roots(p, call)
        if roots is not None:
            out[id(call)] = (call, roots)
    return out


def stepped(
    p: Program, opts: dict[int, tuple[ast.Call, list[ast.AST]]]
) -> dict[int, ast.Call]:
    """Optimizer constructions something steps: opt.step(), scaler.step(opt)."""
    out: dict[int, ast.Call] = {}
    for call in p.calls:
        if not isinstance(call.func, ast.Attribute) or call.func.attr != "step":
            continue
        for target in [call.func.value] + list(call.args[:1]):
            for o in p.origins(target):
                if id(o.node) in opts and not o.path:
                    out[id(o.node)] = call
    return out


def held(p: Program, call: ast.Call) -> list[Origin]:
    """What a DDP(...) call holds: its module (a module made distributed in place: itself)."""
    arg = (
        call.args[0]
        if call.args
        else next((k.value for k in call.keywords if k.arg == "module"), None)
    )
    if arg is None:
        return []
    return expand(p, p.origins(arg))


def expand(p: Program, origins: list[Origin], depth: int = 0) -> list[Origin]:
    """Origins and what they were made from: a call handed a module holds its parameters
    (torch.compile(model), amp.initialize(model, opt), nn.Sequential(a, b))."""
    out = list(origins)
    if depth > 3:
        return out
    for o in origins:
        if isinstance(o.node, ast.Call) and not o.path:
            for a in o.node.args:
                if not isinstance(a, ast.Constant):
                    out += expand(p, p.origins(a), depth + 1)
    return out


def covered(
    root: list[Origin], wrapped: list[Origin], made_from: list[Origin] = ()
) -> bool | None:
    """True: some wrapper holds the owner (or a module above it); False: every owner is known
    and none is held; None: an owner the source does not show."""
    known = [o for o in root if isinstance(o.node, ast.Call)]
    if any(
        w.node is o.node and o.path[: len(w.path)] == w.path
        for o in list(root) + list(made_from)
        for w in wrapped
    ):
        return True
    if not known or len(known) != len(root):
        return None
    return False


def check(p: Program, notes: set[str]) -> list[Violation]:
    opts = optimizers(p)
    steps = stepped(p, opts)
    if not steps:
        return []
    ddp_calls = [c for c in p.calls if is_ddp(p, c)]
    manual = any(
        p.last(c) == "all_reduce" and ".grad" in ast.unparse(c) for c in p.calls
    )
    out: list[Violation] = []
    if not ddp_calls and not manual:
        first = min(steps.values(), key=lambda c: (c.lineno, c.col_offset))
        return [
            Violation(
                first,
                "DDP150",
                "sync: this optimizer step would update parameters that no "
                "DistributedDataParallel wrapper synchronises (the output wraps no model), so each rank "
                "would train its own copy",
            )
        ]
    wrapped = [o for c in ddp_calls for o in held(p, c)]
    for key, step in steps.items():
        call, roots = opts[key]
        verdicts = [
            covered(p.origins(r), wrapped, expand(p, p.origins(r))) for r in roots
        ]
        if verdicts and all(v is False for v in verdicts):
            names = ", ".join(sorted({ast.unparse(r) for r in roots}))
            out.append(
                Violation(
                    step,
                    "DDP150",
                    f"sync: the optimizer built at line {call.lineno} steps the parameters "
                    f"of {names}, which no DistributedDataParallel wrapper holds, so each rank would train "
                    "its own copy",
                )
            )
    for c in ddp_calls:
        par = p.parent.get(c)
        if isinstance(par, ast.Assign) and len(par.targets) == 1:
            target = ast.unparse(par.targets[0])
            attr = target.split(".", 1)[1] if target.startswith("self.") else None
            tail = target.rsplit(".", 1)[-1]
            # self.ddp_net is also read as trainer.ddp_net outside the class
            uses = (
                p.reads(target)
                or (p.attribute_reads(attr) if attr is not None else [])
                # the text of an attribute ends with its name: unparse only those
                or [n for n in p.attribute_reads(tail) if p.unparse(n) == target]
            )
            if not uses:
                out.append(
                    Violation(
                        c,
                        "DDP150",
                        f"sync: the wrapper `{target}` is built but never run, so no "
                        "training forward goes through DistributedDataParallel",
                    )
                )
    return out
