"""Access to the model's own methods and attributes goes through the unwrapped model
(`model.module`) once the model is wrapped; DDP forwards only forward() and nn.Module basics."""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import dotted
from ddpify.transforms.base import Context, Transform

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
        wrapped_names = set(ctx.wrapped)
        bindings = a._propagate(sorted(wrapped_names))
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
        anchors = [s for n, s in ctx.wrapped.items()]
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
                if callers and all(a.pos[c].start.line > aend or a.function_of(c) is not afn for c in callers):
                    return True
                if not callers:
                    return True
        return False
