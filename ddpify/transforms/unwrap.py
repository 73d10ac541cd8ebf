"""Access to the model's own methods and attributes goes through the unwrapped model
(`model.module`) once the model is wrapped; DDP forwards only forward() and nn.Module basics."""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import model_uses
from ddpify.analysis import code, dotted
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
        if not ctx.wrapped:
            return
        self._mixed: set[cst.FunctionDef] = set()
        self._either: set[cst.FunctionDef] = set()  # read the global model wrapped and plain
        wrapped_names = set(ctx.wrapped)
        bindings = a._propagate(sorted(wrapped_names))
        self._aliases = model_uses.instance_aliases(a, ctx.wrapped)
        self._aliases.update(model_uses.local_aliases(a, ctx.wrapped))
        for name, anchor in ctx.wrapped.items():  # wrapped inside a function: its own local from there on
            if "." not in name and a.function_of(anchor) is not None:
                bindings.setdefault(a.function_of(anchor), set()).add(name)
        for alias, asg in self._aliases.items():
            bindings.setdefault(a.function_of(asg), set()).add(alias)  # type: ignore[arg-type]
        for attr in a.attributes:
            if attr.attr.value in PASSTHROUGH or not ctx.editable(attr):
                continue
            base = dotted(attr.value)
            if base is None:
                continue
            par = a.parent.get(attr)
            if isinstance(par, cst.Attribute) and par.value is attr and par.attr.value == "module":
                continue
            fn = a.function_of(attr)
            if not self._bound(a, bindings, fn, base, attr):
                continue
            if not self._after_wrap(ctx, attr, base):
                continue
            if fn in self._either:
                # a function reading the global model while it is the wrapper and, after it was
                # bound again to a plain model, while it is not
                ctx.edits.replace(attr, lambda n: n.with_changes(value=ctx.expr(f'getattr({code(n.value)}, "module", {code(n.value)})')))
                ctx.finding(attr, "DDP033", f"{fn.name.value}() reads `{base}` both while it is wrapped and after it is bound again to a plain model: getattr({base}, \"module\", {base}).{attr.attr.value}", True)
                continue
            ctx.edits.replace(attr, lambda n: n.with_changes(value=cst.Attribute(value=n.value, attr=cst.Name("module"))))
            if attr.attr.value in ("state_dict", "load_state_dict"):
                ctx.finding(attr, "DDP070", f"{base}.module.{attr.attr.value}: the state dict of the unwrapped model, without the 'module.' prefix", True)
            else:
                ctx.finding(attr, "DDP033", f"{base}.{attr.attr.value} is the model's own; reached through {base}.module after wrapping", True)

        # getattr(model, "n_classes", 10) on the wrapper would quietly return the default
        for call in a.calls:
            if not (isinstance(call.func, cst.Name) and call.func.value in ("getattr", "hasattr", "setattr")):
                continue
            if len(call.args) < 2 or not isinstance(call.args[1].value, cst.SimpleString) or not ctx.editable(call):
                continue
            base = dotted(call.args[0].value)
            attr_name = call.args[1].value.evaluated_value
            if base is None or attr_name in PASSTHROUGH or not isinstance(attr_name, str):
                continue
            fn = a.function_of(call)
            if not self._bound(a, bindings, fn, base, call) or not self._after_wrap(ctx, call, base):
                continue

            def unwrap_first(n: cst.Call) -> cst.Call:
                first = n.args[0].with_changes(value=cst.Attribute(value=n.args[0].value, attr=cst.Name("module")))
                return n.with_changes(args=[first, *n.args[1:]])

            ctx.edits.replace(call, unwrap_first)
            ctx.finding(call, "DDP033", f"{call.func.value}({base}, {attr_name!r}) asks the model itself: {base}.module after wrapping", True)

        # copies and traces of the model take the plain module: deepcopy(ddp) carries 'module.'
        # keys into an EMA, and a traced DDP forward runs collectives on one rank alone
        for call in a.calls:
            if not ctx.editable(call):
                continue
            for arg in model_uses.plain_module_args(a, call):
                base = dotted(arg.value)
                if base is None or not self._bound(a, bindings, a.function_of(call), base, call) or not self._after_wrap(ctx, call, base):
                    continue
                if a.function_of(call) in self._either:
                    ctx.edits.replace(arg.value, lambda n: ctx.expr(f'getattr({code(n)}, "module", {code(n)})'))
                else:
                    ctx.edits.replace(arg.value, lambda n: cst.Attribute(value=n, attr=cst.Name("module")))
                if not isinstance(call.func, cst.Name) or call.func.value != "getattr":  # (reported above)
                    ctx.finding(call, "DDP033", f"{code(call.func)}({base}) takes the plain model after wrapping: {base}.module", True)
        self._unwrap_at_callers(ctx)

    @staticmethod
    def _passes_plain(ctx: Context, call: cst.Call, anchor: cst.CSTNode) -> bool:
        """call hands on a wrapped name while it holds the plain model: before the wrap, or
        bound again to a new model since."""
        a = ctx.a
        before = a.function_of(call) is a.function_of(anchor) and a.pos[call].start.line <= a.pos[anchor].end.line
        return any(
            ctx.wrapped.get(dotted(x.value) or "") is anchor and (before or model_uses.rebound_unwrapped(a, dotted(x.value), anchor, call))  # type: ignore[arg-type]
            for x in call.args
        )

    @classmethod
    def _passes_wrapped(cls, ctx: Context, call: cst.Call, anchor: cst.CSTNode) -> bool:
        return any(ctx.wrapped.get(dotted(x.value) or "") is anchor for x in call.args) and not cls._passes_plain(ctx, call, anchor)

    def _unwrap_at_callers(self, ctx: Context) -> None:
        """A helper called with the wrapped model and with a plain one (before the wrap, or a
        model loaded again for testing) gets the plain module from every caller."""
        a = ctx.a
        for fn in self._mixed:
            if any(a.function_of(s.stmt) is fn for s in a.steps):
                continue  # it trains: it needs the wrapper (not reached: a training helper runs before the reload)
            for call in a.callers(fn):
                for arg in call.args:
                    name = dotted(arg.value)
                    anchor = ctx.wrapped.get(name or "")
                    if anchor is None or not ctx.editable(call) or a.function_of(call) is not a.function_of(anchor):
                        continue
                    if a.pos[call].start.line <= a.pos[anchor].end.line or model_uses.rebound_unwrapped(a, name, anchor, call):  # type: ignore[arg-type]
                        continue
                    ctx.edits.replace(arg.value, lambda n: cst.Attribute(value=n, attr=cst.Name("module")))
                    ctx.finding(call, "DDP033", f"{fn.name.value}() also gets a plain model later: it gets {name}.module here", True)

    def _bound(self, a, bindings, fn, base, node) -> bool:
        if fn is not None and base in bindings.get(fn, set()):
            return True
        if base in bindings.get(None, set()):
            if "." in base:
                return True
            return fn is None or not a._is_local(fn, base) or a._binds_model_here(fn, base)
        return False

    def _after_wrap(self, ctx: Context, node: cst.CSTNode, base: str) -> bool:
        a = ctx.a
        line = a.pos[node].start.line
        made = self._aliases.get(base)
        if made is not None:  # trainer.model: wrapped once trainer is built
            return a.function_of(made) is a.function_of(node) and line > a.pos[made].end.line
        anchors = [s for n, s in ctx.wrapped.items() if n == base or base.startswith(n + ".")] or list(ctx.wrapped.values())
        if any(model_uses.rebound_unwrapped(a, base, s, node) for s in anchors):
            return False  # model = Net(); model.load_state_dict(best): a new, plain model
        fn = a.function_of(node)
        for anchor in anchors:
            afn = a.function_of(anchor)
            aend = a.pos[anchor].end.line
            if fn is afn:
                if line > aend:
                    return True
                continue
            if base.startswith("self.") and afn is not None and afn.name.value == "__init__":
                if fn is not None and a.class_of(fn) is a.class_of(afn):
                    return True
            # a function called only after the wrap
            if fn is not None:
                callers = a.callers(fn)
                if callers and not a._is_local(fn, base.split(".")[0]):
                    rebound = [model_uses.rebound_unwrapped(a, base, anchor, c) for c in callers]
                    if all(rebound):
                        continue  # reads the global model, only called once it was bound again to a plain one
                    if any(rebound):
                        self._either.add(fn)
                if any(self._passes_plain(ctx, c, anchor) for c in callers) and any(self._passes_wrapped(ctx, c, anchor) for c in callers):
                    self._mixed.add(fn)  # also gets a plain model: its callers unwrap instead
                    continue
                if callers and all(a.pos[c].start.line > aend or a.function_of(c) is not afn for c in callers):
                    return True
                if not callers:
                    return True
        return False
