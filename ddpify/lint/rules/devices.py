"""Every rank on the same device: a hard-coded GPU index, CUDA's default device with no
set_device, or a --local_rank flag read under torchrun (which passes none, so every rank gets the
default)."""

from __future__ import annotations

import re

import libcst as cst

import ddpify.match as m
from ddpify.analysis.devices import gpu_index_literals
from ddpify.analysis.tree import call_args, code, dotted
from ddpify.lint.values import UNK
from ddpify.rules import declare

declare(
    "DDP230",
    "hard-coded-gpu-index",
    "a hard-coded GPU index: every rank uses that GPU (NCCL refuses it, or the ranks share one GPU's memory)",
    severity="blocking",
    tool="lint",
)
declare(
    "DDP231",
    "local-rank-flag-under-torchrun",
    "the device comes from a --local_rank flag, which torchrun never passes: every rank gets the flag's default, the same GPU",
    severity="blocking",
    tool="lint",
)
declare(
    "DDP232",
    "default-cuda-device",
    'the model goes to CUDA\'s default device (`.cuda()`, "cuda") and no torch.cuda.set_device(local_rank) runs: every rank uses GPU 0',
    severity="blocking",
    tool="lint",
)
declare(
    "DDP233",
    "global-rank-as-device",
    "the GPU index comes from the global rank: on a second node rank 8 asks for GPU 8 (invalid device ordinal) or ranks land on the wrong GPUs; the device is the local rank",
    severity="blocking",
    tool="lint",
)
declare(
    "DDP282",
    "legacy-launch-flag",
    'a --local_rank flag: torch.distributed.launch (deprecated) passes --local-rank since torch 2.0, torchrun passes none; read os.environ["LOCAL_RANK"]',
    tool="lint",
)

CUDA_INDEX = re.compile(r"^\s*cuda\s*:\s*\d+\s*$")
TORCHRUN = re.compile(
    r"torchrun|torch\.distributed\.run|LOCAL_WORLD_SIZE|TORCHELASTIC|elastic"
)
DEVICE_ARGS = {"device", "map_location", "output_device"}


def check(ctx) -> None:
    f = ctx.facts
    if not f.distributed or f.framework is not None:
        return
    _indices(ctx)
    _global_device(ctx)
    _flag(ctx)
    _flag_defaults(ctx)
    _default_device(ctx)


def _report_index(ctx, node, what) -> None:
    ctx.report(
        node,
        "DDP230",
        f'{what}: a hard-coded GPU index, so every rank uses that GPU (NCCL refuses two ranks on one GPU, or they share its memory); use the local rank (torch.device("cuda", local_rank))',
    )


def _indices(ctx) -> None:
    a, f = ctx.a, ctx.facts
    for lit in gpu_index_literals(a):
        if _single_process(ctx, lit):
            continue
        _report_index(
            ctx,
            lit,
            f"GPU {lit.value} reaches `{code(a.statement(lit)).strip().splitlines()[0]}`",
        )
    for s in a.findall(a.module, m.SimpleString()):
        try:
            text = s.evaluated_value
        except Exception:
            continue
        if (
            isinstance(text, str)
            and CUDA_INDEX.match(text)
            and not _single_process(ctx, s)
            and _device_use(ctx, s)
        ):
            _report_index(ctx, s, f'"{text}"')
    for c in a.calls:
        pos, kw = call_args(c)
        if (
            a.is_call(c, "torch.cuda.set_device")
            and pos
            and isinstance(pos[0].value, cst.Integer)
        ):
            if not _single_process(ctx, c):
                _report_index(ctx, c, f"torch.cuda.set_device({pos[0].value.value})")
        if (
            a.is_call(c, "torch.device")
            and len(pos) > 1
            and isinstance(pos[1].value, cst.Integer)
            and not _single_process(ctx, c)
        ):
            _report_index(ctx, pos[1].value, f"torch.device(..., {pos[1].value.value})")
        if any(w.call is c for w in f.ddp_wraps) and "device_ids" in kw:
            ids = kw["device_ids"].value
            if (
                isinstance(ids, (cst.List, cst.Tuple))
                and ids.elements
                and all(isinstance(e.value, cst.Integer) for e in ids.elements)
            ):
                _report_index(ctx, ids, f"device_ids={code(ids)}")
    for asg in a.assigns:
        if (
            isinstance(asg, cst.Assign)
            and any(_is_cvd(t.target) for t in asg.targets)
            and isinstance(asg.value, cst.SimpleString)
        ):
            if not _single_process(ctx, asg) and re.fullmatch(
                r"\s*\d+\s*", asg.value.evaluated_value or ""
            ):
                _report_index(
                    ctx, asg.value, f"CUDA_VISIBLE_DEVICES={asg.value.evaluated_value}"
                )


def _global_device(ctx) -> None:
    """set_device(rank), torch.device("cuda", rank), .cuda(rank), device_ids=[rank] with the global rank."""
    a, f = ctx.a, ctx.facts
    for c in a.calls:
        pos, kw = call_args(c)
        if a.is_call(c, "torch.cuda.set_device"):
            args = [x.value for x in pos[:1]]
        elif a.is_call(c, "torch.device") and len(pos) > 1:
            args = [pos[1].value]
        elif isinstance(c.func, cst.Attribute) and c.func.attr.value == "cuda" and pos:
            args = [pos[0].value]
        elif (
            any(w.call is c for w in f.ddp_wraps)
            and "device_ids" in kw
            and isinstance(kw["device_ids"].value, (cst.List, cst.Tuple))
        ):
            args = [e.value for e in kw["device_ids"].value.elements]
        else:
            continue
        for x in args:
            v = f.ranks.values(x)
            known = (
                v[0] is not UNK
                and v[2] is not UNK
                and not isinstance(v[0], (bool, str))
                and not isinstance(v[2], (bool, str))
            )
            if "%" in code(x) or not known or v[0] == v[2] or _single_process(ctx, c):
                continue
            ctx.report(
                c,
                "DDP233",
                f'`{code(c).strip()}` takes the device from the global rank (`{code(x)}`): on a second node rank 8 asks for GPU 8 ("invalid device ordinal") or two ranks share a GPU; use the local rank (int(os.environ["LOCAL_RANK"]))',
            )
            return


def _code_strings(a) -> set[str]:
    """String literals of the code (docstrings left out)."""
    return {
        s.evaluated_value
        for s in a.findall(a.module, m.SimpleString())
        if isinstance(s.evaluated_value, str)
        and not isinstance(a.parent.get(s), cst.Expr)
    }


def _gates_setup(ctx, flag_dest: str) -> cst.Call | None:
    """init_process_group (or the DDP wrap) runs only where a test on the flag's value holds
    (`if args.local_rank != -1:`), followed through the names the test reads."""
    a, f = ctx.a, ctx.facts
    setups = [
        c for c in a.calls if a.is_call(c, "torch.distributed.init_process_group")
    ] + [w.call for w in f.ddp_wraps]
    for c in setups:
        for test, _ in f.reach.conditions(c):
            names = [test] + [
                v
                for n in a.findall(test, m.Name())
                for v in a._local_values(a.function_of(n), n.value)[:3]
            ]
            if any(
                (dotted(x) or "").endswith("." + flag_dest)
                for n in names
                for x in [n, *a.findall(n, m.Attribute())]
            ):
                return c
    return None


def _is_cvd(t: cst.BaseExpression) -> bool:
    return (
        isinstance(t, cst.Subscript)
        and dotted(t.value) == "os.environ"
        and "CUDA_VISIBLE_DEVICES" in code(t)
    )


def _device_use(ctx, s: cst.SimpleString) -> bool:
    """The string is a device given to .to(), torch.device(), device=/map_location=, or a name."""
    a = ctx.a
    par = a.parent.get(s)
    if isinstance(par, cst.Arg):
        call = a.parent.get(par)
        if par.keyword is not None:
            return par.keyword.value in DEVICE_ARGS
        return isinstance(call, cst.Call) and (
            a.is_call(call, "torch.device")
            or (
                isinstance(call.func, cst.Attribute)
                and call.func.attr.value in ("to", "cuda")
            )
        )
    return isinstance(par, (cst.Assign, cst.AnnAssign)) or isinstance(par, cst.IfExp)


DIST_TEST = re.compile(
    r"distributed|\bddp\b|world_size|multiprocessing|is_initialized|num_gpus|\bn_gpu\b|ngpu|rank\s*(==|!=)\s*-1|rank\s*>=\s*0|rank\s*<\s*0|rank\s*>\s*-1",
    re.I,
)
NEGATIVE = re.compile(r"^\s*not\b|==\s*-1|<\s*0\b|\bis None\b|==\s*1\b|<=\s*1\b")


def _single_process(ctx, node) -> bool:
    """node runs where the script is not distributed: the `else` of `if args.distributed:`,
    the body of `if local_rank == -1:` or `if world_size == 1:`."""
    if all(v is False for v in ctx.facts.reach.local(node)):
        return True  # `if "LOCAL_RANK" not in os.environ:`: never under a launcher
    for test, taken in ctx.facts.reach.conditions(node):
        t = code(test)
        if DIST_TEST.search(t) and taken == bool(NEGATIVE.search(t)):
            return True
    return False


def _flag(ctx) -> None:
    a, f = ctx.a, ctx.facts
    flag = next(
        (
            c
            for c in a.calls
            if isinstance(c.func, cst.Attribute)
            and c.func.attr.value == "add_argument"
            and any(
                isinstance(x.value, cst.SimpleString)
                and (x.value.evaluated_value or "") in ("--local_rank", "--local-rank")
                for x in c.args
                if x.keyword is None
            )
        ),
        None,
    )
    if flag is None:
        return
    spellings = {
        x.value.evaluated_value
        for x in flag.args
        if x.keyword is None and isinstance(x.value, cst.SimpleString)
    }
    _, kw = call_args(flag)
    default = kw["default"].value if "default" in kw else None
    env_default = default is not None and "LOCAL_RANK" in code(default)
    # args.local_rank = int(os.environ["LOCAL_RANK"]) somewhere: the flag is overwritten from torchrun's variable
    env_set = any(
        isinstance(asg, cst.Assign)
        and any((dotted(t.target) or "").endswith(".local_rank") for t in asg.targets)
        and "LOCAL_RANK" in code(asg.value)
        for asg in a.assigns
    )
    reads_env = "LOCAL_RANK" in _code_strings(a)
    if env_default or env_set:
        return
    gated = _gates_setup(ctx, "local_rank")
    if gated is not None and not reads_env:
        ctx.report(
            flag,
            "DDP231",
            f'the process group is set up only when --local_rank is given (`{code(a.statement(gated)).strip().splitlines()[0]}` runs under a test on it), but torchrun passes no flag (it sets LOCAL_RANK): under torchrun every process keeps the default {code(default) if default is not None else "None"} and trains alone on the whole data set; default=int(os.environ.get("LOCAL_RANK", -1))',
        )
        return
    uses = [
        c
        for c in a.calls
        if _device_call(ctx, c)
        and any(
            (dotted(n) or "").endswith("local_rank")
            for n in a.findall(c, m.Attribute())
        )
    ]
    if TORCHRUN.search(f.text) and uses and not reads_env:
        use = uses[0]
        ctx.report(
            flag,
            "DDP231",
            f'the device comes from the --local_rank flag (`{code(use).strip()}`), but torchrun passes no flag (it sets LOCAL_RANK): every rank gets the default {code(default) if default is not None else "None"}, the same GPU; use default=int(os.environ.get("LOCAL_RANK", 0))',
        )
    elif not reads_env:
        both = {"--local_rank", "--local-rank"} <= spellings
        extra = (
            ""
            if both
            else " (this flag is declared as "
            + " and ".join(sorted(spellings))
            + " only: torch.distributed.launch of torch >= 2.0 fails with `unrecognized arguments: --local-rank=0`)"
        )
        ctx.report(
            flag,
            "DDP282",
            f'--local_rank is filled only by the deprecated torch.distributed.launch{extra}; under torchrun read os.environ["LOCAL_RANK"]',
        )


def _flag_defaults(ctx) -> None:
    """`torch.cuda.set_device(args.gpu_id)` with `--gpu-id` defaulting to a number that nothing
    sets per rank: every rank gets that GPU (--local_rank is DDP231's)."""
    a, f = ctx.a, ctx.facts
    flags: dict[str, cst.Call] = {}
    for c in a.calls:
        if isinstance(c.func, cst.Attribute) and c.func.attr.value == "add_argument":
            names = [
                x.value.evaluated_value
                for x in c.args
                if x.keyword is None and isinstance(x.value, cst.SimpleString)
            ]
            _, kw = call_args(c)
            dest = (
                kw["dest"].value.evaluated_value
                if "dest" in kw and isinstance(kw["dest"].value, cst.SimpleString)
                else None
            )
            default = kw["default"].value if "default" in kw else None
            if isinstance(default, cst.Integer) and not any(
                n in ("--local_rank", "--local-rank") for n in names
            ):
                for n in (
                    [dest]
                    if dest
                    else [
                        n.lstrip("-").replace("-", "_")
                        for n in names
                        if n.startswith("--")
                    ][:1]
                ):
                    flags[n] = c
    if not flags:
        return
    for c in a.calls:
        pos, kw = call_args(c)
        if a.is_call(c, "torch.cuda.set_device"):
            args = pos[:1]
        elif isinstance(c.func, cst.Attribute) and c.func.attr.value == "cuda":
            args = pos[:1]
        elif a.is_call(c, "torch.device"):
            args = pos[1:2]
        else:
            continue
        for x in args:
            d = dotted(x.value) or ""
            name = d.rsplit(".", 1)[-1]
            if (
                "." in d
                and name in flags
                and not f.ranks.depends(x.value)
                and not _assigned(ctx, d)
                and not _single_process(ctx, c)
            ):
                default = call_args(flags[name])[1]["default"].value.value
                _report_index(
                    ctx,
                    c,
                    f"`{code(c)}` takes --{name.replace('_', '-')}, whose default {default} nothing sets per rank",
                )
                return


def _assigned(ctx, dotted_name: str) -> bool:
    """`args.gpu = gpu` somewhere: the value is set in the script, not left at the flag's default."""
    return any(
        isinstance(asg, cst.Assign)
        and any(dotted(t.target) == dotted_name for t in asg.targets)
        for asg in ctx.a.assigns
    )


def _device_call(ctx, c: cst.Call) -> bool:
    a = ctx.a
    if a.is_call(c, "torch.cuda.set_device", "torch.device"):
        return True
    if isinstance(c.func, cst.Attribute) and c.func.attr.value in ("to", "cuda"):
        return True
    return any(w.call is c for w in ctx.facts.ddp_wraps)


def _default_device(ctx) -> None:
    """`.cuda()` / .to("cuda") of the model with no set_device anywhere, and no per-rank device."""
    a, f = ctx.a, ctx.facts
    if not f.ddp_wraps:
        return
    if any(
        a.is_call(c, "torch.cuda.set_device", "torch.accelerator.set_device_index")
        for c in a.calls
    ):
        return
    if "CUDA_VISIBLE_DEVICES" in f.text:
        return
    for w in f.ddp_wraps:
        _, kw = call_args(w.call)
        if "device_ids" in kw and not m.matches(kw["device_ids"].value, m.Name("None")):
            continue  # DDP raises when the module is elsewhere: the device is the rank's already
        name = w.inner
        if not name:
            continue
        for c in a.calls:
            if (
                not isinstance(c.func, cst.Attribute)
                or dotted(c.func.value) != name
                or f.order(c) > f.order(w.call)
            ):
                continue
            meth = c.func.attr.value
            pos, kw2 = call_args(c)
            if meth == "cuda" and not pos and "device" not in kw2:
                ctx.report(
                    c,
                    "DDP232",
                    f'{name}.cuda() puts the model on CUDA\'s current device, GPU 0, on every rank (no torch.cuda.set_device(local_rank) runs): call torch.cuda.set_device(local_rank) first, or move it to torch.device("cuda", local_rank)',
                )
                return
            if meth == "to" and pos and _default_cuda(ctx, pos[0].value):
                ctx.report(
                    c,
                    "DDP232",
                    f'{code(c).strip()} puts the model on CUDA\'s current device, GPU 0, on every rank (no torch.cuda.set_device(local_rank) runs): call torch.cuda.set_device(local_rank) first, or use torch.device("cuda", local_rank)',
                )
                return


def _default_cuda(ctx, expr: cst.BaseExpression) -> bool:
    for v in ctx.facts.sources(expr):
        if (
            isinstance(v, cst.SimpleString)
            and (v.evaluated_value or "").strip() == "cuda"
        ):
            return True
        if isinstance(v, cst.Call) and ctx.a.is_call(v, "torch.device"):
            pos, kw = call_args(v)
            if (
                len(pos) == 1
                and not kw
                and any(
                    isinstance(x, cst.SimpleString)
                    and (x.evaluated_value or "").strip() == "cuda"
                    for x in ctx.facts.sources(pos[0].value)
                )
            ):
                return True
    return False
