"""The plain module inside a function handed the DDP wrapper. The model keeps its name
everywhere, so only a function whose parameter now holds the wrapper (it runs a training
forward: `train(ddp_model, ...)`) can need the module back: for its other uses of that
parameter (attributes, state dicts, evaluation, copies, saves, handing it on to code that does
not train it) `model.module`; `getattr(model, "module", model)` where the function may also get
a plain model (a caller hands it one, or it lives in a module other entry points import)."""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import code
from ddpify.analysis.routes import module_uses
from ddpify.transforms.base import Context, Transform
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP070",
    "state-dict-unwrapped",
    "state dict read from the plain module in a function handed the wrapper (no 'module.' prefix)",
    fix=True,
    check="saved",
)
declare(
    "DDP033",
    "plain-module-access",
    "model attribute reached through .module (the unwrapped model)",
    fix=True,
    check="ranks",
)


class UnwrapTransform(Transform):
    name = "unwrap"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        for name, r in ctx.routes.items():
            adapter = any(f.method for f in r.forwards())  # type: ignore[attr-defined]
            for fn, param in r.holders:  # type: ignore[attr-defined]
                plain = self._plain(ctx, r, fn, param, adapter)
                for use in module_uses(a, r, fn, param):  # type: ignore[arg-type]
                    if not ctx.editable(use):
                        continue
                    ctx.edits.replace(use, lambda n, e=plain: ctx.expr(e))
                    par = a.parent.get(use)
                    what = (
                        f"{param}.{par.attr.value}"
                        if isinstance(par, cst.Attribute) and par.value is use
                        else code(a.statement(use)).strip().splitlines()[0][:60]
                    )
                    if isinstance(par, cst.Attribute) and par.attr.value in (
                        "state_dict",
                        "load_state_dict",
                    ):
                        ctx.finding(
                            use,
                            "DDP070",
                            f"{plain}.{par.attr.value}: {fn.name.value}() holds the DDP wrapper in `{param}`; the state dict of the plain model, without the 'module.' prefix",
                            True,
                        )
                    else:
                        ctx.finding(
                            use,
                            "DDP033",
                            f"{fn.name.value}() holds the DDP wrapper in `{param}` (it runs its training forward); `{what}` needs the plain model: {plain}",
                            True,
                        )

    @staticmethod
    def _plain(ctx: Context, r, fn: cst.FunctionDef, param: str, adapter: bool) -> str:
        a = ctx.a
        path = "module.model" if adapter else "module"
        handed = {id(c) for c, _, _ in r.handed}
        inner = {id(f) for f, _ in r.holders}
        mixed = (
            a.region_of(fn) != 0
        )  # a module other entry points may import, with a plain model
        for c in a.callers(fn):
            arg = a.argument_for(c, fn, param)
            if arg is None:
                continue
            g = a.function_of(c)
            if id(c) not in handed and not (g is not None and id(g) in inner):
                mixed = True
        if mixed and not adapter:
            return f'getattr({param}, "module", {param})'
        return f"{param}.{path}"
