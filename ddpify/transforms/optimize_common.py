"""What the --optimize planners share: the model's class code (read once per model), the DDP
statement the wrap planned for a model, and adding a keyword to it."""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import call_args, dotted
from ddpify.analysis.model_code import ModelCode, model_code
from ddpify.transforms.base import Context, append_kwarg
from ddpify.transforms.wrapping import WrappingTransform


def wrapped_models(ctx: Context) -> list[str]:
    """Models wrapped in torch's DDP by this conversion (not with --amp apex)."""
    return [] if ctx.opts.amp == "apex" else list(ctx.wrapped)


def code_of(ctx: Context, name: str) -> ModelCode | str:
    """The class code of model `name`, or why it cannot be read; computed once per conversion."""
    if name not in ctx.model_code:
        bind = WrappingTransform()._binding(ctx, name)
        ctx.model_code[name] = (
            "ddpify did not find where it is built"
            if bind is None
            else model_code(ctx.a, bind, ctx.path)
        )
    return ctx.model_code[name]  # type: ignore[return-value]


def ddp_call(
    ctx: Context, name: str
) -> tuple[list[cst.BaseStatement], int, cst.Call] | None:
    """(the statements planned after the wrap point, the index of `ddp_name = DDP(name, ...)` there, its call)."""
    anchor = ctx.wrapped.get(name)
    where = ctx.edits.before if name in ctx.wrap_before else ctx.edits.after
    if anchor is None or anchor not in where:
        return None
    stmts = where[anchor]
    for i, st in enumerate(stmts):
        if isinstance(st, cst.SimpleStatementLine) and isinstance(
            st.body[0], cst.Assign
        ):
            value = st.body[0].value
            pos, kw = call_args(value) if isinstance(value, cst.Call) else ([], {})
            target = dotted(st.body[0].targets[0].target)
            if (
                pos
                and target == ctx.wrappers.get(name, name)
                and dotted(value.func) == ctx._alias["DDP"]
            ):
                return stmts, i, value
    return None


def add_ddp_kwarg(ctx: Context, name: str, keyword: str, value: str) -> bool:
    found = ddp_call(ctx, name)
    if found is None:
        return False
    stmts, i, call = found
    new = append_kwarg(call, keyword, ctx.expr(value))
    stmts[i] = stmts[i].with_changes(body=[stmts[i].body[0].with_changes(value=new)])
    return True


def before_wrap(ctx: Context, name: str, text: str) -> None:
    """A statement after the model's last change, before its DDP wrap (and after earlier ones of --optimize)."""
    anchor = ctx.wrapped[name]
    where = ctx.edits.before if name in ctx.wrap_before else ctx.edits.after
    found = ddp_call(ctx, name)
    at = found[1] if found else len(where[anchor])
    where[anchor].insert(at, ctx.stmt(text))
