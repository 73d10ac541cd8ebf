"""The code of a model's class, for --optimize: where the class is (this file, or a module of
the script's own directory it is imported from), the classes and helpers of that file it
builds, and what the speed-up checks ask of that code: does it hold 2-d convolutions, does it
do layout-dependent things (`.view`, strides), is its forward graph the same every step, does
its input go straight into a 2-d convolution. Unsure answers are the conservative ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import libcst as cst
import ddpify.match as m
from ddpify.analysis.core import Analysis
from ddpify.analysis.tree import call_args, code, dotted

CONV2D = ("torch.nn.Conv2d", "torch.nn.ConvTranspose2d", "torch.nn.LazyConv2d")
CONV3D = ("torch.nn.Conv3d", "torch.nn.ConvTranspose3d", "torch.nn.LazyConv3d")
# What SyncBatchNorm.convert_sync_batchnorm converts (torch's _BatchNorm layers).
BATCHNORM = tuple(
    f"torch.nn.{k}"
    for k in (
        "BatchNorm1d",
        "BatchNorm2d",
        "BatchNorm3d",
        "LazyBatchNorm1d",
        "LazyBatchNorm2d",
        "LazyBatchNorm3d",
        "SyncBatchNorm",
    )
)
# Tensor methods whose result depends on the memory layout (or fail on a channels-last tensor).
LAYOUT_METHODS = (
    "view",
    "view_as",
    "stride",
    "is_contiguous",
    "data_ptr",
    "as_strided",
    "storage",
    "untyped_storage",
)

_parsed: dict[tuple[str, float], Analysis | None] = {}


@dataclass
class ModelCode:
    a: Analysis  # analysis of the file that holds the class
    root: (
        cst.ClassDef | None
    )  # None: an nn.Sequential of torch.nn layers (scopes holds the call)
    where: str  # "this file" or the module's file name
    scopes: list[cst.CSTNode] = field(
        default_factory=list
    )  # root, its classes and helpers in that file
    unknown: list[str] = field(
        default_factory=list
    )  # classes it builds that are neither torch.nn nor in that file

    @property
    def name(self) -> str:
        return self.root.name.value if self.root is not None else "nn.Sequential"

    def line(self, node: cst.CSTNode) -> str:
        return (
            f"{self.where}:{self.a.pos[node].start.line}"
            if self.where != "this file"
            else f"line {self.a.pos[node].start.line}"
        )


def _module_analysis(path: str) -> Analysis | None:
    try:
        key = (path, os.path.getmtime(path))
    except OSError:
        return None
    if key not in _parsed:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            _parsed[key] = Analysis(cst.parse_module(text), text)
        except (OSError, UnicodeDecodeError, cst.ParserSyntaxError, RecursionError):
            _parsed[key] = None
    return _parsed[key]


def _sibling(script_path: str, module: str) -> str | None:
    """The file of `module` (`models`, `pkg.models`, `.models`) next to the script, if any."""
    base = os.path.dirname(os.path.abspath(script_path))
    rel = module.lstrip(".").replace(".", os.sep)
    for cand in (
        os.path.join(base, rel + ".py"),
        os.path.join(base, rel, "__init__.py"),
    ):
        if rel and os.path.isfile(cand):
            return cand
    return None


def _find_class(
    a: Analysis, call: cst.Call, script_path: str
) -> tuple[Analysis, cst.ClassDef, str] | None:
    name = dotted(call.func)
    if name and name in a.classes:
        return a, a.classes[name], "this file"
    for q in a.qualified(call.func):
        module, _, cls = q.rpartition(".")
        if not module or module.startswith("torch"):
            continue
        path = _sibling(script_path, module)
        other = _module_analysis(path) if path else None
        if other is not None and cls in other.classes:
            return other, other.classes[cls], os.path.basename(path)
    return None


def model_code(a: Analysis, bind: cst.CSTNode, script_path: str) -> ModelCode | str:
    """The class of the model built in `bind`, or why it cannot be read."""
    calls = list(a.findall(bind, m.Call()))
    # model = build_model(): the classes that function of this file builds
    for c in list(calls):
        fname = dotted(c.func)
        for fn in a.functions.get(fname or "", []):
            calls += a.findall(fn, m.Call())
    for c in calls:
        found = _find_class(a, c, script_path)
        if found is not None:
            holder, cls, where = found
            mc = ModelCode(holder, cls, where)
            _collect(mc)
            return mc
    seq = next(
        (c for c in calls if a.is_call(c, "torch.nn.Sequential")), None
    )  # the outermost: calls are in tree order
    if seq is not None:
        # nn.Sequential(nn.Conv2d(...), ...): torch.nn layers only, whose forward is known
        mc = ModelCode(a, None, "this file", [seq])
        mc.unknown = [
            dotted(c.func) or "?"
            for c in a.findall(seq, m.Call())
            if _layer_arg(a, c)
            and not any(q.startswith("torch.nn.") for q in a.qualified(c.func))
        ]
        return mc
    built = next((dotted(c.func) for c in calls if dotted(c.func)), None)
    return f"its class ({built or code(bind).strip()[:40]}) is neither in this file nor in a module beside it"


def _layer_arg(a: Analysis, c: cst.Call) -> bool:
    """c is a layer handed to nn.Sequential (not an argument of a layer, such as int(...))."""
    arg = a.parent.get(c)
    return isinstance(arg, cst.Arg) and a.is_call(
        a.parent.get(arg), "torch.nn.Sequential"
    )


def _collect(mc: ModelCode) -> None:
    """The root class, its base classes and the classes and functions of its file it calls."""
    a = mc.a
    work: list[cst.CSTNode] = [mc.root]
    while work:
        node = work.pop()
        if node in mc.scopes:
            continue
        mc.scopes.append(node)
        refs = [b.value for b in node.bases] if isinstance(node, cst.ClassDef) else []
        refs += [c.func for c in a.findall(node, m.Call())]
        for ref in refs:
            name = dotted(ref)
            if not name:
                continue
            last = name.rsplit(".", 1)[-1]
            if name in a.classes:
                work.append(a.classes[name])
            elif name in a.functions:
                work.extend(a.functions[name])
            elif last[:1].isupper() and not any(
                q.startswith("torch.") for q in a.qualified(ref)
            ):
                if last not in ("super",) and last not in mc.unknown:
                    mc.unknown.append(last)


def _methods(mc: ModelCode, init: bool = False) -> list[cst.CSTNode]:
    """The code that runs in forward: methods other than __init__, and the file's helpers."""
    out = []
    for scope in mc.scopes:
        if isinstance(scope, cst.Call):
            continue  # nn.Sequential: torch.nn's own forward
        if isinstance(scope, cst.FunctionDef):
            out.append(scope)
            continue
        for st in scope.body.body:
            if (
                isinstance(st, cst.FunctionDef)
                and (st.name.value == "__init__") == init
            ):
                out.append(st)
    return out


def convolutions(mc: ModelCode, names: tuple[str, ...] = CONV2D) -> list[cst.Call]:
    return [
        c
        for s in mc.scopes
        for c in mc.a.findall(s, m.Call())
        if mc.a.is_call(c, *names)
    ]


def layout_hazards(a: Analysis, nodes: list[cst.CSTNode]) -> list[cst.Call]:
    """Calls in nodes whose result depends on the memory layout: `.view(...)`, `.stride()`, ..."""
    out = []
    for node in nodes:
        for c in a.findall(node, m.Call(func=m.Attribute())):
            if c.func.attr.value in LAYOUT_METHODS or a.is_call(c, "torch.as_strided"):  # type: ignore[attr-defined]
                out.append(c)
    return out


def model_hazards(mc: ModelCode) -> list[cst.Call]:
    unflatten = [
        c
        for s in mc.scopes
        for c in mc.a.findall(s, m.Call())
        if mc.a.is_call(c, "torch.nn.Unflatten")
    ]  # a .view inside
    return unflatten + layout_hazards(mc.a, _methods(mc))


def _static_iter(node: cst.BaseExpression) -> bool:
    """for-loop iterables that are the same every step: self.blocks, (a, b), range(3), zip/enumerate of those."""
    if isinstance(node, (cst.Tuple, cst.List)):
        return True
    d = dotted(node)
    if d and d.startswith("self."):
        return True
    if isinstance(node, cst.Call) and dotted(node.func) in (
        "range",
        "zip",
        "enumerate",
        "reversed",
    ):
        return all(
            isinstance(x.value, cst.Integer) or _static_iter(x.value) for x in node.args
        )
    return False


def dynamic_forward(mc: ModelCode) -> str | None:
    """Why the model's graph may change between steps (a branch, a loop over data, a class
    ddpify cannot read), or None where it provably does not."""
    if mc.unknown:
        return f"it builds {mc.unknown[0]}, whose code ddpify cannot read"
    a = mc.a
    for fn in _methods(mc):
        for node in a.findall(
            fn,
            m.If()
            | m.IfExp()
            | m.While()
            | m.Try()
            | m.Break()
            | m.Continue()
            | m.CompIf(),
        ):
            what = (
                type(node)
                .__name__.lower()
                .replace("compif", "comprehension filter")
                .replace("ifexp", "conditional expression")
            )
            return f"its code branches ({what} at {mc.line(node)})"
        for loop in a.findall(fn, m.For() | m.CompFor()):
            if not _static_iter(loop.iter):
                return f"it loops over {code(loop.iter).strip()[:40]} ({mc.line(loop)}), which may change between steps"
    return None


def input_goes_to_conv(mc: ModelCode) -> bool:
    """forward(self, x) hands x first to a Conv2d (or a Sequential that starts with one): x is a
    batch of images (4-d), which may be made channels-last too."""
    a = mc.a
    if mc.root is None:
        pos, _ = call_args(mc.scopes[0])  # type: ignore[arg-type]
        return (
            bool(pos)
            and isinstance(pos[0].value, cst.Call)
            and a.is_call(pos[0].value, *CONV2D)
        )
    forward = next(
        (
            s
            for s in mc.root.body.body
            if isinstance(s, cst.FunctionDef) and s.name.value == "forward"
        ),
        None,
    )
    init = next(
        (
            s
            for s in mc.root.body.body
            if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"
        ),
        None,
    )
    if forward is None or init is None or len(forward.params.params) < 2:
        return False
    x = forward.params.params[1].name.value
    first = next(
        (
            c
            for c in a.findall(forward, m.Call())
            if any(dotted(arg.value) == x for arg in c.args)
        ),
        None,
    )
    attr = dotted(first.func) if first is not None else None
    if not attr or not attr.startswith("self.") or attr.count(".") != 1:
        return False
    for asg in a.findall(init, m.Assign()):
        if any(dotted(t.target) == attr for t in asg.targets) and isinstance(
            asg.value, cst.Call
        ):
            value = asg.value
            if a.is_call(value, "torch.nn.Sequential"):
                pos, _ = call_args(value)
                value = pos[0].value if pos else None
            return isinstance(value, cst.Call) and a.is_call(value, *CONV2D)
    return False


def has_batchnorm(mc: ModelCode | str) -> bool | None:
    """Whether the model's code makes (or names) a BatchNorm layer; None where ddpify cannot
    read all of it (a class from elsewhere)."""
    if isinstance(mc, str):
        return None
    a = mc.a
    scopes, unknown = list(mc.scopes), set(mc.unknown)
    for (
        name
    ) in mc.unknown:  # nn.Sequential(block(...)): a helper of the file builds layers
        for node in a.functions.get(name, []) + (
            [a.classes[name]] if name in a.classes else []
        ):
            part = ModelCode(a, node, mc.where)
            _collect(part)
            scopes += part.scopes
            unknown.discard(name)
            unknown.update(part.unknown)
    for scope in scopes:
        for node in [*a.findall(scope, m.Attribute()), *a.findall(scope, m.Name())]:
            if any(q in BATCHNORM for q in a.qualified(node)):
                return True
    return None if unknown else False
