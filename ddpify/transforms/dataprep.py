"""Data preparation before training (download, extract, tokenise, write an index): rank 0
prepares, every rank waits at a barrier, then every rank reads. What prepares data, by one rule:
a statement that downloads or extracts, an `if not os.path.exists(...)` block whose body writes
files, or a call of a function of the script whose body writes files (directly or through its
helpers), made once before training, whatever the function looks like inside (an early return
when its index exists, many files and then the index).

Where nothing the statement binds or changes is needed on the other ranks (its names are not
read later, it sets no global or attribute, it draws from no global random generator), rank 0
alone runs the whole statement and the barrier follows it, outside the guard, on every rank:

    if RANK == 0:
        prepare_data(root)
    dist.barrier()  # rank 0 prepares the data; the other ranks wait for it

(the writes inside the function are then left as they are: rank 0 alone runs them). Otherwise
every rank runs it, rank 0 first (its writes stay rank 0's, rank0.py), and the others find the
data in place:

    if RANK != 0:
        dist.barrier()  # rank 0 prepares the data first
    vocab = build_vocab(root)
    if RANK == 0:
        dist.barrier()  # the data is in place: the other ranks go on

Every rank calls barrier() once, so neither form hangs. A statement inside rank-0 code, in a
loop, in a Dataset's method, or that runs the model or a collective gets no barrier.
Rank0Transform reads `preparations()` before it guards single writes, so it neither guards the
writes of a function that rank 0 alone calls nor nests a guard in a statement guarded whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import ddpify.match as m

from ddpify.analysis import dotted
from ddpify.analysis.tree import _inside
from ddpify.analysis.writes import checks_existence
from ddpify.transforms.base import Context, Transform
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP073",
    "data-prep-rank0",
    "data prepared (downloaded, extracted, written) by rank 0 first; the other ranks wait at a barrier",
    fix=True,
    check="ranks",
)

# methods that change the object they are called on (a list, dict or set of the caller's)
MUTATORS = {
    "append",
    "extend",
    "insert",
    "update",
    "setdefault",
    "add",
    "pop",
    "popitem",
    "remove",
    "clear",
    "discard",
    "sort",
    "reverse",
}


@dataclass
class Prep:
    stmt: cst.CSTNode
    what: str  # "prepared", "downloaded", "extracted"
    whole: bool  # rank 0 alone runs the whole statement (nothing of it is needed elsewhere)


def preparations(ctx: Context) -> list[Prep]:
    """The statements that prepare data before training, outermost first, in program order."""
    cached = getattr(ctx, "_preparations", None)
    if cached is not None:
        return cached
    a = ctx.a
    eff = ctx.effects
    found: list[tuple[cst.CSTNode, str]] = []
    # `if not os.path.exists(p):` whose body prepares files (directly or through a helper)
    for if_ in a.ifs:
        if (
            checks_existence(if_.test)
            and not isinstance(a.parent.get(if_), cst.If)
            and eff.prepares(if_.body)
        ):
            _candidate(ctx, if_, found, "prepared")
    # a download (urlretrieve, download_url, Dataset(..., download=True)) or an extraction
    for call in a.calls:
        if eff.downloads(call) or _download_kwarg(call) or eff.extracts(call):
            _candidate(
                ctx,
                a.statement(call),
                found,
                "extracted" if eff.extracts(call) else "downloaded",
            )
    # a call of a function of the script that writes files, made once before training
    writing = eff.writing_functions()
    trains = a._functions_matching(_is_backward)
    for call in a.calls:
        name = (dotted(call.func) or "").rsplit(".", 1)[-1]
        if (
            name in writing
            and name not in trains
            and a._calls_function_in(call, writing)
        ):
            stmt = a.statement(call)
            if _once_before_training(a, stmt, trains):
                _candidate(ctx, stmt, found, "prepared")
    # the outermost preparation wins: one that a candidate's call reaches runs inside it; and a
    # function that synchronises itself already (a read-back barrier, checkpoints.py) is left
    # as it is: a guard around it would put that barrier behind a rank check
    reach = {id(stmt): _reached(a, stmt) for stmt, _ in found}
    found = [
        (stmt, what)
        for stmt, what in found
        if not any(
            o is not stmt and _in_functions(a, stmt, reach[id(o)]) for o, _ in found
        )
        and not any(
            _inside(a, b, stmt) or _in_functions(a, b, reach[id(stmt)])
            for b in ctx.barrier_stmts
        )
    ]
    found.sort(key=lambda f: a._order[id(f[0])])
    preps = [Prep(stmt, what, _whole(ctx, stmt)) for stmt, what in found]
    ctx._preparations = preps  # type: ignore[attr-defined]
    return preps


def rank0_alone(ctx: Context) -> tuple[list[cst.CSTNode], set[str]]:
    """(statements rank 0 alone runs whole, names of the script's functions that only they call):
    rank0.py guards neither the writes in those functions nor anything inside those statements."""
    a = ctx.a
    whole = [p.stmt for p in preparations(ctx) if p.whole]
    if not whole:
        return [], set()
    only: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, defs in a.functions.items():
            if name in only:
                continue
            calls = [
                c
                for c in a.calls
                if a._calls_function_in(c, {name})
                and (dotted(c.func) or "").rsplit(".", 1)[-1] == name
            ]
            if (
                calls
                and all(
                    any(_inside(a, c, w) for w in whole) or _in_functions(a, c, only)
                    for c in calls
                )
                and not a._passed_as_value(defs[0])
            ):
                only.add(name)
                changed = True
    return whole, only


def _reached(a, node: cst.CSTNode) -> set[str]:
    """Names of the script's functions that node calls, directly or through each other."""
    out: set[str] = set()
    work = [node]
    while work:
        for c in a.findall(work.pop(), m.Call()):
            name = (dotted(c.func) or "").rsplit(".", 1)[-1]
            if (
                name in a.functions
                and name not in out
                and a._calls_function_in(c, {name})
            ):
                out.add(name)
                work.extend(a.functions[name])
            elif name in a.classes and f"{name}.__init__" not in out:
                # Squares(root, download=True) runs Squares.__init__ (and what it calls on self)
                out.add(f"{name}.__init__")
                init = next(
                    (
                        f
                        for f in a.classes[name].body.body
                        if isinstance(f, cst.FunctionDef) and f.name.value == "__init__"
                    ),
                    None,
                )
                if init is not None:
                    work.append(init)
    return out


def _defs(a, name: str) -> list[cst.FunctionDef]:
    """The definitions `_reached` names: a function's, or a class's __init__ ("Squares.__init__")."""
    if name.endswith(".__init__") and name[: -len(".__init__")] in a.classes:
        body = a.classes[name[: -len(".__init__")]].body.body
        return [
            f
            for f in body
            if isinstance(f, cst.FunctionDef) and f.name.value == "__init__"
        ]
    return list(a.functions.get(name, ()))


def _in_functions(a, node: cst.CSTNode, names: set[str]) -> bool:
    fn = a.function_of(node)
    while fn is not None:
        cls = a.class_of(fn)
        if (
            fn.name.value in names
            and cls is None
            or cls is not None
            and f"{cls.name.value}.{fn.name.value}" in names
        ):
            return True
        fn = a.function_of(fn)
    return False


def _is_backward(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"


def _download_kwarg(call: cst.Call) -> bool:
    return any(
        x.keyword is not None
        and x.keyword.value == "download"
        and not m.matches(x.value, m.Name("False"))
        for x in call.args
    )


def _runs_training(a, node: cst.CSTNode, trains: set[str]) -> bool:
    return any(
        _is_backward(c) or a._calls_function_in(c, trains)
        for c in a.findall(node, m.Call())
    )


def _once_before_training(
    a, stmt: cst.CSTNode, trains: set[str], depth: int = 0
) -> bool:
    """stmt runs once (no loop around it, here or in its callers) and before any statement that
    trains (earlier in its blocks, or before the calls of its function). A caller's statement may
    train after the call (`Trainer(root).fit()`, `main()`): only what comes before it counts."""
    if depth > 4 or (depth == 0 and _runs_training(a, stmt, trains)):
        return False
    cur = stmt
    fn = a.function_of(stmt)
    while cur is not None and cur is not fn:
        block = a.parent.get(cur)
        if isinstance(cur, (cst.For, cst.While)) and cur is not stmt:
            return False
        if isinstance(block, (cst.IndentedBlock, cst.Module)) and cur in block.body:
            for earlier in block.body[: list(block.body).index(cur)]:
                if not isinstance(
                    earlier, (cst.FunctionDef, cst.ClassDef)
                ) and _runs_training(a, earlier, trains):
                    return False
        cur = a.parent.get(cur)
    if fn is None:
        return True
    callers = a.callers(fn)
    if not callers or a._passed_as_value(fn):
        return False
    return all(
        _once_before_training(a, a.statement(c), trains, depth + 1) for c in callers
    )


def _candidate(ctx: Context, stmt: cst.CSTNode, found: list, what: str) -> None:
    a = ctx.a
    if not ctx.editable(stmt):
        return
    # out of branches that ask the file system: each rank may answer differently
    while (
        (owner := a.branch_owner(stmt)) is not None
        and isinstance(owner, cst.If)
        and checks_existence(owner.test)
    ):
        stmt = owner
    if any(stmt is d or _inside(a, stmt, d) for d, _ in found):
        return
    if (
        not isinstance(a.block(stmt), (cst.IndentedBlock, cst.Module))
        or a.enclosing_loop(stmt) is not None
    ):
        return
    if a.runs_per_item(stmt, init_once=True):
        return  # per sample or in a worker process (a Dataset's item methods, Pool.map): no barrier there
    if a.runs_collective(stmt) or a.runs_model(stmt):
        return
    body = list(a.block(stmt).body)
    nxt = body[body.index(stmt) + 1] if body.index(stmt) + 1 < len(body) else None
    if nxt is not None and any(b is nxt for b in ctx.barrier_stmts):
        return  # a barrier right after it already (checkpoints.py: the file is read back there)
    found[:] = [(d, w) for d, w in found if not _inside(a, d, stmt)]
    found.append((stmt, what))


def _whole(ctx: Context, stmt: cst.CSTNode) -> bool:
    """Rank 0 alone may run stmt: no name it binds is read after it, and neither it nor the
    functions of the script it calls set a global, an attribute or an item of an object from
    outside, or draw from a global random generator (the ranks' generators would part)."""
    a = ctx.a
    if not isinstance(stmt, (cst.SimpleStatementLine, cst.If)):
        return False
    scopes: list[cst.CSTNode] = [
        stmt,
        *(f for name in _reached(a, stmt) for f in _defs(a, name)),
    ]
    bound = _bound_names(a, stmt)
    if bound and any(
        n.value in bound and not _inside(a, n, stmt)
        for n in a.findall(a.module, m.Name())
        if not isinstance(a.parent.get(n), cst.Attribute) or a.parent.get(n).value is n
    ):
        return False
    for scope in scopes:
        fn = scope if isinstance(scope, cst.FunctionDef) else None
        if a.findall(scope, m.Global() | m.Nonlocal()):
            return False
        if any(a.global_draw(c) for c in a.findall(scope, m.Call())):
            return False
        for t in _changed(a, scope):
            root = t
            while isinstance(root, (cst.Attribute, cst.Subscript, cst.Call)):
                root = root.func if isinstance(root, cst.Call) else root.value
            if (
                not isinstance(root, cst.Name)
                or fn is None
                or not _local(a, fn, root.value)
            ):
                return False
    return True


def _bound_names(a, stmt: cst.CSTNode) -> set[str]:
    out: set[str] = set()
    for node in a.findall(
        stmt,
        m.AssignTarget()
        | m.AnnAssign()
        | m.AugAssign()
        | m.For()
        | m.WithItem()
        | m.NamedExpr(),
    ):
        target = (
            node.asname.name
            if isinstance(node, cst.WithItem) and node.asname
            else getattr(node, "target", None)
        )
        if isinstance(node, cst.WithItem) and node.asname is None:
            continue
        for n in [target] + (a.findall(target, m.Name()) if target is not None else []):
            if isinstance(n, cst.Name) and not isinstance(
                a.parent.get(n), cst.Attribute
            ):
                out.add(n.value)
    return out


def _changed(a, scope: cst.CSTNode) -> list[cst.CSTNode]:
    """Targets of assignments into attributes and items, and receivers of mutating methods."""
    out: list[cst.CSTNode] = []
    for node in a.findall(scope, m.AssignTarget() | m.AnnAssign() | m.AugAssign()):
        t = node.target
        if isinstance(t, (cst.Attribute, cst.Subscript)):
            out.append(t)
        elif isinstance(t, (cst.Tuple, cst.List)):
            out.extend(
                e.value
                for e in t.elements
                if isinstance(e.value, (cst.Attribute, cst.Subscript))
            )
    for c in a.findall(scope, m.Call(func=m.Attribute())):
        if c.func.attr.value in MUTATORS:
            out.append(c.func.value)
    return out


def _local(a, fn: cst.FunctionDef, name: str) -> bool:
    """name is a local of fn made there (not a parameter: that is the caller's object)."""
    return (
        a._is_local(fn, name)
        and name
        not in {
            p.name.value
            for p in (
                *fn.params.params,
                *fn.params.kwonly_params,
                *fn.params.posonly_params,
            )
        }
        and name not in ("self", "cls")
    )


class DataPrepTransform(Transform):
    name = "dataprep"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        found = [p for p in preparations(ctx) if not self._rank0_only(ctx, p.stmt)]
        # statements next to each other in a block share one pair of barriers
        spans: list[list[Prep]] = []
        for p in found:
            prev = spans[-1][-1].stmt if spans else None
            body = list(a.block(p.stmt).body)
            k = body.index(p.stmt)
            if prev is not None and k > 0 and body[k - 1] is prev:
                spans[-1].append(p)
            else:
                spans.append([p])
        ctx.name("dist")  # the import, as before any barrier is planned
        for span in spans:
            first, last = span[0].stmt, span[-1].stmt
            if all(p.stmt in ctx.edits.guarded for p in span):
                # rank 0 alone runs them: the others only wait
                ctx.edits.after[last].append(
                    ctx.stmt(
                        ctx.barrier(
                            last,
                            "rank 0 prepares the data; the other ranks wait for it",
                        )
                    )
                )
            else:
                # some of them run on every rank (rank 0 first); rank 0 alone runs the others
                # first of what goes before it: a data set the sampler lifts out of the statement
                # (train_dataset = MNIST(..., download=True)) downloads after this barrier too
                ctx.edits.before[first].insert(
                    0,
                    ctx.stmt(
                        "if RANK != 0:\n"
                        + _indent(ctx.barrier(first, "rank 0 prepares the data first"))
                    ),
                )
                ctx.edits.after[last].append(
                    ctx.stmt(
                        "if RANK == 0:\n"
                        + _indent(
                            ctx.barrier(
                                last, "the data is in place: the other ranks go on"
                            )
                        )
                    )
                )
            ctx.barrier_stmts.extend(p.stmt for p in span)
            for p in span:
                if p.stmt in ctx.edits.guarded:
                    ctx.finding(
                        p.stmt,
                        "DDP073",
                        f"data {p.what} by rank 0 alone; every rank waits at a barrier after it, then reads it",
                        True,
                    )
                else:
                    ctx.finding(
                        p.stmt,
                        "DDP073",
                        f"data {p.what} by rank 0 first; the other ranks wait at a barrier, then find it in place",
                        True,
                    )

    @staticmethod
    def _rank0_only(ctx: Context, stmt: cst.CSTNode) -> bool:
        """stmt is in a statement guarded to rank 0, or in a function such a statement calls (the
        barriers go around stmt: a guard of stmt itself is inside them)."""
        a = ctx.a
        guarded = ctx.edits.guarded
        if any(_inside(a, stmt, g) for g in guarded):
            return True
        fn = a.function_of(stmt)
        if fn is None:
            return False
        return any(
            a._calls_function_in(c, {fn.name.value})
            for g in guarded
            for c in a.findall(g, m.Call())
        )


def _indent(text: str) -> str:
    return "".join("    " + ln + "\n" for ln in text.splitlines())
