"""Which values differ from rank to rank, and on which ranks a line runs.

Every expression is evaluated abstractly in three processes at once (SCENARIOS): global rank 0
(local rank 0), global rank 1 (local rank 1, on the same node) and global rank 4 (local rank 0 on
a second node), with 8 processes, 4 a node. A value is a triple, one entry a process; UNK where
it is not known statically. An expression whose entries differ depends on the rank (global when
rank 0 and rank 4 differ, local when only rank 1 does); an `if` whose test differs runs on some
ranks only. Rank values come from torchrun's environment (RANK, LOCAL_RANK, ...), from
torch.distributed, Accelerate and Lightning attributes, mp.spawn's process index, and are
followed through assignments, `self` attributes, function parameters and return values; a name
that is never assigned a value here (`args.local_rank`, a helper imported from elsewhere) is
judged by its name.
"""

from __future__ import annotations

import re

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import call_args, dotted
from ddpify.lint.values import (
    ALL_UNK,
    N,
    TRUE,
    UNK,
    _binop,
    _combine,
    _compare,
    _leaf,
    _literal,
    const,
    depends,
    t_and,
    t_not,
    t_or,
    truth,
)

ENV = {
    "RANK": "g",
    "LOCAL_RANK": "l",
    "GROUP_RANK": "n",
    "NODE_RANK": "n",
    "WORLD_SIZE": "W",
    "LOCAL_WORLD_SIZE": "LW",
    "SLURM_PROCID": "g",
    "SLURM_LOCALID": "l",
    "SLURM_NODEID": "n",
    "SLURM_NTASKS": "W",
    "OMPI_COMM_WORLD_RANK": "g",
    "OMPI_COMM_WORLD_LOCAL_RANK": "l",
    "OMPI_COMM_WORLD_SIZE": "W",
    "PMI_RANK": "g",
    "MPI_LOCALRANKID": "l",
}
LAUNCHER_ENV = set(ENV) | {
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
}
# functions (qualified) and attributes (last part) that give a rank, a world size or a rank test
API_CALLS = {
    "torch.distributed.get_rank": "g",
    "torch.distributed.get_global_rank": "g",
    "torch.distributed.get_node_local_rank": "l",
    "torch.distributed.get_world_size": "W",
    "torch.cuda.device_count": "LW",
    "torch.accelerator.device_count": "LW",
    "horovod.torch.rank": "g",
    "horovod.torch.local_rank": "l",
    "horovod.torch.size": "W",
    "torch_xla.core.xla_model.get_ordinal": "g",
    "torch_xla.core.xla_model.is_master_ordinal": "main",
    # under a launcher the group exists: `not dist.is_initialized() or dist.get_rank() == 0`
    "torch.distributed.is_initialized": "true",
    "torch.distributed.is_available": "true",
}
METHOD_CALLS = {
    "is_world_process_zero": "main",
    "is_local_process_zero": "local_main",
    "is_main_process": "main",
    "is_local_main_process": "local_main",
}
API_ATTRS = {
    "is_main_process": "main",
    "is_local_main_process": "local_main",
    "is_global_zero": "main",
    "process_index": "g",
    "local_process_index": "l",
    "global_rank": "g",
    "num_processes": "W",
}
# names judged by their spelling when no value is found for them
LOCAL_NAME = re.compile(
    r"^(local_?rank|lrank|local_rank_id|local_process_index|ddp_local_rank|gpu_?rank)$",
    re.I,
)
GLOBAL_NAME = re.compile(
    r"^(rank|global_?rank|world_rank|ddp_rank|proc_rank|process_rank|process_index|rank_id|my_rank|dist_rank)$",
    re.I,
)
MAIN_NAME = re.compile(
    r"^(is_)?(master|main)(_process|_proc|_rank|_node)?$|^is_(rank_?0|rank_?zero|global_zero|primary|chief|root)$|^(rank_?zero|rank0)$",
    re.I,
)
LOCAL_MAIN_NAME = re.compile(r"^(is_)?local_(master|main)(_process)?$", re.I)
WORLD_NAME = re.compile(
    r"^(world_?size|num_processes|n_?procs|nprocs|ddp_world_size|num_replicas)$", re.I
)
LOCAL_WORLD_NAME = re.compile(
    r"^(n_?gpus?(_per_node)?|num_gpus|gpus_per_node|nproc_per_node|local_world_size|ngpus_per_node|gpu_count|n_devices)$",
    re.I,
)
MAIN_FUNC = re.compile(
    r"^(is_)?(main_process|master|main|rank_?0|rank_?zero|master_process|global_zero|primary)$|^is_(dist_)?(main|master)(_process)?$",
    re.I,
)
LOCAL_MAIN_FUNC = re.compile(r"^is_local_(main|master)(_process)?$", re.I)
RANK_FUNC = {
    "get_rank": "g",
    "get_global_rank": "g",
    "get_local_rank": "l",
    "get_world_size": "W",
    "get_local_size": "LW",
}


class Ranks:
    def __init__(self, a, facts=None) -> None:
        self.a = a
        self.facts = facts
        self._memo: dict[int, tuple] = {}
        self._names: dict[tuple[int, str], tuple] = {}
        self._spawned: set[int] | None = None
        self._global_assigns: dict[str, list] | None = None

    # -- public -------------------------------------------------------------------------------
    def values(self, node: cst.CSTNode) -> tuple:
        key = id(node)
        got = self._memo.get(key)
        if got is not None:
            return got
        self._memo[key] = ALL_UNK  # a value defined through itself is not known
        got = self._eval(node)
        self._memo[key] = got
        return got

    def depends(self, node: cst.CSTNode) -> bool:
        return depends(self.values(node))

    def kind(self, node: cst.CSTNode) -> str | None:
        """None, "local" (only the local rank matters) or "global"."""
        v = self.values(node)
        if not depends(v):
            return None
        return (
            "local"
            if v[0] is not UNK
            and v[0] is v[2]
            or (v[0] is not UNK and v[2] is not UNK and v[0] == v[2])
            else "global"
        )

    def test(self, node: cst.CSTNode) -> tuple:
        return truth(self.values(node))

    def reads_rank(self, node: cst.CSTNode) -> bool:
        """Some name or call in node has a rank-dependent value (a per-rank file name)."""
        if self.depends(node):
            return True
        for sub in self.a.findall(node, _NAMES):
            if self.depends(sub):
                return True
        return False

    # -- evaluation ---------------------------------------------------------------------------
    def _eval(self, node: cst.CSTNode) -> tuple:
        lit = (
            _literal(node)
            if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString))
            else UNK
        )
        if lit is not UNK:
            return const(lit)
        if isinstance(node, cst.Name):
            if node.value in ("True", "False", "None"):
                return const({"True": True, "False": False, "None": None}[node.value])
            return self._name(node)
        if isinstance(node, cst.Attribute):
            return self._name(node)
        if isinstance(node, cst.UnaryOperation):
            v = self.values(node.expression)
            if isinstance(node.operator, cst.Not):
                return t_not(truth(v))
            if isinstance(node.operator, cst.Minus):
                return tuple(UNK if x is UNK or isinstance(x, str) else -x for x in v)
            return ALL_UNK
        if isinstance(node, cst.BooleanOperation):
            left, right = truth(self.values(node.left)), truth(self.values(node.right))
            return (
                t_and(left, right)
                if isinstance(node.operator, cst.And)
                else t_or(left, right)
            )
        if isinstance(node, cst.Comparison):
            env = self._in_environ(node)
            if env is not None:
                return env
            left = self.values(node.left)
            result = TRUE
            for target in node.comparisons:
                right = self.values(target.comparator)
                step = tuple(
                    _compare(target.operator, x, y) for x, y in zip(left, right)
                )
                result = t_and(result, truth(step))
                left = right
            return result
        if isinstance(node, cst.BinaryOperation):
            x, y = self.values(node.left), self.values(node.right)
            return tuple(_binop(node.operator, p, q) for p, q in zip(x, y))
        if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
            items = [
                self.values(e.value)
                for e in node.elements
                if not isinstance(e, cst.StarredElement)
            ]
            if len(items) != len(node.elements):
                return ALL_UNK
            return tuple(
                UNK
                if any(it[i] is UNK for it in items)
                else tuple(it[i] for it in items)
                for i in range(N)
            )
        if isinstance(node, cst.IfExp):
            test = truth(self.values(node.test))
            body, orelse = self.values(node.body), self.values(node.orelse)
            out = []
            for i in range(N):
                if test[i] is True:
                    out.append(body[i])
                elif test[i] is False:
                    out.append(orelse[i])
                else:
                    out.append(UNK)
            if all(t is UNK for t in test):
                return _combine([body, orelse])
            return tuple(out)
        if isinstance(node, cst.Subscript):
            return self._subscript(node)
        if isinstance(node, cst.Call):
            return self._call(node)
        if isinstance(node, (cst.FormattedString,)):
            parts = [
                self.values(p.expression)
                for p in node.parts
                if isinstance(p, cst.FormattedStringExpression)
            ]
            return (
                ALL_UNK
                if not any(depends(p) for p in parts)
                else tuple(UNK if i else "0" for i in range(N))
            )
        return ALL_UNK

    def _in_environ(self, node: cst.Comparison) -> tuple | None:
        """`"LOCAL_RANK" in os.environ`: true under a launcher (torchrun sets these)."""
        if (
            len(node.comparisons) != 1
            or dotted(node.comparisons[0].comparator) != "os.environ"
        ):
            return None
        if (
            not isinstance(node.left, cst.SimpleString)
            or (node.left.evaluated_value or "") not in LAUNCHER_ENV
        ):
            return None
        return const(isinstance(node.comparisons[0].operator, cst.In))

    def _env(self, key: cst.BaseExpression | None) -> tuple:
        if isinstance(key, cst.SimpleString):
            kind = ENV.get(key.evaluated_value or "")
            if kind is not None:
                v = _leaf(kind)
                return (
                    tuple(str(x) for x in v)
                    if kind in ("g", "l", "n", "W", "LW")
                    else v
                )
        return ALL_UNK

    def _subscript(self, node: cst.Subscript) -> tuple:
        if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            return ALL_UNK
        key = node.slice[0].slice.value
        if dotted(node.value) == "os.environ":
            return self._env(key)
        if not isinstance(key, cst.SimpleString) or not isinstance(
            key.evaluated_value, str
        ):
            return ALL_UNK
        # cfg["local_rank"] = args.local_rank somewhere; else judged by the key, like a name
        text = f"{dotted(node.value)}[{key.value}]"
        options = []
        for asg in self.a.assigns:
            if (
                isinstance(asg, cst.Assign)
                and len(asg.targets) == 1
                and isinstance(asg.targets[0].target, cst.Subscript)
            ):
                t = asg.targets[0].target
                if (
                    len(t.slice) == 1
                    and isinstance(t.slice[0].slice, cst.Index)
                    and f"{dotted(t.value)}[{getattr(t.slice[0].slice.value, 'value', '')}]"
                    == text
                ):
                    options.append(self.values(asg.value))
        got = _combine(options) if options else ALL_UNK
        if depends(got) or (options and all(x is not UNK for x in got)):
            return got
        return self._by_name(key.evaluated_value)

    def _call(self, call: cst.Call) -> tuple:
        a = self.a
        func = call.func
        d = dotted(func) or ""
        last = d.rsplit(".", 1)[-1]
        pos, kw = call_args(call)
        if (
            isinstance(func, cst.Name)
            and func.value in ("int", "float", "bool", "str")
            and pos
            and not self._bound(func)
        ):
            v = self.values(pos[0].value)
            conv = {"int": int, "float": float, "bool": bool, "str": str}[func.value]
            out = []
            for x in v:
                try:
                    out.append(UNK if x is UNK else conv(x))
                except Exception:
                    out.append(UNK)
            return tuple(out)
        qs = a.qualified(func)
        if qs & {"os.environ.get", "os.getenv"} or d in ("os.environ.get", "os.getenv"):
            return self._env(pos[0].value if pos else None)
        for q in qs:
            if q in API_CALLS:
                return _leaf(API_CALLS[q])
        if isinstance(func, cst.Attribute) and last in METHOD_CALLS:
            return _leaf(METHOD_CALLS[last])
        own = self.facts.own_call(call) if self.facts is not None else last
        fns = a.functions.get(own) if own else None
        if fns:
            options = [self._returns(fn) for fn in fns[:3]]
            got = _combine(options)
            if depends(got) or any(x is not UNK for x in got):
                return got
        if last in RANK_FUNC and not pos:
            return _leaf(RANK_FUNC[last])
        if MAIN_FUNC.match(last) and (not pos or not fns):
            return _leaf(
                "main"
            )  # is_main_process(), utils.is_primary(args) of another module
        if LOCAL_MAIN_FUNC.match(last) and not pos:
            return _leaf("local_main")
        return ALL_UNK

    def _returns(self, fn: cst.FunctionDef) -> tuple:
        values = [
            self.values(r.value)
            for r in self.a.findall(fn, m.Return())
            if r.value is not None and self.a.function_of(r) is fn
        ]
        return _combine(values) if values else ALL_UNK

    def _bound(self, name: cst.Name) -> bool:
        return any(
            name.value in names for names in self.a.bindings.values()
        ) and name.value not in ("int", "float", "bool", "str")

    def _name(self, node: cst.CSTNode) -> tuple:
        a = self.a
        d = dotted(node)
        if d is None:
            return ALL_UNK
        fn = a.function_of(node)
        key = (id(fn), d)
        got = self._names.get(key)
        if got is not None:
            return got
        self._names[key] = ALL_UNK
        got = self._resolve(node, d, fn)
        self._names[key] = got
        return got

    def _resolve(self, node: cst.CSTNode, d: str, fn) -> tuple:
        a = self.a
        options: list[tuple] = []
        if "." not in d:
            params = [p for p in fn.params.params] if fn is not None else []
            param = next((p for p in params if p.name.value == d), None)
            if param is not None:
                options = self._param_values(fn, param)
            else:
                if fn is not None and a._is_local(fn, d) and self._synced(fn, d):
                    return ALL_UNK  # made the same on every rank by a broadcast of it
                values = (
                    a._local_values(fn, d)
                    if fn is not None and a._is_local(fn, d)
                    else []
                )
                if not values:
                    values = a._local_values(None, d) + self._global_writes(d)
                options = [self.values(v) for v in values]
        else:
            values = self._attribute_values(node, d, fn)
            options = [self.values(v) for v in values]
        got = _combine(options) if options else ALL_UNK
        if depends(got) or (options and all(x is not UNK for x in got)):
            return got
        return self._by_name(d.rsplit(".", 1)[-1], "." in d)

    def _synced(self, fn, name: str) -> bool:
        """The function broadcasts the name from one rank (`broadcast(tensor=flag, src=0)`,
        `broadcast_object_list(flag, ...)`): what it holds afterwards is every rank's."""
        a = self.a
        for c in a.findall(fn, m.Call()):
            if not a.is_call(
                c,
                "torch.distributed.broadcast",
                "torch.distributed.broadcast_object_list",
            ):
                continue
            pos, kw = call_args(c)
            given = pos[0] if pos else kw.get("tensor") or kw.get("object_list")
            if given is not None and dotted(given.value) == name:
                return True
        return False

    def _by_name(self, last: str, attribute: bool = False) -> tuple:
        if attribute and last in API_ATTRS:
            return _leaf(API_ATTRS[last])
        if LOCAL_NAME.match(last):
            return _leaf("l")
        if GLOBAL_NAME.match(last):
            return _leaf("g")
        if LOCAL_MAIN_NAME.match(last):
            return _leaf("local_main")
        if MAIN_NAME.match(last):
            return _leaf("main")
        if WORLD_NAME.match(last):
            return _leaf("W")
        if LOCAL_WORLD_NAME.match(last):
            return _leaf("LW")
        return ALL_UNK

    def _global_writes(self, name: str) -> list:
        """Values given to a module-level name inside functions that declare it `global`."""
        if self._global_assigns is None:
            index: dict[str, list] = {}
            for g in self.a.findall(self.a.module, m.Pattern(cst.Global)):
                fn = self.a.function_of(g)
                for n in g.names:
                    index.setdefault(n.name.value, [])
                    if fn is not None:
                        index[n.name.value] += self.a._local_values(fn, n.name.value)
            self._global_assigns = index
        return self._global_assigns.get(name, [])

    def _attribute_values(self, node: cst.CSTNode, d: str, fn) -> list:
        """Values assigned to `self.x` in the class, or to `args.x` anywhere."""
        a = self.a
        cls = a.class_of(node) if d.startswith("self.") else None
        out = []
        for asg in a.assigns:
            if not isinstance(asg, cst.Assign):
                continue
            if any(dotted(t.target) == d for t in asg.targets):
                if d.startswith("self.") and a.class_of(asg) is not cls:
                    continue
                out.append(asg.value)
        return out

    def _param_values(self, fn: cst.FunctionDef, param: cst.Param) -> list[tuple]:
        a = self.a
        name = param.name.value
        if self._spawn_index(fn, param):
            return [_leaf("l")]
        out = []
        if (
            fn.name.value == "__init__"
            or a.class_of(fn) is None
            or name not in ("self", "cls")
        ):
            for call in a.callers(fn)[:8]:
                try:
                    arg = a.argument_for(call, fn, name)
                except ValueError:
                    arg = None
                if arg is None and param.default is not None:
                    arg = param.default
                if arg is not None:
                    out.append(self.values(arg))
        if not out and param.default is not None:
            out.append(self.values(param.default))
        return out

    def _spawn_index(self, fn: cst.FunctionDef, param: cst.Param) -> bool:
        """The first parameter of a function mp.spawn starts: the process index."""
        if not fn.params.params or fn.params.params[0] is not param:
            return False
        if self._spawned is None:
            self._spawned = set()
            for c in self.a.calls:
                if self.a.is_call(
                    c,
                    "torch.multiprocessing.spawn",
                    "torch.multiprocessing.start_processes",
                ):
                    pos, kw = call_args(c)
                    target = (
                        pos[0].value if pos else kw["fn"].value if "fn" in kw else None
                    )
                    name = dotted(target) if target is not None else None
                    for f in self.a.functions.get((name or "").rsplit(".", 1)[-1], []):
                        self._spawned.add(id(f))
        return id(fn) in self._spawned


_NAMES = m.Name() | m.Attribute() | m.Call()
