"""Device placement: every CUDA device the script names becomes the rank's own GPU."""

from __future__ import annotations

import re

import libcst as cst
import ddpify.match as m

from ddpify.analysis import call_args, dotted
from ddpify.analysis.devices import gpu_index_literals
from ddpify.transforms.base import Context, Transform
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP010",
    "device-per-rank",
    "device pinned to one GPU index moved to the rank's own GPU",
    fix=True,
    check="devices",
)
declare(
    "DDP011",
    "device-unresolved",
    "device could not be resolved statically; check that it follows LOCAL_RANK",
)
declare(
    "DDP012",
    "cuda-visible-devices",
    "CUDA_VISIBLE_DEVICES set by the script: kept for plain runs only (where it cannot be, every rank would see the same GPUs)",
    severity="blocking",
    fix=True,
    check="devices",
)

PINNED = re.compile(r"""^(?P<q>['"])cuda:\d+(?P=q)$""")
BARE = re.compile(r"""^(?P<q>['"])cuda(?P=q)$""")
DEVICE_FLAGS = ("--device",)
VISIBLE = "CUDA_VISIBLE_DEVICES"
GPU_FLAGS = ("--gpu", "--gpu-id", "--gpu_id", "--gpu-index", "--cuda-device")


class DeviceTransform(Transform):
    name = "device"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        for call in a.calls:
            if not ctx.editable(call):
                continue
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value == "cuda"
                and dotted(func.value) != "torch"
            ):
                self._cuda_call(ctx, call)
            elif a.is_call(call, "torch.device"):
                self._torch_device(ctx, call)
            elif a.is_call(call, "torch.cuda.synchronize") and not call.args:
                # CUDA-only call: synchronise this rank's device, and nothing on CPU
                ctx.edits.replace(
                    call,
                    ctx.expr(
                        'torch.cuda.synchronize(LOCAL_DEVICE) if LOCAL_DEVICE.type == "cuda" else None'
                    ),
                )
                ctx.finding(
                    call,
                    "DDP010",
                    "torch.cuda.synchronize() waits for this rank's device (a no-op on CPU)",
                    True,
                )
            elif a.is_call(call, "torch.cuda.set_device"):
                stmt = a.statement(call)
                if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
                    ctx.edits.removed.add(stmt)
                    ctx.finding(
                        call,
                        "DDP010",
                        "torch.cuda.set_device removed: ddp_setup() selects LOCAL_RANK's GPU",
                        True,
                    )
            elif isinstance(func, cst.Attribute) and func.attr.value == "to":
                for arg in call.args[:1]:
                    if (
                        arg.keyword is None
                        and isinstance(arg.value, cst.SimpleString)
                        and BARE.match(arg.value.value)
                    ):
                        ctx.edits.replace(arg.value, ctx.expr("LOCAL_DEVICE"))
                        ctx.finding(
                            arg.value,
                            "DDP010",
                            '"cuda" becomes LOCAL_DEVICE, this rank\'s GPU',
                            True,
                        )
            for arg in call.args:
                if (
                    arg.keyword is not None
                    and arg.keyword.value == "device"
                    and isinstance(arg.value, cst.SimpleString)
                    and BARE.match(arg.value.value)
                ):
                    ctx.edits.replace(arg.value, ctx.expr("LOCAL_DEVICE"))
                    ctx.finding(
                        arg.value,
                        "DDP010",
                        'device="cuda" becomes LOCAL_DEVICE, this rank\'s GPU',
                        True,
                    )
        # device = "cuda": the rank's own device (and a CPU run still works)
        for asg in a.assigns:
            value = asg.value
            if (
                isinstance(asg, cst.Assign)
                and isinstance(value, cst.SimpleString)
                and BARE.match(value.value)
                and ctx.editable(asg)
            ):
                names = [dotted(t.target) or "" for t in asg.targets]
                if any("device" in n.lower() or n.lower() in ("dev",) for n in names):
                    ctx.edits.replace(value, ctx.expr("LOCAL_DEVICE"))
                    ctx.finding(
                        value,
                        "DDP010",
                        f'{names[0]} = "cuda" becomes LOCAL_DEVICE, this rank\'s GPU',
                        True,
                    )
        # any literal pinned to one GPU index
        for node in a.findall(a.module, m.SimpleString()):
            if (
                PINNED.match(node.value)
                and ctx.editable(node)
                and not self._inside_torch_device(ctx, node)
            ):
                ctx.edits.replace(node, ctx.expr('f"cuda:{LOCAL_RANK}"'))
                ctx.finding(
                    node,
                    "DDP010",
                    f"{node.value} pinned every rank to one GPU; now cuda:LOCAL_RANK",
                    True,
                )
        # a GPU index that reaches a device argument: `device = 0` ... `.to(device)`
        for lit in gpu_index_literals(a):
            if ctx.editable(lit):
                ctx.edits.replace(lit, ctx.expr("LOCAL_RANK"))
                ctx.finding(
                    lit,
                    "DDP010",
                    f"GPU index {lit.value} pinned every rank to one GPU; now LOCAL_RANK, this rank's GPU",
                    True,
                )
        self._flags(ctx)
        self._visible_devices(ctx)

    def _visible_devices(self, ctx: Context) -> None:
        """os.environ["CUDA_VISIBLE_DEVICES"] = "0" in the script: under torchrun every rank would
        see that one GPU (rank 1: `device_id cuda:1 is out of range`). It is kept for a plain
        `python` run only; under torchrun the launching shell chooses the GPUs."""
        a = ctx.a
        for stmt, env in _visible_device_settings(a):
            if not ctx.editable(stmt):
                continue
            if env is None:
                ctx.finding(
                    stmt,
                    "DDP012",
                    'CUDA_VISIBLE_DEVICES is set together with other variables here: under torchrun every rank would see only those GPUs; set it only when "LOCAL_RANK" not in os.environ',
                    False,
                )
                continue
            ctx.edits.before[stmt].append(
                cst.If(
                    test=ctx.expr(f'"LOCAL_RANK" not in {env}'),
                    body=cst.IndentedBlock(body=[stmt.with_changes(leading_lines=())]),
                    leading_lines=stmt.leading_lines,
                )
            )
            ctx.edits.removed.add(stmt)
            ctx.finding(
                stmt,
                "DDP012",
                "CUDA_VISIBLE_DEVICES set for a plain run only: under torchrun each rank uses GPU LOCAL_RANK of those the shell makes visible",
                True,
            )

    def _inside_torch_device(self, ctx: Context, node: cst.CSTNode) -> bool:
        par = ctx.a.parent.get(ctx.a.parent.get(node))
        return (
            isinstance(par, cst.Call)
            and ctx.a.is_call(par, "torch.device")
            and len(par.args) == 1
            and par.args[0].value is node
        )

    def _cuda_call(self, ctx: Context, call: cst.Call) -> None:
        keep = [
            a
            for a in call.args
            if a.keyword is not None and a.keyword.value == "non_blocking"
        ]
        args = [cst.Arg(ctx.expr("LOCAL_DEVICE"))] + [
            a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in keep
        ]
        args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args]

        def fn(node: cst.CSTNode, args=args) -> cst.CSTNode:
            return node.with_changes(
                func=node.func.with_changes(attr=cst.Name("to")), args=_commas(args)
            )

        ctx.edits.replace(call, fn)
        ctx.finding(
            call,
            "DDP010",
            ".cuda() becomes .to(LOCAL_DEVICE), this rank's device",
            True,
        )

    def _torch_device(self, ctx: Context, call: cst.Call) -> None:
        pos, kw = call_args(call)
        if not pos:
            return
        first = pos[0].value
        if isinstance(first, cst.SimpleString) and (
            BARE.match(first.value) or PINNED.match(first.value)
        ):
            ctx.edits.replace(call, ctx.expr("LOCAL_DEVICE"))
            ctx.finding(
                call,
                "DDP010",
                f"torch.device({first.value}) becomes LOCAL_DEVICE, this rank's GPU",
                True,
            )
        elif isinstance(
            first, (cst.FormattedString,)
        ) and "cuda" in first.start + "".join(
            p.value for p in first.parts if isinstance(p, cst.FormattedStringText)
        ):
            ctx.edits.replace(call, ctx.expr("LOCAL_DEVICE"))
            ctx.finding(
                call,
                "DDP010",
                "a device built from a GPU index becomes LOCAL_DEVICE",
                True,
            )

    def _flags(self, ctx: Context) -> None:
        """--device / --gpu flags: a value given on the command line reaches every rank, so
        it is mapped onto the rank's own GPU right after parsing."""
        a = ctx.a
        flags: dict[str, str] = {}
        for call in a.calls:
            if (
                isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "add_argument"
            ):
                names = [
                    x.value.evaluated_value
                    for x in call.args
                    if x.keyword is None and isinstance(x.value, cst.SimpleString)
                ]
                _, kw = call_args(call)
                dest = (
                    kw["dest"].value.evaluated_value
                    if "dest" in kw and isinstance(kw["dest"].value, cst.SimpleString)
                    else None
                )
                for n in names:
                    if n in DEVICE_FLAGS:
                        flags["device"] = dest or n.lstrip("-").replace("-", "_")
                    if n in GPU_FLAGS:
                        flags["gpu"] = dest or n.lstrip("-").replace("-", "_")
        if not flags:
            return
        for call in a.calls:
            if not (
                isinstance(call.func, cst.Attribute)
                and call.func.attr.value in ("parse_args", "parse_known_args")
            ):
                continue
            stmt = a.statement(call)
            target = a._assign_target(call)
            if (
                target is None
                or not isinstance(stmt, cst.SimpleStatementLine)
                or not ctx.editable(stmt)
            ):
                ctx.finding(
                    call,
                    "DDP011",
                    "the --device/--gpu value is not mapped to LOCAL_RANK here: `cuda` is the rank's own GPU (set_device), but a `cuda:N` given on the command line puts every rank on GPU N; use LOCAL_DEVICE",
                    False,
                )
                continue
            if call.func.attr.value == "parse_known_args":
                continue
            new = []
            if "device" in flags:
                d = f"{target}.{flags['device']}"
                new.append(
                    ctx.stmt(
                        f'{d} = str(LOCAL_DEVICE) if str({d}).startswith("cuda") else {d}\n'
                    )
                )
            if "gpu" in flags:
                new.append(ctx.stmt(f"{target}.{flags['gpu']} = LOCAL_RANK\n"))
            ctx.edits.after[stmt].extend(new)
            ctx.finding(
                call,
                "DDP010",
                "--device/--gpu now name this rank's GPU (LOCAL_RANK)",
                True,
            )


def _visible_device_settings(a) -> list[tuple[cst.SimpleStatementLine, str | None]]:
    """Statements that set CUDA_VISIBLE_DEVICES in os.environ: (statement, the environ
    expression) where that is all they do, (statement, None) where they set more."""
    out: list[tuple[cst.SimpleStatementLine, str | None]] = []

    def environ(node) -> str | None:
        name = dotted(node)
        return (
            name
            if name is not None and any(q == "os.environ" for q in a.qualified(node))
            else None
        )

    def key(node) -> bool:
        return isinstance(node, cst.SimpleString) and node.evaluated_value == VISIBLE

    for asg in a.assigns:
        if (
            isinstance(asg, cst.Assign)
            and len(asg.targets) == 1
            and isinstance(asg.targets[0].target, cst.Subscript)
        ):
            sub = asg.targets[0].target
            el = sub.slice[0].slice if len(sub.slice) == 1 else None
            env = environ(sub.value)
            if env and isinstance(el, cst.Index) and key(el.value):
                stmt = a.statement(asg)
                if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
                    out.append((stmt, env))
    for call in a.calls:
        if not isinstance(call.func, cst.Attribute) or call.func.attr.value not in (
            "setdefault",
            "update",
            "putenv",
        ):
            continue
        meth = call.func.attr.value
        env = (
            environ(call.func.value)
            if meth != "putenv"
            else (
                dotted(call.func.value) + ".environ"
                if a.is_call(call, "os.putenv")
                else None
            )
        )
        if not env:
            continue
        pos, kw = call_args(call)
        if meth in ("setdefault", "putenv"):
            hit, alone = bool(pos) and key(pos[0].value), True
        else:
            items = (
                pos[0].value.elements
                if pos and isinstance(pos[0].value, cst.Dict)
                else []
            )
            keys = [e.key for e in items if isinstance(e, cst.DictElement)] + [
                cst.SimpleString(repr(k)) for k in kw
            ]
            hit = any(key(k) for k in keys)
            alone = len(keys) == 1 and len(call.args) == 1
        stmt = a.statement(call)
        if hit:
            single = (
                isinstance(stmt, cst.SimpleStatementLine)
                and len(stmt.body) == 1
                and isinstance(stmt.body[0], cst.Expr)
            )
            out.append((stmt, env if alone and single else None))
    return out


def _commas(args: list[cst.Arg]) -> list[cst.Arg]:
    out = []
    for i, a in enumerate(args):
        out.append(
            a.with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                if i < len(args) - 1
                else cst.MaybeSentinel.DEFAULT
            )
        )
    return out
