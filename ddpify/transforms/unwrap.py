"""The plain module inside a function handed the DDP wrapper. The model keeps its name
everywhere, so only a function whose parameter now holds the wrapper (it runs a training
forward: `train(ddp_model, ...)`) can need the module back: for its other uses of that
parameter (attributes, state dicts, evaluation, copies, saves, handing it on to code that does
not train it) `model.module`; `getattr(model, "module", model)` where the function may also get
a plain model (a caller hands it one, or it lives in a module other entry points import)."""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import code
from ddpify.analysis.routes import holder_uses
from ddpify.transforms.base import Context, Transform
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare("DDP033", "plain-module-access", "model attribute reached through .module (the unwrapped model)", fix=True, check="ranks")

# What DDP itself answers the same way as the wrapped module.
PASSTHROUGH = {
    "train", "eval", "parameters", "named_parameters", "zero_grad", "forward", "no_sync", "to", "cuda",
    "cpu", "training", "requires_grad_", "module", "float", "half", "bfloat16", "double", "type",
    "register_forward_hook", "register_forward_pre_hook",
}


class UnwrapTransform(Transform):
    name = "unwrap"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        for name, r in ctx.routes.items():
            adapter = any(f.method for f in r.forwards())  # type: ignore[attr-defined]
            holders = {(id(fn), p) for fn, p in r.holders}  # type: ignore[attr-defined]
            training = {id(tf.call) for tf, _ in r.holder_forwards}  # type: ignore[attr-defined]
            for fn, param in r.holders:  # type: ignore[attr-defined]
                plain = self._plain(ctx, r, fn, param, adapter)
                for use in holder_uses(a, fn, param):
                    if not ctx.editable(use) or self._keeps_wrapper(ctx, use, holders, training):
                        continue
                    ctx.edits.replace(use, lambda n, e=plain: ctx.expr(e))
                    par = a.parent.get(use)
                    what = f"{param}.{par.attr.value}" if isinstance(par, cst.Attribute) and par.value is use else code(a.statement(use)).strip().splitlines()[0][:60]
                    if isinstance(par, cst.Attribute) and par.attr.value in ("state_dict", "load_state_dict"):
                        ctx.finding(use, "DDP070", f"{plain}.{par.attr.value}: {fn.name.value}() holds the DDP wrapper in `{param}`; the state dict of the plain model, without the 'module.' prefix", True)
                    else:
                        ctx.finding(use, "DDP033", f"{fn.name.value}() holds the DDP wrapper in `{param}` (it runs its training forward); `{what}` needs the plain model: {plain}", True)

    @staticmethod
    def _plain(ctx: Context, r, fn: cst.FunctionDef, param: str, adapter: bool) -> str:
        a = ctx.a
        path = "module.model" if adapter else "module"
        handed = {id(c) for c, _, _ in r.handed}
        inner = {id(f) for f, _ in r.holders}
        mixed = a.region_of(fn) != 0  # a module other entry points may import, with a plain model
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

    @staticmethod
    def _keeps_wrapper(ctx: Context, use: cst.Name, holders: set, training: set[int]) -> bool:
        """A use the wrapper serves as it is: its training forward, what DDP answers like the
        module (train(), parameters(), no_sync(), ...), handing it on to another holder, or
        binding the name."""
        a = ctx.a
        par = a.parent.get(use)
        if isinstance(par, cst.Call) and par.func is use:
            return id(par) in training
        if isinstance(par, cst.Attribute) and par.value is use:
            call = a.parent.get(par)
            if isinstance(call, cst.Call) and call.func is par and id(call) in training:
                return True  # model.loss(x): routed through the adapter (routing.py)
            return par.attr.value in PASSTHROUGH
        if isinstance(par, cst.Arg):
            call = a.parent.get(par)
            if isinstance(call, cst.Call):
                for fns in [a.functions.get((code(call.func) or "").rsplit(".", 1)[-1], [])]:
                    for g in fns:
                        for p in [p.name.value for p in g.params.params]:
                            if (id(g), p) in holders and a.argument_for(call, g, p) is use:
                                return True
            return False
        if isinstance(par, (cst.AssignTarget, cst.Param)) or (isinstance(par, (cst.AugAssign, cst.AnnAssign)) and par.target is use):
            return True
        if isinstance(par, (cst.Element,)) and isinstance(a.parent.get(par), (cst.Tuple, cst.List)) and isinstance(a.parent.get(a.parent.get(par)), cst.AssignTarget):
            return True  # model, opt = ...
        return False
