"""Does the script handle devices at all? A script that never names one (no `.cuda()`, no
`torch.device`, no `device`/`gpu`/`cuda` name, no "cuda" string, no DataParallel) trains on
the CPU wherever it runs: its conversion keeps that (a CPU DDP program over gloo) instead of
guessing where its model and every tensor would have to go on a GPU. The test is lexical and
errs towards "handles devices": a script it passes names none of these anywhere.
"""

from __future__ import annotations

import re

import libcst as cst
import ddpify.match as m
from ddpify.analysis.tree import call_args, dotted

# names that speak of a device or of GPU-only parallelism (use_cuda, ngpu, DataParallel, ...);
# the short ones only as a whole part of the name (xla_device, but not output)
DEVICE_NAME = re.compile(
    r"cuda|device|gpu|parallel|accelerat|(?:^|_)(?:mps|xla|tpu|npu)(?:_|\d|$)",
    re.IGNORECASE,
)
# strings that name a device ("cuda:0", "mps", "torch.cuda.FloatTensor", ...)
DEVICE_STRING = re.compile(
    r"cuda|^\s*(?:mps|xla|gpu|tpu|npu)(?::\d+)?\s*$", re.IGNORECASE
)


def device_handling(a) -> cst.CSTNode | None:
    """The first node of the script that names a device, or None when there is none (the
    script trains on the CPU)."""
    found: list[cst.CSTNode] = []
    for node in a.findall(a.module, m.Name()):
        if DEVICE_NAME.search(node.value):
            found.append(node)
            break
    for node in a.findall(a.module, m.SimpleString()):
        try:
            text = node.evaluated_value
        except Exception:  # bytes with odd escapes: judge the literal as written
            text = node.value
        if isinstance(text, bytes):
            text = text.decode("latin-1")
        if DEVICE_STRING.search(text):
            found.append(node)
            break
    for node in a.findall(a.module, m.FormattedStringText()):
        if DEVICE_STRING.search(node.value):
            found.append(node)
            break
    if not found:
        return None
    return min(found, key=lambda n: a.pos[n].start.line)


def gpu_index_literals(a) -> list[cst.Integer]:
    """Integer literals that reach a device argument (`.to(i)`, `.cuda(i)`, `device=i`), directly
    or through names, function parameters and `self` attributes (`device = 0` ... `main(device)`
    ... `Trainer(..., gpu_id)` ... `model.to(self.gpu_id)`): a GPU index that pins every rank to
    the same GPU."""
    found: dict[int, cst.Integer] = {}
    seen: set[tuple[int, str]] = set()

    def origins(expr: cst.CSTNode, fn: cst.FunctionDef | None, depth: int) -> None:
        if depth > 8:
            return
        if isinstance(expr, cst.Integer):
            found[id(expr)] = expr
            return
        if isinstance(expr, cst.IfExp):  # `0 if torch.cuda.is_available() else "cpu"`
            origins(expr.body, fn, depth + 1)
            origins(expr.orelse, fn, depth + 1)
            return
        name = dotted(expr)
        if name is None or (id(fn), name) in seen:
            return
        seen.add((id(fn), name))
        if name.startswith("self.") and name.count(".") == 1:
            cls = a.class_of(fn) if fn is not None else None
            for asg in a.assigns:
                if (
                    isinstance(asg, cst.Assign)
                    and cls is not None
                    and a.class_of(asg) is cls
                    and any(dotted(t.target) == name for t in asg.targets)
                ):
                    origins(asg.value, a.function_of(asg), depth + 1)
            return
        if "." in name:
            return
        if fn is not None and name in [p.name.value for p in fn.params.params]:
            for call in a.callers(fn):
                arg = a.argument_for(call, fn, name)
                if arg is not None:
                    origins(arg, a.function_of(call), depth + 1)
            return
        values = a._local_values(fn, name) if fn is not None else []
        for value in values or a._local_values(None, name):
            origins(value, fn if values else None, depth + 1)

    for call in a.calls:
        func = call.func
        pos, kw = call_args(call)
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value in ("to", "cuda")
            and pos
            and dotted(func.value) != "torch"
        ):
            origins(pos[0].value, a.function_of(call), 0)
        if "device" in kw:
            origins(kw["device"].value, a.function_of(call), 0)
    return sorted(
        found.values(), key=lambda n: (a.pos[n].start.line, a.pos[n].start.column)
    )


DTYPES = re.compile(
    r"^(torch\.)?(float|double|half|bfloat16|int|long|short|bool|uint8|int8|complex|cfloat|memory_format|channels_last)"
)


def places_anything(a) -> bool:
    """The script puts a module or tensor on a device somewhere: .cuda(), .to(<not a dtype>),
    a device= argument, set_device, DataParallel, a default device. A script that only asks
    whether CUDA is there (autocast or a GradScaler enabled by torch.cuda.is_available()) and
    places nothing still trains on the CPU."""
    for call in a.calls:
        func = call.func
        pos, kw = call_args(call)
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == "cuda"
            and dotted(func.value) != "torch"
        ):
            return True
        if isinstance(func, cst.Attribute) and func.attr.value in ("to", "to_empty"):
            first = (
                pos[0].value if pos else kw["device"].value if "device" in kw else None
            )
            text = (dotted(first) or "") if first is not None else ""
            if (
                first is not None
                and not DTYPES.match(text)
                and not (
                    isinstance(first, cst.Attribute) and DTYPES.match(first.attr.value)
                )
            ):
                return True
        if "device" in kw or a.is_call(
            call,
            "torch.cuda.set_device",
            "torch.set_default_device",
            "torch.nn.DataParallel",
            "torch.nn.parallel.DataParallel",
        ):
            return True
    return False
