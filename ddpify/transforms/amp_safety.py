"""What the generated autocast region must not break on GPUs (CPU runs have autocast off, so
none of this shows there): sparse tensors keep autocast out; so do losses on probabilities (the
ops autocast refuses on CUDA) unless --amp bf16/fp16 asks for it, and then those ops alone run
in float32 with autocast off; autocast ends before a tensor it produced is changed in place
(autocast casts copy or alias depending on dtypes, so such an op can modify a tensor autograd
saved: a GPU-only error)."""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import _flatten_targets, code, dotted
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP044",
    "amp-probability-loss",
    "loss on probabilities (binary_cross_entropy, BCELoss): no autocast for its step (bf16/fp16 round probabilities to 0 or 1); with --amp bf16/fp16 it runs in float32 with autocast off (in_float32); --amp apex O1 bans it (said, not changed)",
    fix=True,
    check="loss",
)

# The one table of ops autocast refuses on CUDA ("unsafe to autocast"): functions, and loss
# modules whose instances are called as functions. Both take probabilities: under bf16/fp16
# autocast those come rounded (a sigmoid's output becomes exactly 0 or 1 near the ends), which no
# later cast undoes, so a step with one of them gets no autocast unless the user asks for it.
# Never switch to the _with_logits form: it takes logits, not probabilities.
UNSAFE_FUNCTIONS = frozenset({"torch.nn.functional.binary_cross_entropy"})
UNSAFE_MODULES = frozenset({"torch.nn.BCELoss", "torch.nn.modules.loss.BCELoss"})
IN_FLOAT32 = (
    "in_float32"  # the generated helper (launch.py) that runs one op with autocast off
)

# Sparse tensors: autocast casts a sparse product's operands to bf16/fp16, which the sparse
# kernels lack on GPUs ("addmm_sparse_cuda" not implemented for 'BFloat16'). A sparse tensor is
# made in one place (a data-loading helper) and used in another (the model's forward, as `adj @ x`
# too): any of these in the program keeps mixed precision out.
SPARSE_FUNCTIONS = frozenset(
    {
        "torch.spmm",
        "torch.hspmm",
        "torch.smm",
        "torch.sspaddmm",
        "torch.sparse_coo_tensor",
        "torch.sparse_csr_tensor",
        "torch.sparse_csc_tensor",
        "torch.sparse_bsr_tensor",
        "torch.sparse_bsc_tensor",
        "torch.sparse_compressed_tensor",
    }
)
SPARSE_PREFIXES = (
    "torch.sparse.",
    "torch.cuda.sparse.",
)  # torch.sparse.mm, torch.sparse.FloatTensor
SPARSE_LAYOUTS = frozenset(
    {
        "torch.sparse_coo",
        "torch.sparse_csr",
        "torch.sparse_csc",
        "torch.sparse_bsr",
        "torch.sparse_bsc",
    }
)
SPARSE_METHODS = frozenset(
    {
        "to_sparse",
        "to_sparse_coo",
        "to_sparse_csr",
        "to_sparse_csc",
        "to_sparse_bsr",
        "to_sparse_bsc",
    }
)


def sparse_use(a, first: list[cst.CSTNode] = ()) -> tuple[cst.Call, str] | None:
    """A call that makes or multiplies a sparse tensor, with its name: in `first` (what the
    training step runs) if there is one, else the program's first."""
    calls = [c for node in first for c in a.findall(node, m.Call())]
    for call in calls + a.calls:
        for q in a.qualified(call.func):
            if q in SPARSE_FUNCTIONS or q.startswith(SPARSE_PREFIXES):
                return call, q
        if (
            isinstance(call.func, cst.Attribute)
            and call.func.attr.value in SPARSE_METHODS
        ):
            return call, f".{call.func.attr.value}()"
        for arg in call.args:
            if (
                arg.keyword is not None
                and arg.keyword.value == "layout"
                and a.qualified(arg.value) & SPARSE_LAYOUTS
            ):
                return call, f"layout={code(arg.value).strip()}"
    return None


def reachable(a, stmts: list[cst.BaseStatement]) -> list[cst.CSTNode]:
    """The statements, the functions of this file they call (transitively) and the models'
    forward methods: what runs inside an autocast region around stmts."""
    out: list[cst.CSTNode] = list(stmts)
    seen: set[int] = set()
    work: list[cst.CSTNode] = list(stmts) + list(a.functions.get("forward", []))
    while work:
        node = work.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, cst.FunctionDef):
            out.append(node)
        for c in a.findall(node, m.Call()):
            name = dotted(c.func)
            for fn in a.functions.get(name.rsplit(".", 1)[-1], []) if name else []:
                work.append(fn)
    return out


class UnsafeOps:
    """Calls of the table's ops, and of names bound to instances of its modules."""

    def __init__(self, a) -> None:
        self.a = a
        instances: dict[str, str] = {}
        for asg in a.assigns:
            value = getattr(asg, "value", None)
            if not isinstance(value, cst.Call):
                continue
            cls = next(
                (
                    q.rsplit(".", 1)[-1]
                    for q in a.qualified(value.func)
                    if q in UNSAFE_MODULES
                ),
                None,
            )
            if cls is None:
                continue
            targets = (
                [t.target for t in asg.targets]
                if isinstance(asg, cst.Assign)
                else [asg.target]
            )
            for t in targets:
                if dotted(t):
                    instances[dotted(t)] = cls
        self.instances = instances
        # criterion passed to train(model, loader, criterion): the parameter's name there
        self.bound = a._propagate(sorted(instances)) if instances else {}

    def name(self, call: cst.Call) -> str | None:
        """What to call the op in a finding, for a call the table covers."""
        a = self.a
        for q in a.qualified(call.func):
            if q in UNSAFE_FUNCTIONS:
                return code(call.func)
        if isinstance(call.func, cst.Call):  # nn.BCELoss()(p, y)
            for q in a.qualified(call.func.func):
                if q in UNSAFE_MODULES:
                    return code(call.func)
        name = dotted(call.func)
        if not name or not self.instances:
            return None
        fn = a.function_of(call)
        visible = self.bound.get(fn, set()) | self.bound.get(None, set())
        if name in visible:
            cls = self.instances.get(name) or next(iter(self.instances.values()))
            return f"{name} (nn.{cls})"
        return None

    def calls_in(self, nodes: list[cst.CSTNode]) -> list[tuple[cst.Call, str]]:
        out, seen = [], set()
        for node in nodes:
            for c in self.a.findall(node, m.Call()):
                if id(c) in seen:
                    continue
                seen.add(id(c))
                what = self.name(c)
                if what is not None:
                    out.append((c, what))
        return out


def unsafe_calls(ctx, region: list[cst.BaseStatement]) -> list[tuple[cst.Call, str]]:
    """(call, its name for a finding) for each unsafe op reached from region."""
    ops = getattr(ctx, "_unsafe_ops", None)
    if ops is None:
        ops = ctx._unsafe_ops = UnsafeOps(ctx.a)
    return ops.calls_in(reachable(ctx.a, region))


def plan_float32(ctx, found: list[tuple[cst.Call, str]], done: set[int]) -> None:
    """Each unsafe op becomes `in_float32(op)(...)`: its arguments are still computed where they
    stand, under autocast (a model called in them keeps it: with autocast off, its float32
    weights would meet the bf16 activations of the model before it), in the same order and in
    any kind of statement or expression; only the op runs in float32, with autocast off."""
    for call, what in found:
        if id(call) in done or not ctx.editable(ctx.a.statement(call)):
            continue
        done.add(id(call))
        ctx.edits.replace(
            call,
            lambda n: n.with_changes(
                func=cst.Call(func=cst.Name(IN_FLOAT32), args=[cst.Arg(n.func)])
            ),
        )
        ctx.helpers.add(IN_FLOAT32)
        amp = ctx.opts.amp
        ctx.finding(
            call,
            "DDP044",
            f"{what} is unsafe to autocast on GPUs: it runs in float32 with autocast off (in_float32), its arguments "
            f"under autocast; --amp {amp}: probabilities computed in {amp} round to exactly 0 or 1 near the ends, which can make "
            "this loss diverge (a model that returns logits, with nn.BCEWithLogitsLoss, is the safe form)",
            True,
        )


# in-place methods that do not change a tensor's values (or not one autograd tracks)
_NOT_INPLACE = {"requires_grad_", "share_memory_", "retain_grad_", "record_stream_"}
# calls giving a Python number, not a tensor: `n = x.size(0); n += 1` is no in-place op
_SCALARS = {"size", "item", "len", "int", "float", "numel", "dim", "tolist"}


def _assigned(a, stmt: cst.BaseStatement) -> dict[str, cst.BaseExpression]:
    """Plain names a statement binds, each with its value where it is a one-name assignment."""
    out: dict[str, cst.BaseExpression] = {}
    for node in a.findall(stmt, m.Assign()):
        for t in node.targets:
            if isinstance(t.target, cst.Name):
                out[t.target.value] = node.value
            for el in _flatten_targets(t.target):
                if isinstance(el, cst.Name):
                    out.setdefault(el.value, None)
    return out


def _tensor_value(value: cst.BaseExpression | None) -> bool:
    """False for a value that is plainly a Python number (x.size(0), loss.item(), len(x))."""
    if value is None:
        return True  # unpacked from a call (a model's outputs): tensors as a rule
    if isinstance(value, (cst.Integer, cst.Float)):
        return False
    if isinstance(value, cst.Call):
        name = dotted(value.func) or ""
        return name.rsplit(".", 1)[-1] not in _SCALARS
    return True


def inplace_targets(
    a, stmt: cst.BaseStatement, produced: dict[str, cst.BaseExpression | None]
) -> list[tuple[cst.CSTNode, str]]:
    """(op, name) for each in-place change, in stmt, of a tensor named in `produced`."""
    out = []
    for call in a.findall(stmt, m.Call(func=m.Attribute())):
        attr = call.func.attr.value
        if not attr.endswith("_") or attr.startswith("_") or attr in _NOT_INPLACE:
            continue
        root = call.func.value
        while isinstance(root, (cst.Attribute, cst.Subscript)):
            if isinstance(root, cst.Attribute) and root.attr.value == "data":
                break  # x.data.add_(): outside autograd
            root = root.value
        if isinstance(root, cst.Name) and root.value in produced:
            out.append((call, root.value))
    for aug in a.findall(stmt, m.AugAssign()):
        root = aug.target
        while isinstance(root, cst.Subscript):
            root = root.value
        if (
            isinstance(root, cst.Name)
            and root.value in produced
            and _tensor_value(produced[root.value])
        ):
            out.append((aug, root.value))
    return out


def _helper_inplace(a, stmt: cst.BaseStatement) -> tuple[cst.CSTNode, cst.Call] | None:
    """(in-place op, call) where stmt calls a function of this file (a loss written as a
    function, not the model) that changes a tensor in place: its arguments or its own values."""
    for call in a.findall(stmt, m.Call()):
        name = dotted(call.func)
        for fn in a.functions.get(name.rsplit(".", 1)[-1], []) if name else []:
            if fn.name.value == "forward" or fn.name.value in a.forward_functions:
                continue  # the model's own in-place ops (ReLU(inplace=True), x += residual) are its business
            own = {
                p.name.value: None
                for p in fn.params.params
                if p.name.value not in ("self", "cls")
            }
            own.update(_assigned(a, fn))
            found = inplace_targets(a, fn.body, own)
            if found:
                return found[0][0], call
    return None


def inplace_split(a, region: list[cst.BaseStatement]):
    """Where autocast must end: (index of the first region statement that changes in place a
    tensor the region computed, itself or in a function it calls; that op; earlier-computed
    names to continue in float32)."""
    produced: dict[str, cst.BaseExpression | None] = {}
    for k, stmt in enumerate(region):
        own = {**produced, **_assigned(a, stmt)}  # `out = model(x); out.clamp_(0, 1)`
        found = inplace_targets(a, stmt, own)
        helper = None if found else _helper_inplace(a, stmt)
        if found or helper:
            names: list[str] = []
            if helper is not None:  # the tensors handed to the function go in float32
                for arg in helper[1].args:
                    n = arg.value.value if isinstance(arg.value, cst.Name) else None
                    if (
                        n in produced
                        and produced[n] is not None
                        and _tensor_value(produced[n])
                    ):
                        names.append(n)
            for later in region[k:]:
                for _, name in inplace_targets(a, later, produced):
                    if name not in names:
                        names.append(name)
            return k, (found[0][0] if found else helper[0]), names
        produced.update(_assigned(a, stmt))
    return None
