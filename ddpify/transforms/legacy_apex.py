"""apex rewritten to torch-native, for every script that uses it (single-GPU or distributed the
legacy way) unless --amp apex keeps it: apex DDP -> torch DDP, convert_syncbn_model -> torch's
SyncBatchNorm on GPUs only, FusedAdam/FusedSGD -> torch.optim with the same update rule; apex
amp -> torch.amp (apex_torch_amp.py); apex imports and their fallbacks (apex_imports.py). What
torch has no equivalent of (FusedLAMB) is kept, and said (DDP097).
"""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import call_args, code, dotted
from ddpify.transforms.apex_common import (
    NATIVE,
    NO_TORCH_EQUIVALENT,
    also_bound,
    apex_q,
    commas,
    eq,
    module_name,
)
from ddpify.transforms.apex_imports import plan_imports
from ddpify.transforms.apex_torch_amp import AmpToTorch
from ddpify.transforms.base import Context, Transform, append_kwarg
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP092",
    "apex-modernised",
    "apex rewritten to torch-native (torch.amp, torch DDP, SyncBatchNorm, torch.optim)",
    fix=True,
    check="loss",
)
declare(
    "DDP096",
    "apex-not-rewritten",
    "apex rewrite not applied: fix by hand",
    severity="blocking",
)

# torch DDP takes these; apex-only ones (delay_allreduce, message_size, ...) have no meaning there
DDP_KWARGS = {
    "device_ids",
    "output_device",
    "broadcast_buffers",
    "process_group",
    "bucket_cap_mb",
    "find_unused_parameters",
    "gradient_as_bucket_view",
    "static_graph",
}
# apex's signatures, to name positional arguments
FUSED_ADAM_ARGS = (
    "params",
    "lr",
    "bias_correction",
    "betas",
    "eps",
    "adam_w_mode",
    "weight_decay",
    "amsgrad",
    "set_grad_none",
)
FUSED_SGD_ARGS = (
    "params",
    "lr",
    "momentum",
    "dampening",
    "weight_decay",
    "nesterov",
    "wd_after_momentum",
    "materialize_master_grads",
    "set_grad_none",
)
ADAM_DROP = {
    "bias_correction",
    "adam_w_mode",
    "set_grad_none",
    "capturable",
    "master_weights",
    "amsgrad",
}
SGD_DROP = {"wd_after_momentum", "materialize_master_grads", "set_grad_none"}
CUDA = "torch.cuda.is_available()"


class ModerniseTransform(Transform):
    name = "apex-modernise"

    def plan(self, ctx: Context) -> None:
        if ctx.opts.amp == "apex" or ctx.a.apex_api is None:
            return
        Modernise(ctx).plan()


class Modernise:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.a = ctx.a
        self.fused_adam: set[str] = set()  # optimizers that were FusedAdam
        self.alias_native: dict[
            str, str
        ] = {}  # a fallback-bound alias (AdamImpl) -> what it becomes
        self.kept: set[str] = set()  # apex names that stay (no torch equivalent)

    def plan(self) -> None:
        ctx = self.ctx
        if module_name(ctx, "torch") != "torch":
            ctx.finding(
                None,
                "DDP096",
                "`torch` is not imported as torch: apex left in place",
                False,
            )
            return
        self._names()
        amp = AmpToTorch(ctx, self.fused_adam)
        amp.plan()
        plan_imports(ctx, self.alias_native, self.kept | amp.failed)
        amp.emit()
        from ddpify.transforms.legacy import kept_extensions

        kept_extensions(self.a, ctx)

    # names from apex.parallel / apex.optimizers / apex.normalization
    def _names(self) -> None:
        ctx, a = self.ctx, self.a
        done: set[int] = set()
        for node in a.calls:
            q = apex_q(a, node.func)
            if q is None or q.startswith("apex.amp") or not ctx.editable(node):
                continue
            done.add(id(node.func))
            short = q.rsplit(".", 1)[-1]
            if short in NO_TORCH_EQUIVALENT:
                self._keep(node, q, NO_TORCH_EQUIVALENT[short])
                continue
            native = NATIVE.get(q)
            if native is None:
                continue  # an apex part with no rewrite: its import stays
            pos, kw = call_args(node)
            if native.endswith("DistributedDataParallel"):
                drop = [k for k in kw if k not in DDP_KWARGS]
                self._call(node, native, drop)
                extra = f"; dropped apex-only {', '.join(drop)}" if drop else ""
                ctx.finding(
                    node,
                    "DDP092",
                    f"apex.parallel.DistributedDataParallel -> torch DistributedDataParallel{extra}",
                    True,
                )
            elif native.endswith("convert_sync_batchnorm"):
                self._sync_bn(node, native, pos, kw)
            elif short == "FusedAdam":
                self._fused_adam(node, q, pos, kw)
            elif short == "FusedSGD":
                self._optimizer(
                    node, "torch.optim.SGD", FUSED_SGD_ARGS, 6, SGD_DROP, {}
                )
                ctx.finding(
                    node, "DDP092", "apex FusedSGD -> torch.optim.SGD(fused=True)", True
                )
            else:
                ctx.edits.replace(node.func, ctx.expr(native))
                ctx.finding(node, "DDP092", f"{q} -> {native}", True)
        # other references (isinstance checks, attributes); not a fallback's own binding
        for node in [*a.attributes, *a.findall(a.module, m.Name())]:
            if (
                id(node) in done
                or a.ancestor(node, cst.Import, cst.ImportFrom) is not None
            ):
                continue
            q = apex_q(a, node)
            par = a.parent.get(node)
            if (
                q not in NATIVE
                or q == "apex.amp"
                or (isinstance(par, cst.Attribute) and par.value is node)
                or not ctx.editable(node)
            ):
                continue
            if (
                also_bound(a, node)
                or isinstance(par, (cst.AssignTarget, cst.Call))
                or q.rsplit(".", 1)[-1] in NO_TORCH_EQUIVALENT
            ):
                continue
            ctx.edits.replace(node, ctx.expr(NATIVE[q]))

    def _keep(self, node: cst.Call, q: str, why: str) -> None:
        self.kept.add(q)
        self.ctx.apex_kept[q] = why

    def _sync_bn(self, node: cst.Call, native: str, pos, kw) -> None:
        """SyncBatchNorm runs on GPUs only ("SyncBatchNorm layers only work with GPU modules" under
        DDP on the CPU): converted where CUDA is there, BatchNorm kept on the CPU."""
        ctx = self.ctx
        if not pos or dotted(pos[0].value) is None:
            ctx.finding(
                node,
                "DDP096",
                "convert_syncbn_model(...) of an expression: bind the model to a name first, model = convert_syncbn_model(model), so the conversion can be limited to GPUs",
                False,
            )
            return
        arg = code(pos[0].value)

        def fn(n: cst.Call) -> cst.BaseExpression:
            call = cst.Call(func=ctx.expr(native), args=[cst.Arg(ctx.expr(arg))])
            return cst.IfExp(
                test=ctx.expr(CUDA),
                body=call,
                orelse=ctx.expr(arg),
                lpar=n.lpar,
                rpar=n.rpar,
                whitespace_before_if=cst.SimpleWhitespace(" "),
                whitespace_after_if=cst.SimpleWhitespace(" "),
                whitespace_before_else=cst.SimpleWhitespace(" "),
                whitespace_after_else=cst.SimpleWhitespace(" "),
            )

        ctx.edits.replace(node, fn)
        ctx.finding(
            node,
            "DDP092",
            "apex convert_syncbn_model -> torch.nn.SyncBatchNorm.convert_sync_batchnorm where CUDA is available (SyncBatchNorm has no CPU kernel; BatchNorm stays on the CPU)",
            True,
        )

    def _fused_adam(self, node: cst.Call, q: str, pos, kw) -> None:
        """FusedAdam's update rule kept: adam_w_mode=True (its default) is AdamW's decoupled weight
        decay, adam_w_mode=False Adam's L2 penalty; its weight_decay defaults to 0 (AdamW's to 0.01)."""
        ctx, a = self.ctx, self.a
        named = {
            **{
                FUSED_ADAM_ARGS[i]: x
                for i, x in enumerate(pos)
                if i < len(FUSED_ADAM_ARGS)
            },
            **kw,
        }
        bias = named.get("bias_correction")
        if bias is not None and not m.matches(bias.value, m.Name("True")):
            self._keep(
                node, q, "FusedAdam(bias_correction=False) has no torch equivalent"
            )
            return
        mode = named.get("adam_w_mode")
        if mode is None or m.matches(mode.value, m.Name("True")):
            cls, said = (
                "torch.optim.AdamW",
                "torch.optim.AdamW (decoupled weight decay, as FusedAdam's default adam_w_mode=True)",
            )
        elif m.matches(mode.value, m.Name("False")):
            cls, said = (
                "torch.optim.Adam",
                "torch.optim.Adam (L2 weight decay, as adam_w_mode=False)",
            )
        else:
            cls = f"(torch.optim.AdamW if {code(mode.value)} else torch.optim.Adam)"
            said = f"torch.optim.AdamW where {code(mode.value)} (decoupled weight decay), else torch.optim.Adam (L2), as adam_w_mode chose"
        add = (
            {}
            if "weight_decay" in named or cls == "torch.optim.Adam"
            else {"weight_decay": "0.0"}
        )
        add["fused"] = "True"
        self._optimizer(node, cls, FUSED_ADAM_ARGS, 2, ADAM_DROP, add)
        target = a._assign_target(node)
        if target:
            self.fused_adam.add(target)
        extra = (
            " (weight_decay=0.0, FusedAdam's default)" if "weight_decay" in add else ""
        )
        ctx.finding(
            node, "DDP092", f"apex FusedAdam -> {said}, fused=True{extra}", True
        )

    def _optimizer(
        self,
        node: cst.Call,
        cls: str,
        names: tuple[str, ...],
        keep_pos: int,
        drop: set[str],
        add: dict[str, str],
    ) -> None:
        """node becomes cls(...): positional arguments past keep_pos named by apex's signature, apex-only ones dropped.
        A callee that is also bound by an import fallback (AdamImpl) keeps its name, bound to cls."""
        ctx, a = self.ctx, self.a
        callee = None
        alias = dotted(node.func)
        if alias and also_bound(a, node.func) and "(" not in cls:
            if self.alias_native.setdefault(alias, cls) == cls:
                callee = alias

        def fn(n: cst.Call) -> cst.Call:
            args = []
            for i, (o, x) in enumerate(zip(node.args, n.args)):
                key = (
                    o.keyword.value
                    if o.keyword is not None
                    else (names[i] if i < len(names) and not o.star else None)
                )
                if key in drop:
                    continue
                if o.keyword is None and i >= keep_pos and key is not None:
                    x = x.with_changes(keyword=cst.Name(key), equal=eq())
                args.append(x)
            out = n.with_changes(
                func=ctx.expr(callee or cls), args=commas(args, n.args)
            )
            for (
                k,
                v,
            ) in add.items():  # in the call's own layout (one a line where it is so)
                out = append_kwarg(out, k, ctx.expr(v))
            return out

        ctx.edits.replace(node, fn)

    def _call(self, node: cst.Call, func: str, drop: list[str]) -> None:
        ctx = self.ctx

        def fn(n: cst.Call) -> cst.Call:
            args = [
                x
                for o, x in zip(node.args, n.args)
                if not (o.keyword is not None and o.keyword.value in drop)
            ]
            return n.with_changes(func=ctx.expr(func), args=commas(args, n.args))

        ctx.edits.replace(node, fn)
