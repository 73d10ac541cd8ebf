"""The single-GPU training dynamics, on request. By default batch_size stays per process, so the
global batch (all ranks' samples in one step) is batch_size x WORLD_SIZE, and DDP026 says so.

- --keep-global-batch: each training DataLoader's batch size is divided by WORLD_SIZE where the
  DataLoader call gets it (`batch_size=ddp_local_batch(args.batch_size)`, whatever the expression),
  so the global batch, the steps per epoch and the learning rate's meaning stay the single-GPU
  ones. A batch size that is not a multiple of WORLD_SIZE gives each rank batch_size // WORLD_SIZE
  (at least 1) and rank 0 says so on stderr at run time: the run goes on, with the nearest global
  batch below. Where no DataLoader call shows the batch size (random draws, pre-made batches, a
  batch_sampler, **kwargs), DDP014 says it could not be applied.
- --scale-lr linear: batch_size stays per process and each optimizer's learning rate is
  multiplied by WORLD_SIZE at its construction (`lr=`, positional lr, param groups' "lr"), the
  linear scaling rule. Where the rate is set where ddpify cannot follow (a default lr, **kwargs,
  groups built in a helper, OneCycleLR/CyclicLR, `group["lr"] = ...` in the loop), DDP016 says so.

decide() reads the shared analysis and returns the plan; BatchScaleTransform emits it. The DDP026
note of the transforms that shard the data reads the plan through batch_note()."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import ddpify.match as m

from ddpify.analysis import OPTIM_PREFIXES, Analysis, Loader, call_args, code, dotted
from ddpify.options import Options
from ddpify.transforms.base import Context, Transform
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP014",
    "keep-global-batch-not-applied",
    "--keep-global-batch could not be applied here: no DataLoader call shows the batch size (random draws, pre-made batches, a batch_sampler, **kwargs), so this batch stays per process; divide it by WORLD_SIZE by hand",
)
declare(
    "DDP015",
    "lr-scaled-linear",
    "--scale-lr linear: the optimizer's learning rate (lr=, param groups' \"lr\") multiplied by WORLD_SIZE, the linear scaling rule for a global batch of batch_size x WORLD_SIZE",
    fix=True,
    check="loss",
)
declare(
    "DDP016",
    "scale-lr-not-applied",
    "--scale-lr linear could not scale this learning rate (a default lr, **kwargs, param groups built elsewhere, a scheduler or loop that sets the rate itself): multiply it by WORLD_SIZE by hand",
)

DEFAULT_NOTE = "batch_size is per process: the global batch is now batch_size x WORLD_SIZE (scale the learning rate if you need the old dynamics)"
KEPT_NOTE = (
    "--keep-global-batch: batch_size is divided by WORLD_SIZE on each rank (ddp_local_batch), so the global batch "
    "and the steps per epoch stay the single-process ones; a batch_size that is not a multiple of WORLD_SIZE gives "
    "each rank batch_size // WORLD_SIZE (at least 1), and rank 0 says so on stderr at run time"
)
SCALED_NOTE = (
    "batch_size is per process: the global batch is now batch_size x WORLD_SIZE, and --scale-lr linear multiplies "
    "the learning rate by WORLD_SIZE to match (the linear scaling rule)"
)

# Emitted in the set-up block (transforms/launch.py formats it: {torch}, {os}, {dist}).
LOCAL_BATCH = '''\


def ddp_local_batch(batch_size):
    """--keep-global-batch: this rank's share of a batch of batch_size samples, so
    that all ranks together still take batch_size a step."""
    if batch_size is None:  # no automatic batching: nothing to share
        return batch_size
    local = max(batch_size // WORLD_SIZE, 1)
    if local * WORLD_SIZE != batch_size and RANK == 0:
        import sys

        print(
            f"ddpify: batch_size {{batch_size}} is not a multiple of WORLD_SIZE "
            f"{{WORLD_SIZE}}: each rank takes {{local}}, a global batch of "
            f"{{local * WORLD_SIZE}} instead of {{batch_size}}",
            file=sys.stderr,
        )
    return local
'''

SETS_LR = {  # schedulers that set the rate from their own arguments, whatever the optimizer's
    "OneCycleLR": "max_lr",
    "CyclicLR": "base_lr and max_lr",
}
# expressions that bind tighter than `*`: `value * WORLD_SIZE` needs no parentheses
_TIGHT = (
    cst.Name,
    cst.Attribute,
    cst.Subscript,
    cst.Call,
    cst.Integer,
    cst.Float,
    cst.UnaryOperation,
)
_LEFT_ASSOC = (
    cst.Multiply,
    cst.Divide,
    cst.FloorDivide,
    cst.Modulo,
    cst.Power,
    cst.MatrixMultiply,
)


@dataclass
class Divide:
    """--keep-global-batch at one training DataLoader."""

    loader: Loader
    value: cst.BaseExpression  # the batch size the DataLoader call gets
    reads: list[cst.CSTNode] = field(
        default_factory=list
    )  # the same name read in the training loop


@dataclass
class Scale:
    """--scale-lr linear at one optimizer construction."""

    call: cst.Call
    values: list[
        cst.BaseExpression
    ]  # lr= (or the positional lr) and the param groups' "lr"
    what: str  # what was scaled, in words


@dataclass
class Left:
    """An option that could not be applied at node."""

    node: cst.CSTNode
    code: str  # DDP014, DDP016, DDP098 (a `# ddpify: skip` there)
    message: str


@dataclass
class Plan:
    divide: list[Divide] = field(default_factory=list)
    scale: list[Scale] = field(default_factory=list)
    left: list[Left] = field(default_factory=list)

    def divided(self, call: cst.CSTNode | None) -> Divide | None:
        return next((d for d in self.divide if d.loader.call is call), None)

    @property
    def every_lr_scaled(self) -> bool:
        return bool(self.scale) and not any(x.code == "DDP016" for x in self.left)


# -- the decision: a pure function of the analysis ----------------------------------------
def decide(a: Analysis, opts: Options) -> Plan:
    plan = Plan()
    if opts.keep_global_batch:
        _batches(a, plan)
    if opts.scale_lr == "linear":
        _learning_rates(a, plan)
    return plan


def _batches(a: Analysis, plan: Plan) -> None:
    train = [ld for ld in a.loaders if ld.role == "train"]
    if not train:
        if a.steps:
            step = a.steps[0]
            src = a.batch_source(step)
            if src is not None and src.kind == "index":
                return  # full-batch training: each rank reads its rows of the one batch (rank_rows)
            what = {
                "random": "batches drawn at random",
                "range": "slices of pre-loaded tensors",
                "sequence": "a list of pre-made batches",
            }.get(
                src.kind if src is not None else "",
                "batches made by hand in the training loop",
            )
            plan.left.append(
                Left(
                    step.backward,
                    "DDP014",
                    f"--keep-global-batch not applied: no DataLoader hands out this step's batches ({what}), "
                    "so ddpify cannot follow their size; each rank still takes whole batches, a global batch of batch x WORLD_SIZE: "
                    "divide the batch size by WORLD_SIZE by hand",
                )
            )
        return
    for ld in train:
        why, value = _batch_size(ld)
        if value is None:
            plan.left.append(
                Left(
                    ld.call,
                    "DDP014",
                    f"--keep-global-batch not applied: {why}; this DataLoader's batches stay per process, "
                    "a global batch of batch_size x WORLD_SIZE",
                )
            )
        elif a.skipped(ld.call):
            plan.left.append(
                Left(
                    ld.call,
                    "DDP098",
                    "not done because of `# ddpify: skip`/`off`: --keep-global-batch (batch_size stays per process)",
                )
            )
        else:
            plan.divide.append(Divide(ld, value, _reads_in_training(a, value)))


def _batch_size(ld: Loader) -> tuple[str, cst.BaseExpression | None]:
    """(why not, None), or ("", the batch-size expression of the DataLoader call)."""
    pos, kw = call_args(ld.call)
    if "batch_sampler" in kw or len(pos) > 4:
        return (
            "the DataLoader gets a batch_sampler, which makes the batches itself",
            None,
        )
    value = (
        kw["batch_size"].value
        if "batch_size" in kw
        else pos[1].value
        if len(pos) > 1
        else None
    )
    if value is None:
        star = next((x for x in ld.call.args if x.star), None)
        if star is not None:
            return (
                f"the DataLoader's batch_size may come from {star.star}{code(star.value)}, which ddpify cannot follow",
                None,
            )
        return (
            "the DataLoader has no batch_size: its batches of 1 (the default) cannot be shared out",
            None,
        )
    if m.matches(value, m.Name("None")):
        return "batch_size=None: the data set makes the batches itself", None
    return "", value


def _reads_in_training(a: Analysis, value: cst.BaseExpression) -> list[cst.CSTNode]:
    """Where the batch size's variable (`args.batch_size`, `BATCH`) is read in a training loop:
    there it is still the whole batch, not this rank's."""
    name = dotted(value)
    if name is None:
        return []
    out: list[cst.CSTNode] = []
    for step in a.steps:
        loop, _first = a._data_loop(step)
        if loop is None:
            continue
        for node in a.findall(loop, m.Name() | m.Attribute()):
            par = a.parent.get(node)
            member = (isinstance(par, cst.Attribute) and par.attr is node) or (
                isinstance(par, cst.Arg) and par.keyword is node
            )
            if (
                dotted(node) == name
                and not member
                and node is not value
                and node not in out
            ):
                out.append(node)
    return out


def _learning_rates(a: Analysis, plan: Plan) -> None:
    built = [
        c for c in a.calls if a._is_optimizer_call(c) and not _built_by_helper(a, c)
    ]
    for call in built:
        _optimizer(a, call, plan)
    if not built and a.steps:
        plan.left.append(
            Left(
                a.steps[0].backward,
                "DDP016",
                "--scale-lr linear: no optimizer is built here (the parameters are updated "
                "by hand, or the optimizer comes from code ddpify cannot follow): multiply the learning rate by WORLD_SIZE by hand",
            )
        )
    for call in a.calls:
        last = a.call_qualname(call).rsplit(".", 1)[-1]
        if last in SETS_LR:
            plan.left.append(
                Left(
                    call,
                    "DDP016",
                    f"--scale-lr linear: {last} sets the learning rate from its own {SETS_LR[last]}, "
                    "whatever the optimizer's: multiply those by WORLD_SIZE too",
                )
            )
    for asg in a.assigns:
        if (
            isinstance(asg, cst.Assign)
            and any(_is_lr_entry(t.target) for t in asg.targets)
            and not any(_is_lr_entry(n) for n in a.findall(asg.value, m.Subscript()))
        ):
            plan.left.append(
                Left(
                    asg,
                    "DDP016",
                    "--scale-lr linear: the script sets a learning rate itself here, and that rate is not "
                    "scaled: multiply it by WORLD_SIZE",
                )
            )


def _built_by_helper(a: Analysis, call: cst.Call) -> bool:
    """`make_optimizer(model)`, a function of the script: the construction is inside it."""
    name = dotted(call.func)
    return bool(name) and name.rsplit(".", 1)[-1] in a.functions


def _optimizer(a: Analysis, call: cst.Call, plan: Plan) -> None:
    pos, kw = call_args(call)
    values: list[cst.BaseExpression] = []
    if "lr" in kw:
        values.append(kw["lr"].value)
    elif len(pos) > 1 and a.call_qualname(call).startswith(OPTIM_PREFIXES):
        values.append(pos[1].value)  # SGD(params, 0.1)
    params = kw["params"].value if "params" in kw else pos[0].value if pos else None
    groups, helper = _groups(a, params, call)
    own = [v for g in groups for v in [_group_lr(g)] if v is not None]
    name = a.call_qualname(call).rsplit(".", 1)[-1] or "optimizer"
    if helper is not None:
        plan.left.append(
            Left(
                call,
                "DDP016",
                f'--scale-lr linear: the param groups come from `{helper}(...)`, which sets their own "lr": '
                "those are not scaled; multiply them by WORLD_SIZE there",
            )
        )
    if not values and (not groups or len(own) < len(groups)):
        star = next((x for x in call.args if x.star == "**"), None)
        why = (
            f"its learning rate comes from **{code(star.value)}, which ddpify cannot follow"
            if star is not None
            else "it gets no lr= here (its default, or one set where ddpify cannot follow)"
        )
        plan.left.append(
            Left(
                call,
                "DDP016",
                f"--scale-lr linear: {name}: {why}; pass lr= explicitly and convert again, or multiply it by WORLD_SIZE by hand",
            )
        )
    values += own
    if not values or _lambda_parameter(a, call, values):
        return
    groups_said = (
        f'{len(own)} param groups\' "lr"' if len(own) > 1 else '1 param group\'s "lr"'
    )
    parts = (["lr"] if len(values) > len(own) else []) + ([groups_said] if own else [])
    plan.scale.append(Scale(call, values, " and ".join(parts)))


def _lambda_parameter(
    a: Analysis, call: cst.Call, values: list[cst.BaseExpression]
) -> bool:
    """The construction is a lambda's body and its rate one of the lambda's parameters (a table
    of optimizers, `"adamw": lambda params, lr: AdamW(params, lr=lr)`): the call of the lambda
    hands the rate over, and is scaled there (once)."""
    node = a.parent.get(call)
    while node is not None and not isinstance(node, (cst.Lambda, cst.BaseStatement)):
        node = a.parent.get(node)
    if not isinstance(node, cst.Lambda):
        return False
    params = node.params
    names = {
        p.name.value
        for p in (*params.posonly_params, *params.params, *params.kwonly_params)
    }
    return any(
        isinstance(n, cst.Name) and n.value in names
        for v in values
        for n in a.findall(v, m.Name())
    )


def _groups(
    a: Analysis, params: cst.BaseExpression | None, near: cst.CSTNode
) -> tuple[list[cst.BaseExpression], str | None]:
    """(the param-group dicts the optimizer gets, the script's function that builds groups with
    their own "lr" where ddpify cannot rewrite them); ([], None) for plain parameters."""
    if isinstance(params, cst.Name):
        values = a._local_values(a.function_of(near), params.value) or a._local_values(
            None, params.value
        )
        if len(values) != 1:
            return [], None
        params = values[0]
    if isinstance(params, (cst.List, cst.Tuple)):
        return [e.value for e in params.elements if _is_dict(e.value)], None
    if isinstance(params, (cst.ListComp, cst.GeneratorExp)) and _is_dict(params.elt):
        return [params.elt], None
    if isinstance(params, cst.Call):
        name = dotted(params.func)
        for fn in a.functions.get(name.rsplit(".", 1)[-1] if name else "", []):
            if any(
                _group_lr(d) is not None
                for d in a.findall(fn, m.Dict() | m.Call(func=m.Name("dict")))
            ):
                return [], name
    return [], None


def _is_dict(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Dict) or m.matches(node, m.Call(func=m.Name("dict")))


def _group_lr(group: cst.CSTNode) -> cst.BaseExpression | None:
    """The "lr" entry of a param group: {"params": ..., "lr": x} or dict(params=..., lr=x)."""
    if isinstance(group, cst.Dict):
        for el in group.elements:
            if (
                isinstance(el, cst.DictElement)
                and isinstance(el.key, cst.SimpleString)
                and el.key.evaluated_value == "lr"
            ):
                return el.value
        return None
    if isinstance(group, cst.Call):
        _pos, kw = call_args(group)
        return kw["lr"].value if "lr" in kw else None
    return None


def _is_lr_entry(node: cst.CSTNode) -> bool:
    """group["lr"]"""
    if (
        not isinstance(node, cst.Subscript)
        or len(node.slice) != 1
        or not isinstance(node.slice[0].slice, cst.Index)
    ):
        return False
    key = node.slice[0].slice.value
    return isinstance(key, cst.SimpleString) and key.evaluated_value == "lr"


# -- the edits ------------------------------------------------------------------------
def times_world_size(node: cst.BaseExpression) -> cst.BaseExpression:
    """node * WORLD_SIZE, in parentheses where node binds looser than `*`."""
    tight = (
        isinstance(node, _TIGHT)
        or bool(getattr(node, "lpar", ()))
        or (
            isinstance(node, cst.BinaryOperation)
            and isinstance(node.operator, _LEFT_ASSOC)
        )
    )
    left = (
        node
        if tight
        else node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    )
    return cst.BinaryOperation(
        left=left, operator=cst.Multiply(), right=cst.Name("WORLD_SIZE")
    )


def local_batch(node: cst.BaseExpression) -> cst.BaseExpression:
    return cst.Call(func=cst.Name("ddp_local_batch"), args=[cst.Arg(node)])


class BatchScaleTransform(Transform):
    name = "batch_scale"

    def plan(self, ctx: Context) -> None:
        plan = decide(ctx.a, ctx.opts)
        ctx.batch_plan = plan  # type: ignore[attr-defined]  # read by batch_note()
        for d in plan.divide:
            ctx.edits.replace(d.value, local_batch)
        if plan.divide:
            ctx.helper_texts.append(LOCAL_BATCH)
        for s in plan.scale:
            if not ctx.editable(s.call):
                ctx.skipped_here(
                    s.call,
                    "--scale-lr linear (the learning rate stays the single-process one)",
                )
                continue
            for value in s.values:
                ctx.edits.replace(value, times_world_size)
            ctx.finding(
                s.call,
                "DDP015",
                f"--scale-lr linear: {s.what} multiplied by WORLD_SIZE, the linear scaling rule for the "
                "global batch of batch_size x WORLD_SIZE",
                True,
            )
        for left in plan.left:
            ctx.finding(left.node, left.code, left.message, False)


def batch_note(ctx: Context, call: cst.CSTNode | None = None) -> str:
    """DDP026's message for the training batches of `call` (a DataLoader; None: batches no
    DataLoader hands out): per process by default, or what the options did with them."""
    plan: Plan | None = getattr(ctx, "batch_plan", None)
    if plan is None:
        return DEFAULT_NOTE
    if ctx.opts.keep_global_batch:
        d = plan.divided(call) if call is not None else None
        if d is None:
            why = next(
                (x.code for x in plan.left if x.node is call and call is not None),
                "DDP014",
            )
            return (
                DEFAULT_NOTE + f"; --keep-global-batch could not divide it here ({why})"
            )
        if d.reads:
            line, _col = ctx.a.line_col(d.reads[0])
            return (
                KEPT_NOTE
                + f"; `{code(d.value)}` read in the training loop (line {line}) is still the global batch, not this rank's"
            )
        return KEPT_NOTE
    if ctx.opts.scale_lr:
        if plan.every_lr_scaled:
            return SCALED_NOTE
        return (
            DEFAULT_NOTE.split(" (", 1)[0]
            + "; --scale-lr linear could not scale every learning rate (DDP016)"
        )
    return DEFAULT_NOTE
