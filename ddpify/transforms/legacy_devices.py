"""A modernised legacy script gets the device-aware set-up of a fresh conversion: NCCL only with
CUDA (gloo otherwise), torch.cuda.set_device only with CUDA, .cuda() and device_ids on the
rank's GPU or the CPU. Legacy recipes (apex, torch.distributed.launch) were written for GPUs
only; as written they cannot run on a CPU machine, nor under `ddpify verify` there."""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import call_args, code, dotted
from ddpify.analysis.tree import text_of
from ddpify.transforms.apex_common import module_block, module_name
from ddpify.transforms.base import Transform
from ddpify.transforms.device import DeviceTransform
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP013",
    "legacy-device-aware",
    "legacy set-up made device-aware: NCCL and set_device only with CUDA, .cuda() to LOCAL_DEVICE",
    fix=True,
    check="devices",
)

CUDA = "torch.cuda.is_available()"
LOCAL_DEVICE = """\
# ddpify: this process's device: its GPU (LOCAL_RANK, set by torchrun and the legacy launcher), else the CPU.
LOCAL_DEVICE = torch.device("cuda", int({os}.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else torch.device("cpu")
"""
DDP_NAMES = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "apex.parallel.DistributedDataParallel",
)


def _guarded(a, node: cst.CSTNode) -> bool:
    """Inside an `if` whose test asks for CUDA (`if torch.cuda.is_available():`, `if use_cuda:`)."""
    cuda_names = {
        dotted(t.target)
        for asg in a.assigns
        if isinstance(asg, cst.Assign) and "cuda" in code(asg.value)
        for t in asg.targets
    }
    cur = a.parent.get(node)
    while cur is not None:
        if isinstance(cur, (cst.If, cst.IfExp)):
            text = code(cur.test)
            if "cuda" in text or any(n and n in text for n in cuda_names):
                return True
        cur = a.parent.get(cur)
    return False


def _nccl_only(a, backend: cst.BaseExpression) -> bool:
    """A backend that is NCCL whatever the machine: "nccl", args.backend (an argparse default),
    or a name bound to "nccl" alone; not one that already picks gloo without CUDA."""
    if isinstance(backend, cst.SimpleString):
        return "nccl" in backend.value
    if isinstance(
        backend, cst.Attribute
    ):  # args.dist_backend: its argparse default decides
        flag = backend.attr.value
        for call in a.calls:
            if not (
                isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "add_argument"
            ):
                continue
            pos, kw = call_args(call)
            names = {
                text_of(x.value).lstrip("-").replace("-", "_")
                for x in pos
                if text_of(x.value) is not None
            }
            if flag in names or (
                "dest" in kw and code(kw["dest"].value).strip("'\"") == flag
            ):
                default = code(kw["default"].value) if "default" in kw else ""
                return "gloo" not in default and "cuda" not in default
        return "gloo" not in code(backend) and "cuda" not in code(backend)
    if isinstance(backend, cst.Name):
        values = a._local_values(a.function_of(backend), backend.value)
        return bool(values) and all(
            isinstance(v, cst.SimpleString) and "nccl" in v.value for v in values
        )
    return False


class LegacyDevicesTransform(Transform):
    name = "legacy-devices"

    def plan(self, ctx) -> None:
        if (
            ctx.opts.amp != "apex"
        ):  # the apex target keeps the GPU-only recipe as written
            plan_device_aware(ctx)


def plan_device_aware(ctx) -> None:
    a = ctx.a
    uses_device = False
    for call in a.calls:
        if not ctx.editable(call) or _guarded(a, call):
            continue
        if a.is_call(call, "torch.cuda.set_device"):
            stmt = a.statement(call)
            if (
                isinstance(stmt, cst.SimpleStatementLine)
                and len(stmt.body) == 1
                and isinstance(stmt.body[0], cst.Expr)
                and stmt.body[0].value is call
            ):
                ctx.edits.replace(
                    stmt,
                    lambda n: cst.If(
                        test=cst.parse_expression(CUDA),
                        body=cst.IndentedBlock(body=[n.with_changes(leading_lines=())]),
                        leading_lines=n.leading_lines,
                    ),
                )
                ctx.finding(
                    call,
                    "DDP013",
                    "torch.cuda.set_device only where CUDA is available, so the script also runs on a CPU machine",
                    True,
                )
        elif a.is_call(call, "torch.distributed.init_process_group"):
            pos, kw = call_args(call)
            backend = (
                kw["backend"].value
                if "backend" in kw
                else (pos[0].value if pos else None)
            )
            if backend is None or not _nccl_only(a, backend):
                continue
            ctx.edits.replace(
                backend,
                lambda n: cst.IfExp(
                    test=cst.parse_expression(CUDA),
                    body=n,
                    orelse=cst.SimpleString('"gloo"'),
                    whitespace_before_if=cst.SimpleWhitespace(" "),
                    whitespace_after_if=cst.SimpleWhitespace(" "),
                    whitespace_before_else=cst.SimpleWhitespace(" "),
                    whitespace_after_else=cst.SimpleWhitespace(" "),
                ),
            )
            ctx.finding(
                backend,
                "DDP013",
                f"backend {code(backend)} with CUDA, gloo without: the script also runs on a CPU machine",
                True,
            )
        elif (
            isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "cuda"
            and dotted(call.func.value) != "torch"
        ):
            DeviceTransform()._cuda_call(ctx, call)
            uses_device = True
        elif a.is_call(call, "torch.cuda.synchronize") and not call.args:
            ctx.edits.replace(
                call,
                ctx.expr(
                    'torch.cuda.synchronize(LOCAL_DEVICE) if LOCAL_DEVICE.type == "cuda" else None'
                ),
            )
            uses_device = True
        elif a.is_call(call, *DDP_NAMES):
            _, kw = call_args(call)
            for key in ("device_ids", "output_device"):
                if (
                    key in kw
                    and "cuda" not in code(kw[key].value)
                    and code(kw[key].value) != "None"
                ):
                    ctx.edits.replace(
                        kw[key].value,
                        lambda n: ctx.expr(f"{code(n)} if {CUDA} else None"),
                    )
                    ctx.finding(
                        kw[key].value,
                        "DDP013",
                        f"{key} only with CUDA: DDP takes none for a CPU module",
                        True,
                    )
    if uses_device:
        ctx.preamble.extend(
            module_block(LOCAL_DEVICE.format(os=module_name(ctx, "os")))
        )
