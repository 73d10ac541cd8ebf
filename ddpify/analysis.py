"""Shared analysis of a training script, computed once with LibCST metadata.

It answers the questions every concern asks: which names are the models, optimizers,
schedulers and loaders; where the training step (forward, loss, backward, step) is; which
loop is the epoch loop; which functions run the model or a collective; where the entry
point is. Concerns read it and plan edits; none of them walks the tree for these facts again.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from contextlib import nullcontext
from dataclasses import dataclass, field, fields
from itertools import accumulate
from typing import get_args

import libcst as cst
import ddpify.match as m
from libcst._nodes.internal import CodegenState
from libcst._position import CodePosition, CodeRange

# nodes that open a scope of their own (class bodies are handled apart: not seen from methods)
SCOPES = (cst.FunctionDef, cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
SKIP_RE = re.compile(r"#\s*ddpify:\s*skip\b")
OFF_RE = re.compile(r"#\s*ddpify:\s*off\b")
ON_RE = re.compile(r"#\s*ddpify:\s*on\b")

DISTRIBUTED_APIS = (
    "torch.distributed.init_process_group",
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.multiprocessing.spawn",
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_shard",
    "accelerate.Accelerator",
    "lightning.Trainer",
    "lightning.pytorch.Trainer",
    "pytorch_lightning.Trainer",
    "deepspeed.initialize",
    "horovod.torch.init",
)
LEGACY_APIS = ("apex.amp", "apex.parallel", "apex.optimizers")
LOADER_NAMES = ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")
OPTIM_PREFIXES = ("torch.optim.", "apex.optimizers.", "bitsandbytes.optim.", "timm.optim.", "transformers.")
SCHED_RE = re.compile(r"(lr_scheduler|Scheduler|_schedule_with_warmup|LR$|Annealing|OneCycle|StepLR)")
OPTIM_RE = re.compile(r"(Adam|SGD|RMSprop|Adagrad|Adadelta|Adamax|LBFGS|Lion|Lamb|LAMB|Adafactor|NAdam|RAdam|Optimizer|Muon)")
EVAL_RE = re.compile(r"(val|valid|test|eval|dev|holdout)", re.I)
TRAIN_RE = re.compile(r"train", re.I)


# -- walking the tree without LibCST's visit ----------------------------------------------
_SCOPE_TYPES = frozenset((*SCOPES, cst.ClassDef))
_MODULE_ONLY = {None}
_MODULE_CHAIN: list[int | None] = [None]
# node type -> (fields LibCST's visit walks, in its order; fields it may skip by value)
_FIELDS: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}


class _FieldProbe(cst.CSTVisitor):
    """Names the fields a node's _visit_and_replace_children walks, without descending."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        return False

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        self.names.append(attribute)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave(self, original_node: cst.CSTNode) -> None:
        pass


def _holds_nodes(v: object) -> bool:
    return isinstance(v, cst.CSTNode) or (isinstance(v, (list, tuple)) and any(isinstance(x, cst.CSTNode) for x in v))


def child_fields(node: cst.CSTNode) -> tuple[str, ...]:
    """The child fields of node in LibCST's visiting (= source) order; dataclass field order is
    not it (a FunctionDef's decorators come last there). Probed on the first node of a type;
    again on a node whose value in a field the probe did not see holds nodes (LibCST skips an
    f-string's format_spec when it is None)."""
    t = type(node)
    entry = _FIELDS.get(t)
    if entry is not None and (not entry[1] or not any(_holds_nodes(getattr(node, f)) for f in entry[1])):
        return entry[0]
    probe = _FieldProbe()
    node._visit_and_replace_children(probe)
    names = tuple(probe.names)
    if entry is None:
        # fields typed to hold nodes (not str, bool, ...) that this node's visit skipped
        unseen = tuple(f.name for f in fields(t) if f.name not in names and (isinstance(f.type, str) or "libcst" in repr(f.type).replace("libcst._maybe_sentinel", "")))
        _FIELDS[t] = (names, unseen)
    return names


# whitespace and comments: half the nodes of a tree, and nothing the analysis looks at
_WHITESPACE = (cst.BaseParenthesizableWhitespace, cst.TrailingWhitespace, cst.Newline, cst.EmptyLine, cst.Comment)
_WALK: dict[tuple[type, tuple[str, ...]], tuple[str, ...]] = {}  # (type, child fields) -> those to walk


def _whitespace_only(tp: object) -> bool:
    """A field annotation that admits whitespace (or no node) only."""
    args = get_args(tp)
    if args:
        return all(_whitespace_only(a) for a in args)
    return tp is type(None) or tp is cst.MaybeSentinel or (isinstance(tp, type) and issubclass(tp, _WHITESPACE))


def _walk_fields(node: cst.CSTNode) -> tuple[str, ...]:
    """child_fields(node) less those typed to hold whitespace only."""
    t = type(node)
    names = child_fields(node)
    walk = _WALK.get((t, names))
    if walk is None:
        ws = frozenset(f.name for f in fields(t) if _whitespace_only(f.type))
        walk = _WALK[(t, names)] = tuple(name for name in names if name not in ws)
    return walk


_LEAF: dict[tuple[type, ...], bool] = {}


def _leaf_types(types: tuple[type, ...]) -> bool:
    """True when no type has subclasses: isinstance is then type(x) in types."""
    leaf = _LEAF.get(types)
    if leaf is None:
        leaf = _LEAF[types] = not any(t.__subclasses__() for t in types)
    return leaf


# -- positions ------------------------------------------------------------------------------
class _Stop(Exception):
    """Ends a partial codegen."""


class _Recorder(CodegenState):
    """Codegen that notes, per node, the token indices where LibCST's PositionProvider puts its
    start and end (the syntactic range where the node records one, else the whitespace-inclusive
    one). It can stop early: at the first indented block (a statement's header gives its start),
    or once a given node is complete. Keyed by id(): a node's __hash__ is a Python call."""

    __slots__ = ("ws_start", "done", "syn_start", "syn_end", "open", "header_only", "stop_after", "stopped")

    def __init__(self, module: cst.Module, indents: list[str], header_only: bool = False,
                 stop_after: cst.CSTNode | None = None) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline, indent_tokens=indents)
        self.ws_start: dict[int, int] = {}
        self.done: dict[int, int] = {}  # complete nodes: whitespace-inclusive end
        self.syn_start: dict[int, int] = {}
        self.syn_end: dict[int, int] = {}
        self.open: list[tuple[int, cst.CSTNode | None, cst.CSTNode | None]] = []  # entered syntactic records
        self.header_only = header_only
        self.stop_after = stop_after
        self.stopped = False

    def before_codegen(self, node: cst.CSTNode) -> None:
        if self.stopped:
            return
        if self.header_only and type(node) is cst.IndentedBlock:
            self.stopped = True
            raise _Stop
        self.ws_start[id(node)] = len(self.tokens)

    def after_codegen(self, node: cst.CSTNode) -> None:
        if self.stopped:
            return
        self.done[id(node)] = len(self.tokens)
        if node is self.stop_after:
            self.stopped = True
            raise _Stop

    def record_syntactic_position(self, node, *, start_node=None, end_node=None):  # type: ignore[override]
        # the recorder is its own context (cheaper than a contextlib generator per node)
        if start_node is None and not self.stopped:
            self.syn_start[id(node)] = len(self.tokens)
        self.open.append((id(node), start_node, end_node))
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> None:
        key, start_node, end_node = self.open.pop()
        if exc_type is None and not self.stopped:  # (a stop unwinding through here records nothing)
            if start_node is not None:
                self.syn_start[key] = self.start_of(id(start_node))  # type: ignore[assignment]
            self.syn_end[key] = self.end_of(id(end_node)) if end_node is not None else len(self.tokens)  # type: ignore[assignment]

    def pop_trailing_newline(self) -> None:
        pass  # PositionProvider counts it: recorded indices stay valid

    def start_of(self, key: int) -> int | None:
        k = self.syn_start.get(key)
        return self.ws_start[key] if k is None and key in self.done else k

    def end_of(self, key: int) -> int | None:
        k = self.syn_end.get(key)
        return self.done.get(key) if k is None else k


class _Plain(CodegenState):
    """CodegenState without the contextlib generator LibCST enters for most nodes to record
    positions nobody asks for here (the text is the same)."""

    __slots__ = ()

    def record_syntactic_position(self, node, *, start_node=None, end_node=None):  # type: ignore[override]
        return _NO_RECORD


_NO_RECORD = nullcontext()


def codegen(node: cst.CSTNode, module: cst.Module | None = None) -> str:
    """module.code_for_node(node), by default cst.Module(body=[])'s; codegen(m, m) is m.code."""
    if module is None:
        st = _Plain(default_indent="    ", default_newline="\n")
    else:
        st = _Plain(default_indent=module.default_indent, default_newline=module.default_newline)
    node._codegen(st)
    return "".join(st.tokens)


_NEWLINE_RE = re.compile(r"\r\n?|\n")
# what LibCST's codegen may not give back as it was parsed: a form feed or a lone "\" at a line
# start, a BOM; and "\r", where positions are counted token by token
_NOT_ROUND_TRIP = re.compile(r"[\r\x0c\ufeff]|^[ \t]*\\", re.M)


class _Positions:
    """node -> CodeRange, the same as LibCST's PositionProvider gives, computed on demand (a
    file needs a few dozen, not a second codegen of everything): the statement that holds the
    node is generated alone (its header alone where a start will do) and found in the source by
    its text; where that text is not unique, the statement around it is; the whole module as the
    last resort (and where the source has "\r": LibCST counts lines token by token)."""

    def __init__(self, module: cst.Module, source: str, parent: dict[cst.CSTNode, cst.CSTNode]) -> None:
        self.module = module
        self.source = source
        self.parent = parent
        self.starts: dict[int, int] = {}  # id(node) -> offset into the source
        self.ends: dict[int, int] = {}
        self.whole = False
        self.newlines: list[int] | None = None
        self.exact: dict[int, tuple[int, int]] | None = None  # offset -> (line, column), "\r" files

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        key = id(node)
        if key not in self.ends or key not in self.starts:
            self._find(node, need_end=True)
        return CodeRange(self._at(self.starts[key]), self._at(self.ends[key]))

    def start(self, node: cst.CSTNode) -> CodePosition:
        key = id(node)
        if key not in self.starts:
            self._find(node, need_end=False)
        return self._at(self.starts[key])

    def _find(self, node: cst.CSTNode, need_end: bool) -> None:
        if self.whole:
            return
        stmt = self._statement(node)
        key = id(node)
        if stmt is not None and "\r" not in self.source:
            if not need_end and self._run(stmt, header_only=True) and key in self.starts:
                return
            if self._run(stmt) and key in self.starts and (not need_end or key in self.ends):
                return
        self._run_whole()

    def _statement(self, node: cst.CSTNode | None) -> cst.BaseStatement | None:
        """The statement of a block (or of the module) that holds node."""
        parent = self.parent
        cur = node
        while cur is not None:
            par = parent.get(cur)
            if par is None:
                return None
            if type(par) is cst.IndentedBlock or type(par) is cst.Module:
                return cur if isinstance(cur, cst.BaseStatement) else None
            cur = par
        return None

    def _indents(self, stmt: cst.CSTNode) -> list[str]:
        """The indentation codegen has reached at stmt: one entry per block (and match) around it."""
        out: list[str] = []
        default = self.module.default_indent
        child, cur = stmt, self.parent.get(stmt)
        while cur is not None:
            if type(cur) is cst.IndentedBlock or (type(cur) is cst.Match and type(child) is cst.MatchCase):
                out.append(default if cur.indent is None else cur.indent)  # type: ignore[union-attr]
            child, cur = cur, self.parent.get(cur)
        out.reverse()
        return out

    def _run(self, stmt: cst.BaseStatement, header_only: bool = False) -> bool:
        """Generate stmt alone and find it in the source; climb to the enclosing statement (up to
        the end of stmt) while its text is not unique there. False: not found below the module."""
        target: cst.BaseStatement | None = stmt
        stop_after = None
        while target is not None:
            rec = _Recorder(self.module, self._indents(target), header_only and stop_after is None, stop_after)
            try:
                target._codegen(rec)
            except _Stop:
                pass
            at = self._place(self.source, "".join(rec.tokens))
            if at >= 0:
                self._commit(rec, list(accumulate(map(len, rec.tokens), initial=at)))
                return True
            target, stop_after = self._statement(self.parent.get(target)), stmt
        return False

    @staticmethod
    def _place(source: str, text: str) -> int:
        """Where text occurs in source at the start of a line (a statement of a block starts
        one), if there alone; else -1: it is there, so a single place is its place."""
        found = -1
        at = source.find(text)
        while at >= 0:
            if at == 0 or source[at - 1] == "\n":
                if found >= 0:
                    return -1
                found = at
            at = source.find(text, at + 1)
        return found

    def _commit(self, rec: _Recorder, offsets: list[int]) -> None:
        # what _Recorder.start_of / end_of give, for every node at once
        done = rec.done
        starts, ends = self.starts, self.ends
        starts.update({key: offsets[k] for key, k in rec.ws_start.items() if key in done})
        starts.update({key: offsets[k] for key, k in rec.syn_start.items()})
        ends.update({key: offsets[k] for key, k in done.items()})
        ends.update({key: offsets[k] for key, k in rec.syn_end.items()})

    def _run_whole(self) -> None:
        rec = _Recorder(self.module, [])
        self.module._codegen(rec)
        offsets = list(accumulate(map(len, rec.tokens), initial=0))
        self._commit(rec, offsets)
        text = "".join(rec.tokens)
        if "\r" in text:
            line, col, exact = 1, 0, {0: (1, 0)}
            for tok, off in zip(rec.tokens, offsets[1:]):
                parts = _NEWLINE_RE.split(tok)
                if len(parts) == 1:
                    col += len(tok)
                else:
                    line, col = line + len(parts) - 1, len(parts[-1])
                exact[off] = (line, col)
            self.exact = exact
        else:
            self.newlines = [mt.start() for mt in re.finditer("\n", text)]  # the source's, and a final one it may lack
        self.whole = True

    def _at(self, off: int) -> CodePosition:
        if self.exact is not None:
            return CodePosition(*self.exact[off])
        nl = self.newlines
        if nl is None:
            nl = self.newlines = [mt.start() for mt in re.finditer("\n", self.source)]
        before = bisect_left(nl, off)  # newlines before off
        return CodePosition(before + 1, off - (nl[before - 1] + 1 if before else 0))


def dotted(node: cst.CSTNode | None) -> str | None:
    """`self.model` -> "self.model"; None for anything but Name/Attribute chains."""
    t = type(node)  # exact types first: isinstance on LibCST's ABCs is slow, and this is hot
    if t is cst.Name or (t is not cst.Attribute and isinstance(node, cst.Name)):
        return node.value  # type: ignore[union-attr]
    if t is cst.Attribute or isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def code(node: cst.CSTNode) -> str:
    return codegen(node)


def call_args(call: cst.Call) -> tuple[list[cst.Arg], dict[str, cst.Arg]]:
    pos = [a for a in call.args if a.keyword is None and not a.star]
    kw = {a.keyword.value: a for a in call.args if a.keyword is not None}
    return pos, kw


@dataclass
class Loader:
    call: cst.Call
    stmt: cst.BaseStatement
    target: str | None  # dotted name it is bound to, if any
    role: str  # "train" | "eval"
    dataset: cst.BaseExpression | None
    problem: str | None = None  # why it cannot be sharded automatically


@dataclass
class Step:
    """One backward pass and what surrounds it in its block."""

    backward: cst.Call
    stmt: cst.BaseStatement  # statement holding the backward
    block: cst.CSTNode  # IndentedBlock/Module holding stmt
    loss_expr: cst.BaseExpression
    forward_first: cst.BaseStatement | None = None  # first statement running the model
    loss_stmt: cst.BaseStatement | None = None  # statement computing the loss
    step_calls: list[cst.Call] = field(default_factory=list)  # optimizer.step() calls in the block
    step_stmts: list[cst.BaseStatement] = field(default_factory=list)  # top-level stmts holding them
    accumulation_test: cst.BaseExpression | None = None  # `if C: optimizer.step()` -> C
    models: list[str] = field(default_factory=list)  # model names forwarded in the step
    tail: list[cst.BaseStatement] = field(default_factory=list)  # backward and what follows, up to the step


class Analysis:
    def __init__(self, module: cst.Module, source: str | None = None) -> None:
        # source: the text module was parsed from (its codegen, which need not be run again:
        # positions and line numbers are those of the codegen)
        self.module = module
        # parents, name bindings and import aliases come from our own collecting walk
        # scope node (None: the module) -> name -> what binds it there: an import's full
        # dotted path, or "<value>" for anything else (assignment, def, class, parameter, ...)
        self.bindings: dict[int | None, dict[str, list[str]]] = {None: {}}
        self.parent: dict[cst.CSTNode, cst.CSTNode] = {}
        text = module.code if source is None or _NOT_ROUND_TRIP.search(source) else source
        self.pos = _Positions(module, text, self.parent)  # like LibCST's PositionProvider, on demand
        self._qcache: dict[int, set[str]] = {}
        self._binders: dict[str, set[int | None]] | None = None  # name -> scopes that bind it
        self._chains: dict[int, list[int | None]] = {}  # scope node -> _scope_chain of its nodes
        self.kids: dict[int, list[cst.CSTNode]] = {}
        self._order: dict[int, int] = {}  # node -> position in a pre-order walk
        self._bytype: dict[type, list[cst.CSTNode]] = {}  # analysed nodes by exact type, in pre-order
        self._index: dict[type, tuple[list[int], list[cst.CSTNode]]] = {}
        self._skipped_lines = self._find_skipped_lines(text) if "ddpify" in text else set()

        self.calls: list[cst.Call] = []
        self.functions: dict[str, list[cst.FunctionDef]] = {}
        self.classes: dict[str, cst.ClassDef] = {}
        self.fors: list[cst.For] = []
        self.whiles: list[cst.While] = []
        self.assigns: list[cst.CSTNode] = []
        self._param_cache: dict[int, list[str]] = {}
        self._values_by_scope: dict[tuple[int, str], list[cst.BaseExpression]] | None = None
        self.attributes: list[cst.Attribute] = []
        self.withs: list[cst.With] = []
        self.ifs: list[cst.If] = []
        self._collect()

        self.distributed_api = self._find_api(DISTRIBUTED_APIS)
        self.legacy_api = self._find_api(LEGACY_APIS) or self._local_rank_flag()
        self.optimizers: dict[str, cst.Call] = {}
        self.schedulers: set[str] = set()
        self.models: list[str] = []
        self._find_optimizers_and_models()
        from ddpify.manual_updates import manual_update_models  # no optimizer: p.data.add_(p.grad, ...)

        self.manual_updates = manual_update_models(self)
        self.models += [n for n in dict.fromkeys(n for _, n in self.manual_updates) if n not in self.models]
        self.dataparallel_calls = [c for c in self.calls if self.is_call(c, "torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.parallel.data_parallel.DataParallel")]
        self.functional_dp_calls = [c for c in self.calls if self.is_call(c, "torch.nn.parallel.data_parallel", "torch.nn.parallel.data_parallel.data_parallel")]
        for c in self.dataparallel_calls:
            pos, _ = call_args(c)
            name = dotted(pos[0].value) if pos else None
            if name and name not in self.models:
                self.models.append(name)
        self.model_bindings = self._propagate(self.models)
        self.forward_functions = self._functions_matching(self._is_forward_call)
        self.collective_functions = self._functions_matching(self._is_collective_call)
        self.steps = self._find_steps()
        self.loaders = self._find_loaders()
        self.main_guard = self._find_main_guard()
        self.existing_amp = any(
            self.is_call(c, "torch.autocast", "torch.cuda.amp.autocast", "torch.amp.autocast", "torch.cpu.amp.autocast",
                         "torch.cuda.amp.GradScaler", "torch.amp.GradScaler", "torch.GradScaler")
            for c in self.calls
        )

    # -- generic helpers --------------------------------------------------------------
    def _collect(self) -> None:
        """One pre-order walk over the fields (LibCST's visit rebuilds every node on the way, a
        CSTVisitor costs about a parse): parents, children, pre-order numbers, nodes by type,
        name bindings per scope, and the calls, functions, loops, ... concerns ask about.
        Whitespace and comments are not entered: they have no parent, number or type entry."""
        a = self
        parent = self.parent
        kids = self.kids
        order = self._order
        bytype = self._bytype
        bindings = self.bindings
        scopes: list[int | None] = [None]
        declared: list[set[str]] = [set()]  # global / nonlocal names per scope

        def bind(name: str, what: str) -> None:
            if name in declared[-1]:
                return  # `global x`: not a local of this scope
            bindings.setdefault(scopes[-1], {}).setdefault(name, []).append(what)

        def bind_target(target: cst.CSTNode) -> None:
            for el in _flatten_targets(target):  # type: ignore[arg-type]
                if isinstance(el, cst.StarredElement):
                    el = el.value
                if isinstance(el, cst.Name):
                    bind(el.value, "<value>")

        def declare(node) -> None:
            declared[-1].update(n.name.value for n in node.names)

        def import_(node) -> None:
            for alias in node.names:
                full = alias.evaluated_name
                if alias.asname is not None:
                    bind(alias.evaluated_alias, full)
                else:  # `import torch.nn` binds `torch`
                    head = full.split(".")[0]
                    bind(head, head)

        def import_from(node) -> None:
            if isinstance(node.names, cst.ImportStar):
                return
            mod = "." * len(node.relative) + (codegen(node.module) if node.module is not None else "")
            for alias in node.names:
                full = f"{mod}.{alias.evaluated_name}" if mod and not mod.endswith(".") else f"{mod}{alias.evaluated_name}"
                bind(alias.evaluated_alias or alias.evaluated_name, full)

        def for_(node) -> None:
            a.fors.append(node)
            bind_target(node.target)

        def assign(node) -> None:
            a.assigns.append(node)
            for t in node.targets:
                bind_target(t.target)

        def ann_assign(node) -> None:
            a.assigns.append(node)
            bind_target(node.target)

        def with_item(node) -> None:
            if node.asname is not None:
                bind_target(node.asname.name)

        def except_handler(node) -> None:
            if node.name is not None:
                bind_target(node.name.name)

        # what CSTVisitor's visit_<Type> methods did, by exact type
        handlers = {
            cst.Param: lambda n: bind(n.name.value, "<value>"),
            cst.Global: declare,
            cst.Nonlocal: declare,
            cst.Import: import_,
            cst.ImportFrom: import_from,
            cst.AugAssign: lambda n: bind_target(n.target),
            cst.CompFor: lambda n: bind_target(n.target),
            cst.WithItem: with_item,
            cst.ExceptHandler: except_handler,
            cst.NamedExpr: lambda n: bind_target(n.target),
            cst.Call: a.calls.append,
            cst.FunctionDef: lambda n: a.functions.setdefault(n.name.value, []).append(n),
            cst.ClassDef: lambda n: a.classes.__setitem__(n.name.value, n),
            cst.For: for_,
            cst.While: a.whiles.append,
            cst.Assign: assign,
            cst.AnnAssign: ann_assign,
            cst.Attribute: a.attributes.append,
            cst.With: a.withs.append,
            cst.If: a.ifs.append,
        }
        sentinel = cst.MaybeSentinel
        # type -> (child fields, None where they depend on the node; handler; opens a scope;
        # bytype list): one lookup per node
        info: dict[type, tuple] = {}
        stack: list[cst.CSTNode | None] = [self.module]  # None: leave the innermost scope
        n = 0
        while stack:
            node = stack.pop()
            if node is None:
                scopes.pop()
                declared.pop()
                continue
            t = type(node)
            ti = info.get(t)
            if ti is None:
                names = _walk_fields(node)
                ti = info[t] = (None if _FIELDS[t][1] else names, handlers.get(t), t in _SCOPE_TYPES, bytype.setdefault(t, []))
            names, h, opens_scope, same = ti
            i = id(node)
            order[i] = n
            n += 1
            same.append(node)
            if opens_scope:
                if t is cst.FunctionDef or t is cst.ClassDef:
                    bind(node.name.value, "<value>")  # in the enclosing scope
                scopes.append(i)
                declared.append(set())
                bindings.setdefault(i, {})
                stack.append(None)
            if h is not None:
                h(node)
            if names is None:
                names = _walk_fields(node)
            children: list[cst.CSTNode] = []
            for f in names:
                v = getattr(node, f)
                if v is None or v.__class__ is sentinel:
                    continue
                if v.__class__ is tuple or v.__class__ is list:
                    children.extend(v)
                else:
                    children.append(v)
            if children:
                kids[i] = children
                for c in children:
                    parent[c] = node
                stack.extend(reversed(children))

    @staticmethod
    def _find_skipped_lines(text: str) -> set[int]:
        skipped: set[int] = set()
        off = False
        for i, line in enumerate(text.splitlines(), start=1):
            if OFF_RE.search(line):
                off = True
            if off or SKIP_RE.search(line):
                skipped.add(i)
            if ON_RE.search(line):
                off = False
        return skipped

    def skipped(self, node: cst.CSTNode) -> bool:
        if not self._skipped_lines:
            return False
        p = self.pos[node]
        return any(ln in self._skipped_lines for ln in range(p.start.line, p.end.line + 1))

    def line_col(self, node: cst.CSTNode) -> tuple[int, int]:
        p = self.pos.start(node)
        return p.line, p.column + 1

    def findall(self, node: cst.CSTNode, matcher) -> list[cst.CSTNode]:
        """m.findall over the analysed tree without a LibCST visit: a subtree is a run of
        pre-order numbers, so its nodes of a type are a slice of that type's pre-order list."""
        start = self._order.get(id(node))
        if start is None:
            return m.findall(node, matcher)  # a node built by a transform
        options = matcher.options if isinstance(matcher, m.OneOf) else (matcher,)
        end = self._subtree_end(node)
        out: list[cst.CSTNode] = []
        for opt in options:
            orders, nodes = self._of_type(opt.cls)
            lo = bisect_left(orders, start)
            found = nodes[lo : bisect_left(orders, end, lo)]
            out.extend(found if m.bare(opt) else [n for n in found if m.matches(n, opt)])
        if len(options) > 1:  # back to tree order
            out.sort(key=lambda n: self._order[id(n)])
        return out

    def _subtree_end(self, node: cst.CSTNode) -> int:
        """Pre-order number just past node's subtree (its last descendant is a last child's last child ...)."""
        kids = self.kids
        cur = node
        while True:
            last = kids.get(id(cur))
            if not last:
                return self._order[id(cur)] + 1
            cur = last[-1]

    def _of_type(self, cls: type) -> tuple[list[int], list[cst.CSTNode]]:
        """Pre-order numbers and nodes of the analysed nodes that are instances of cls."""
        found = self._index.get(cls)
        if found is None:
            order = self._order
            if _leaf_types((cls,)):  # the usual m.Call(), m.Name(), ...: one list, no issubclass scan
                lists = [self._bytype[cls]] if cls in self._bytype else []
            else:
                lists = [v for t, v in self._bytype.items() if issubclass(t, cls)]
            nodes = lists[0] if len(lists) == 1 else sorted((n for v in lists for n in v), key=lambda n: order[id(n)])
            found = self._index[cls] = ([order[id(n)] for n in nodes], nodes)
        return found

    def qualified(self, node: cst.CSTNode) -> set[str]:
        """Full dotted name of a name or attribute chain, through the imports in scope:
        `F.relu` -> torch.nn.functional.relu after `import torch.nn.functional as F`."""
        cached = self._qcache.get(id(node))
        if cached is not None:
            return cached
        names: set[str] = set()
        d = dotted(node)
        if d is not None:
            head, _, rest = d.partition(".")
            binders = self._binders.get(head) if self._binders is not None else self._index_binders().get(head)
            # a name no scope binds is itself; one only the module binds needs no scope walk
            chain = () if binders is None else (None,) if binders == _MODULE_ONLY else self._scope_chain(node)
            for scope in chain:
                bound = self.bindings.get(scope, {}).get(head)
                if bound:
                    names = {f"{b}.{rest}" if rest else b for b in bound if b != "<value>"} or {d}
                    break
            else:
                names = {d}
        self._qcache[id(node)] = names
        return names

    def _index_binders(self) -> dict[str, set[int | None]]:
        binders: dict[str, set[int | None]] = {}
        for scope, names in self.bindings.items():
            for name in names:
                binders.setdefault(name, set()).add(scope)
        self._binders = binders
        return binders

    def _scope_chain(self, node: cst.CSTNode) -> list[int | None]:
        """Enclosing function-like scopes, innermost first, then the module (class bodies are
        not visible from their methods, as in Python). Shared by the nodes of a scope."""
        parent = self.parent
        cur = parent.get(node)
        if _leaf_types(SCOPES + (cst.ClassDef,)):  # exact types: no isinstance on LibCST's ABCs
            while cur is not None and type(cur) not in _SCOPE_TYPES:
                cur = parent.get(cur)
        else:
            while cur is not None and not isinstance(cur, (*SCOPES, cst.ClassDef)):
                cur = parent.get(cur)
        if cur is None:
            return _MODULE_CHAIN
        chain = self._chains.get(id(cur))
        if chain is None:
            chain = self._chains[id(cur)] = []
            inner, first = cur, True
            while inner is not None:
                if isinstance(inner, SCOPES) or (first and isinstance(inner, cst.ClassDef)):
                    chain.append(id(inner))
                    if isinstance(inner, cst.FunctionDef | cst.Lambda):
                        first = False
                inner = parent.get(inner)
            chain.append(None)
        return chain

    def is_call(self, call: cst.CSTNode, *names: str) -> bool:
        if type(call) is not cst.Call and not isinstance(call, cst.Call):
            return False
        qs = self._qcache.get(id(call.func))  # hot: the transforms ask it of every call
        if qs is None:
            qs = self.qualified(call.func)  # type: ignore[attr-defined]
        return not qs.isdisjoint(names)

    def call_qualname(self, call: cst.Call) -> str:
        qs = sorted(self.qualified(call.func))
        return qs[0] if qs else (dotted(call.func) or "")

    def ancestor(self, node: cst.CSTNode, *types: type) -> cst.CSTNode | None:
        parent = self.parent
        cur = parent.get(node)
        if _leaf_types(types):  # a set lookup instead of isinstance on LibCST's ABCs
            while cur is not None and type(cur) not in types:
                cur = parent.get(cur)
            return cur
        while cur is not None and not isinstance(cur, types):
            cur = parent.get(cur)
        return cur

    def statement(self, node: cst.CSTNode) -> cst.BaseStatement:
        """The statement (a member of a block's body) that holds node."""
        cur = node
        while True:
            par = self.parent.get(cur)
            if par is None or isinstance(par, (cst.IndentedBlock, cst.Module)):
                return cur  # type: ignore[return-value]
            if isinstance(par, cst.SimpleStatementSuite):
                # one-line compound statement: the compound statement is the unit
                return self.statement(self.parent[par])
            cur = par

    def block(self, stmt: cst.CSTNode) -> cst.CSTNode:
        return self.parent[stmt]

    def branch_owner(self, stmt: cst.CSTNode) -> cst.CSTNode | None:
        """The if (whole elif chain), try or with whose branch holds stmt; None elsewhere,
        and for the `if __name__ == "__main__":` guard."""
        block = self.block(stmt)
        if not isinstance(block, cst.IndentedBlock):
            return None
        owner = self.parent.get(block)
        if isinstance(owner, (cst.Else, cst.Finally, cst.ExceptHandler)):
            owner = self.parent.get(owner)
        while isinstance(owner, cst.If) and isinstance(self.parent.get(owner), cst.If):  # elif
            owner = self.parent.get(owner)
        if not isinstance(owner, (cst.If, cst.Try, cst.With)) or owner is self.main_guard:
            return None
        return owner

    def function_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        return self.ancestor(node, cst.FunctionDef)  # type: ignore[return-value]

    def class_of(self, node: cst.CSTNode) -> cst.ClassDef | None:
        return self.ancestor(node, cst.ClassDef)  # type: ignore[return-value]

    def scope_key(self, node: cst.CSTNode) -> cst.CSTNode:
        return self.function_of(node) or self.module

    def _find_api(self, names: tuple[str, ...]) -> cst.CSTNode | None:
        exact, under = set(names), tuple(n + "." for n in names)  # q == n or q.startswith(n + ".")
        for c in self.calls:
            for q in self.qualified(c.func):
                if q in exact or q.startswith(under):
                    return c
        for node in self.attributes:
            for q in self.qualified(node):
                if q in exact or q.startswith(under):
                    return node
        return None

    def _local_rank_flag(self) -> cst.CSTNode | None:
        for c in self.calls:
            if isinstance(c.func, cst.Attribute) and c.func.attr.value == "add_argument":
                flags = [a.value.evaluated_value for a in c.args if a.keyword is None and isinstance(a.value, cst.SimpleString)]
                if "--local_rank" in flags or "--local-rank" in flags:
                    return c
        return None

    # -- models and optimizers --------------------------------------------------------
    def _is_optimizer_call(self, call: cst.Call) -> bool:
        qn = self.call_qualname(call)
        last = qn.rsplit(".", 1)[-1]
        if SCHED_RE.search(qn) or "lr_scheduler" in qn:
            return False
        if any(qn.startswith(p) for p in OPTIM_PREFIXES) and OPTIM_RE.search(last):
            return True
        if OPTIM_RE.search(last) and self._param_sources(call):
            return True
        return False

    def _param_sources(self, call: cst.Call) -> list[str]:
        """Modules whose parameters reach this optimizer call, following names bound in
        the same scope: decay = [p for n, p in model.named_parameters() if ...];
        groups = [{"params": decay}, ...]; AdamW(groups)."""
        cached = self._param_cache.get(id(call))
        if cached is not None:
            return cached
        found: list[str] = []
        fn = self.function_of(call)
        work: list[cst.CSTNode] = [call]
        seen_names: set[str] = set()
        while work and len(seen_names) < 32:
            node = work.pop()
            for c in self.findall(node, m.Call(func=m.Attribute(attr=m.Name("parameters") | m.Name("named_parameters")))):
                base = dotted(c.func.value)  # type: ignore[attr-defined]
                if base and base not in found:
                    found.append(base)
            for ref in self.findall(node, m.Name()):
                name = ref.value
                if name in seen_names:
                    continue
                seen_names.add(name)
                for value in self._local_values(fn, name):
                    work.append(value)
        self._param_cache[id(call)] = found
        return found

    def _local_values(self, fn: cst.FunctionDef | None, name: str) -> list[cst.BaseExpression]:
        """Values assigned to a plain name in scope fn (module level when None)."""
        if self._values_by_scope is None:
            index: dict[tuple[int, str], list[cst.BaseExpression]] = {}
            for a in self.assigns:
                if isinstance(a, cst.Assign):
                    targets = [t.target for t in a.targets]
                elif isinstance(a, cst.AnnAssign) and a.value is not None:
                    targets = [a.target]
                else:
                    continue
                for t in targets:
                    if isinstance(t, cst.Name):
                        index.setdefault((id(self.function_of(a)), t.value), []).append(a.value)
            self._values_by_scope = index
        return self._values_by_scope.get((id(fn), name), [])

    def _assigned_names(self) -> set[str]:
        names: set[str] = set()
        for a in self.assigns:
            targets = [t.target for t in a.targets] if isinstance(a, cst.Assign) else [a.target]
            for t in targets:
                for el in _flatten_targets(t):
                    d = dotted(el)
                    if d:
                        names.add(d)
        for fns in self.functions.values():
            for fn in fns:
                for p in fn.params.params:
                    names.add(p.name.value)
        return names

    def _find_optimizers_and_models(self) -> None:
        assigned = self._assigned_names()
        for call in self.calls:
            qn = self.call_qualname(call)
            target = self._assign_target(call)
            if SCHED_RE.search(qn) or "lr_scheduler" in qn:
                if target:
                    self.schedulers.add(target)
                continue
            if not self._is_optimizer_call(call):
                continue
            if target:
                self.optimizers[target] = call
            for src in self._param_sources(call):
                parts = src.split(".")
                # model.fc.parameters() -> "model" when "model" is a variable of its own
                chosen = src
                for k in range(1, len(parts)):
                    prefix = ".".join(parts[:k])
                    if prefix in assigned and prefix != "self":
                        chosen = prefix
                        break
                # `self.parameters()` inside the model's own method: the caller's receiver is the model
                if chosen == "self":
                    continue
                if chosen not in self.models and not chosen.endswith(("_params", "params")):
                    self.models.append(chosen)
        # optimizers built in helper functions: opt = make_optimizer(model)
        for call in self.calls:
            target = self._assign_target(call)
            if not target or self._is_optimizer_call(call):
                continue
            name = dotted(call.func)
            for fn in self.functions.get(name.rsplit(".", 1)[-1] if name else "", []):
                for ret in self.findall(fn, m.Return()):
                    values = [ret.value] if ret.value is not None else []
                    if isinstance(ret.value, cst.Name):  # opt = AdamW(...); return opt
                        values = self._local_values(fn, ret.value.value)
                    for value in values:
                        if isinstance(value, cst.Call) and self._is_optimizer_call(value):
                            self.optimizers.setdefault(target, value)
                            # model.configure_optimizers(): `self` there is `model` here
                            receiver = dotted(call.func.value) if isinstance(call.func, cst.Attribute) else None
                            if receiver and "self" in self._param_sources(value) and receiver not in self.models:
                                if self.class_of(fn) is not None and receiver != "self":
                                    self.models.append(receiver)

    def _assign_target(self, node: cst.CSTNode) -> str | None:
        par = self.parent.get(node)
        if isinstance(par, (cst.Assign,)) and len(par.targets) == 1:
            return dotted(par.targets[0].target)
        if isinstance(par, cst.AnnAssign):
            return dotted(par.target)
        return None

    def _propagate(self, names: list[str]) -> dict[cst.CSTNode, set[str]]:
        """Scope -> names bound to one of `names`, following arguments into functions."""
        bound: dict[cst.CSTNode, set[str]] = {}
        work = [(None, n) for n in names]
        seen: set[tuple[int, str]] = set()
        while work:
            scope, name = work.pop()
            key = (id(scope), name)
            if key in seen:
                continue
            seen.add(key)
            if scope is not None:
                bound.setdefault(scope, set()).add(name)
            for call in self.calls:
                fname = dotted(call.func)
                if not fname:
                    continue
                defs = self.functions.get(fname.rsplit(".", 1)[-1], [])
                if not defs:
                    continue
                pos, kw = call_args(call)
                for fn in defs:
                    params = [p.name.value for p in fn.params.params]
                    offset = 1 if params and params[0] in ("self", "cls") and "." in fname else 0
                    for i, arg in enumerate(pos):
                        if dotted(arg.value) == name and i + offset < len(params):
                            work.append((fn, params[i + offset]))
                    for k, arg in kw.items():
                        if dotted(arg.value) == name and k in params:
                            work.append((fn, k))
        bound.setdefault(None, set()).update(names)  # type: ignore[arg-type]
        return bound

    def is_model_ref(self, node: cst.CSTNode) -> bool:
        name = dotted(node)
        if name is None:
            return False
        fn = self.function_of(node)
        if fn is not None and name in self.model_bindings.get(fn, set()):
            return True
        if name in self.model_bindings.get(None, set()):  # type: ignore[arg-type]
            # a local of the same name in another function is not the model
            if fn is not None and "." not in name and self._is_local(fn, name) and not self._binds_model_here(fn, name):
                return False
            return True
        return False

    def _is_local(self, fn: cst.FunctionDef, name: str) -> bool:
        return name in self.bindings.get(id(fn), {})

    def _binds_model_here(self, fn: cst.FunctionDef, name: str) -> bool:
        # the function itself creates the model (model = Net(); opt = Adam(model.parameters()))
        return any(self.function_of(c) is fn and name in self._param_sources(c) for c in self.optimizers.values()) or any(
            self.function_of(c) is fn and dotted(call_args(c)[0][0].value) == name
            for c in self.dataparallel_calls
            if call_args(c)[0]
        ) or any(self.function_of(loop) is fn and n == name for loop, n in self.manual_updates)

    # -- what runs the model / a collective -------------------------------------------
    def _is_forward_call(self, call: cst.Call) -> bool:
        return self.is_model_ref(call.func)

    def _is_collective_call(self, call: cst.Call) -> bool:
        if self._is_forward_call(call):
            return True
        if any(q.startswith("torch.distributed.") for q in self.qualified(call.func)):
            return True
        # torch.load gets a barrier; model passed to a function may be run there
        if self.is_call(call, "torch.load"):
            return True
        return False

    def _functions_matching(self, pred) -> set[str]:
        names: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, defs in self.functions.items():
                if name in names:
                    continue
                for fn in defs:
                    for c in self.findall(fn, m.Call()):
                        if pred(c) or self._calls_function_in(c, names):
                            names.add(name)
                            changed = True
                            break
                    if name in names:
                        break
        return names

    def _calls_function_in(self, call: cst.Call, names: set[str]) -> bool:
        fname = dotted(call.func)
        return bool(fname) and fname.rsplit(".", 1)[-1] in names and fname.rsplit(".", 1)[-1] in self.functions

    def runs_model(self, node: cst.CSTNode) -> bool:
        return any(
            self._is_forward_call(c) or self._calls_function_in(c, self.forward_functions)
            or any(self.is_model_ref(a.value) for a in c.args if self._calls_function_in(c, set(self.functions)))
            for c in self.findall(node, m.Call())
        )

    def runs_collective(self, node: cst.CSTNode) -> bool:
        return any(
            self._is_collective_call(c) or self._calls_function_in(c, self.collective_functions)
            for c in self.findall(node, m.Call())
        )

    # -- training steps ---------------------------------------------------------------
    def is_optimizer_ref(self, node: cst.CSTNode) -> bool:
        name = dotted(node)
        if not name:
            return False
        if name in self.optimizers:
            return True
        last = name.rsplit(".", 1)[-1]
        if last in {o.rsplit(".", 1)[-1] for o in self.optimizers}:
            return True
        return bool(re.search(r"(^|_)(opt|optim|optimizer)(_|$)|optimizer", last, re.I)) and name not in self.schedulers

    def _find_steps(self) -> list[Step]:
        steps: list[Step] = []
        for call in self.calls:
            if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"):
                continue
            if self.is_call(call, "torch.autograd.backward"):
                continue
            stmt = self.statement(call)
            block = self.block(stmt)
            if not isinstance(block, (cst.IndentedBlock, cst.Module)):
                continue
            step = Step(backward=call, stmt=stmt, block=block, loss_expr=call.func.value)
            body = list(block.body)
            idx = body.index(stmt)
            loss_name = dotted(call.func.value)
            for s in reversed(body[:idx]):
                if loss_name and self._assigns(s, loss_name):
                    step.loss_stmt = s
                    break
            # the forward pass of this step starts after the previous backward in the block
            start = 0
            for k in range(idx - 1, -1, -1):
                if self.findall(body[k], m.Call(func=m.Attribute(attr=m.Name("backward")))):
                    start = k + 1
                    break
            for s in body[start:idx]:
                if self.runs_model(s):
                    step.forward_first = s
                    break
            if step.forward_first is None and self.runs_model(stmt):
                step.forward_first = stmt
            later = body[idx + 1 :]
            stop = next((k for k, s in enumerate(later) if self.findall(s, m.Call(func=m.Attribute(attr=m.Name("backward"))))), len(later))
            step.tail = [stmt, *later[:stop]]
            self._collect_step_calls(step, step.tail)
            if not step.step_calls:
                self._micro_loop_step(step)
            region = body[body.index(step.forward_first) : idx + 1] if step.forward_first in body else [stmt]
            for s in region:
                for c in self.findall(s, m.Call()):
                    if self._is_forward_call(c):
                        n = dotted(c.func)
                        if n and n not in step.models:
                            step.models.append(n)
            steps.append(step)
        return steps

    def _collect_step_calls(self, step: Step, stmts: list[cst.BaseStatement]) -> None:
        for s in stmts:
            for c in self.findall(s, m.Call(func=m.Attribute(attr=m.Name("step")))):
                if self.is_optimizer_ref(c.func.value):  # type: ignore[attr-defined]
                    step.step_calls.append(c)
                    if s not in step.step_stmts:
                        step.step_stmts.append(s)
                    if isinstance(s, cst.If) and step.accumulation_test is None and self.ancestor(c, cst.If) is s:
                        step.accumulation_test = s.test

    def _micro_loop_step(self, step: Step) -> None:
        """for micro in range(N): ...; loss.backward()  then optimizer.step() after the loop."""
        loop = self.parent.get(step.block)
        if not isinstance(loop, cst.For) or _in_orelse(self, step.stmt, loop):
            return
        outer = self.block(loop)
        if not isinstance(outer, (cst.IndentedBlock, cst.Module)):
            return
        body = list(outer.body)
        later = body[body.index(loop) + 1 :]
        stop = next((k for k, s in enumerate(later) if self.findall(s, m.Call(func=m.Attribute(attr=m.Name("backward"))))), len(later))
        self._collect_step_calls(step, later[:stop])
        if not step.step_calls:
            return
        step.tail = [*step.tail, *later[:stop]]
        step.accumulation_test = None
        it = loop.iter
        if (
            isinstance(loop.target, cst.Name)
            and m.matches(it, m.Call(func=m.Name("range")))
            and len(it.args) == 1  # type: ignore[attr-defined]
            and it.args[0].keyword is None  # type: ignore[attr-defined]
        ):
            # the last micro-step is the one whose gradients the optimizer uses
            n = it.args[0].value  # type: ignore[attr-defined]
            step.accumulation_test = cst.parse_expression(f"{loop.target.value} == {code(n)} - 1")

    def _assigns(self, stmt: cst.BaseStatement, name: str) -> bool:
        for node in self.findall(stmt, m.Assign() | m.AugAssign() | m.AnnAssign()):
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            for t in targets:
                if any(dotted(el) == name for el in _flatten_targets(t)):
                    return True
        return False

    # -- data -------------------------------------------------------------------------
    def _find_loaders(self) -> list[Loader]:
        loaders: list[Loader] = []
        for call in self.calls:
            if not self.is_call(call, *LOADER_NAMES):
                continue
            stmt = self.statement(call)
            target = self._loader_target(call)
            pos, kw = call_args(call)
            dataset = pos[0].value if pos else (kw["dataset"].value if "dataset" in kw else None)
            loaders.append(Loader(call=call, stmt=stmt, target=target, role="eval", dataset=dataset))
        for ld in loaders:
            ld.role = self._loader_role(ld, loaders)
        return loaders

    def _loader_target(self, call: cst.Call) -> str | None:
        t = self._assign_target(call)
        if t:
            return t
        par = self.parent.get(call)
        # `return DataLoader(...)` or `train, val = DataLoader(...), DataLoader(...)`
        if isinstance(par, cst.Element):
            tup = self.parent.get(par)
            asg = self.parent.get(tup)
            if isinstance(asg, cst.Assign) and isinstance(asg.targets[0].target, (cst.Tuple, cst.List)):
                idx = [e.value for e in tup.elements].index(call)
                els = asg.targets[0].target.elements
                if idx < len(els):
                    return dotted(els[idx].value)
        names = self.returned_as(call)
        return names[0][0] if names else None

    def returned_as(self, value: cst.CSTNode) -> list[tuple[str, cst.FunctionDef | None]]:
        """Where a returned value lands in the callers: `return a, b` and `x, y = f()` give
        (y, caller) for b. `value` is the returned expression, or any occurrence of a plain name
        that its function returns."""
        fn = self.function_of(value)
        if fn is None:
            return []
        name = dotted(value) if isinstance(value, cst.Name) else None
        idx: int | None = None
        found = False
        for ret in self.findall(fn, m.Return()):
            if self.function_of(ret) is not fn or ret.value is None:
                continue
            rv = ret.value
            items = [e.value for e in rv.elements] if isinstance(rv, cst.Tuple) else [rv]
            for i, item in enumerate(items):
                if item is value or (name is not None and dotted(item) == name):
                    idx = i if isinstance(rv, cst.Tuple) else None
                    found = True
        if not found:
            return []
        out: list[tuple[str, cst.FunctionDef | None]] = []
        for call in self.callers(fn):
            asg = self.parent.get(call)
            if not isinstance(asg, cst.Assign) or len(asg.targets) != 1:
                continue
            target = asg.targets[0].target
            if idx is None:
                t = dotted(target)
            elif isinstance(target, (cst.Tuple, cst.List)) and idx < len(target.elements):
                t = dotted(target.elements[idx].value)
            else:
                t = None
            if t:
                out.append((t, self.function_of(call)))
        return out

    def _loader_role(self, ld: Loader, all_loaders: list[Loader]) -> str:
        names = [ld.target or "", dotted(ld.dataset) or "" if ld.dataset is not None else ""]
        if isinstance(ld.dataset, cst.Call):
            names.append(dotted(ld.dataset.func) or "")
            _, dkw = call_args(ld.dataset)
            if "train" in dkw and m.matches(dkw["train"].value, m.Name("False")):
                return "eval"
            if "train" in dkw and m.matches(dkw["train"].value, m.Name("True")):
                return "train"
            for a in ld.dataset.args:
                if isinstance(a.value, cst.SimpleString) and EVAL_RE.search(a.value.value):
                    return "eval"
        for n in names:
            if TRAIN_RE.search(n):
                return "train"
        for n in names:
            if EVAL_RE.search(n):
                return "eval"
        # function returning loaders: position in `train, val = get_loaders()`
        if ld.target is None:
            fn = self.function_of(ld.call)
            if fn is not None and TRAIN_RE.search(fn.name.value) and not EVAL_RE.search(fn.name.value):
                return "train"
        if self._iterated_in_training(ld):
            return "train"
        if len(all_loaders) == 1:
            return "train"
        _, kw = call_args(ld.call)
        if "shuffle" in kw and m.matches(kw["shuffle"].value, m.Name("True")):
            return "train"
        return "eval"

    def _iterated_in_training(self, ld: Loader) -> bool:
        if not ld.target:
            return False
        for loop in self.fors:
            if self.loop_iterates(loop, ld.target) and any(
                self.ancestor(s.stmt, cst.For, cst.While) is loop or _inside(self, s.stmt, loop) for s in self.steps
            ):
                return True
        return False

    def loop_iterates(self, loop: cst.For, name: str) -> bool:
        return any(dotted(n) == name for n in self.findall(loop.iter, m.Name() | m.Attribute())) or dotted(loop.iter) == name

    def loader_iteration_sites(self, name: str, origin: cst.CSTNode | None = None) -> list[tuple[cst.CSTNode, str]]:
        """(for-loop or iter() call, name used there) for every place `name` (or a
        parameter bound to it) is iterated."""
        bound = self._propagate([name])
        # pbar = tqdm(loader): iterating the wrapper iterates the loader, whose
        # name (not the wrapper's) is what the sampler hangs off
        wrapped: dict[str, str] = {}
        for asg in self.assigns:
            if isinstance(asg, cst.Assign) and isinstance(asg.value, cst.Call) and len(asg.targets) == 1:
                alias = dotted(asg.targets[0].target)
                fn = self.function_of(asg)
                names = bound.get(fn, set()) | bound.get(None, set())
                inner = next((dotted(x.value) for x in asg.value.args if dotted(x.value) in names), None)
                if alias and inner:
                    bound.setdefault(fn, set()).add(alias)
                    wrapped[alias] = inner
        sites: list[tuple[cst.CSTNode, str]] = []
        for loop in self.fors:
            fn = self.function_of(loop)
            visible = fn is None or fn is origin or "." in name or not self._is_local(fn, name)
            names = bound.get(fn, set()) | (bound.get(None, set()) if visible else set())  # type: ignore[arg-type]
            for n in names:
                if self.loop_iterates(loop, n):
                    sites.append((loop, wrapped.get(n, n)))
                    break
        for call in self.calls:
            if m.matches(call.func, m.Name("iter")) and call.args and dotted(call.args[0].value) is not None:
                fn = self.function_of(call)
                names = bound.get(fn, set()) | bound.get(None, set())  # type: ignore[arg-type]
                if dotted(call.args[0].value) in names:
                    sites.append((call, dotted(call.args[0].value)))  # type: ignore[arg-type]
        return sites

    def enclosing_loop(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """Nearest loop around node within its own function."""
        cur = self.parent.get(node)
        while cur is not None and not isinstance(cur, (cst.FunctionDef, cst.ClassDef)):
            if isinstance(cur, (cst.For, cst.While)) and not _in_orelse(self, node, cur):
                return cur
            cur = self.parent.get(cur)
        return None

    def callers(self, fn: cst.FunctionDef) -> list[cst.Call]:
        out = []
        for call in self.calls:
            name = dotted(call.func)
            if name and name.rsplit(".", 1)[-1] == fn.name.value:
                if "." in name and not name.startswith(("self.", "cls.")) and self.class_of(fn) is None:
                    continue
                out.append(call)
        return out

    # -- entry point ------------------------------------------------------------------
    def _find_main_guard(self) -> cst.If | None:
        for stmt in self.module.body:
            if isinstance(stmt, cst.If) and m.matches(
                stmt.test,
                m.Comparison(left=m.Name("__name__"), comparisons=[m.ComparisonTarget(m.Equal(), m.SimpleString())])
            ):
                return stmt
        return None


def _flatten_targets(t: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(t, (cst.Tuple, cst.List)):
        out: list[cst.BaseExpression] = []
        for el in t.elements:
            out.extend(_flatten_targets(el.value))
        return out
    return [t]


def _inside(a: Analysis, node: cst.CSTNode, container: cst.CSTNode) -> bool:
    cur = a.parent.get(node)
    while cur is not None:
        if cur is container:
            return True
        cur = a.parent.get(cur)
    return False


def _in_orelse(a: Analysis, node: cst.CSTNode, loop: cst.CSTNode) -> bool:
    orelse = getattr(loop, "orelse", None)
    return orelse is not None and _inside(a, node, orelse)

