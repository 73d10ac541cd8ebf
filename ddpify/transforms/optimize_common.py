"""What the --optimize planners share: the models made distributed (plans.wrap), the model's
class code (read once per model), and a statement placed with a model's wrap."""

from __future__ import annotations

from ddpify.analysis import builds
from ddpify.analysis.model_code import ModelCode, model_code
from ddpify.transforms.base import Context


def wrapped_models(ctx: Context) -> list[str]:
    """Models this conversion makes distributed, once each."""
    out: list[str] = []
    for w in ctx.plans.wrap.wraps if ctx.plans.wrap is not None else ():
        if w.model not in out:
            out.append(w.model)
    return out


def anchor_of(ctx: Context, name: str):
    """The statement a model's wrap goes with (findings about it point there)."""
    return next(w.site for w in ctx.plans.wrap.wraps if w.model == name)


def code_of(ctx: Context, name: str) -> ModelCode | str:
    """The class code of model `name`, or why it cannot be read; computed once per conversion."""
    if name not in ctx.model_code:
        bind = builds.binding(ctx.a, name)
        ctx.model_code[name] = (
            "ddpify did not find where it is built"
            if bind is None
            else model_code(ctx.a, builds.build_node(ctx.a, name, bind), ctx.path)
        )
    return ctx.model_code[name]  # type: ignore[return-value]


def before_wrap(ctx: Context, name: str, text: str) -> None:
    """A statement right before the model's wrap: DDP starts at the first forward, so the
    model may still change there."""
    w = next(w for w in ctx.plans.wrap.wraps if w.model == name)
    at = ctx.edits.after if w.after else ctx.edits.before
    at[w.site].insert(0, ctx.stmt(text))
