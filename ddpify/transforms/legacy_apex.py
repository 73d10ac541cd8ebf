"""apex amp / apex DDP / convert_syncbn_model / apex optimizers rewritten to torch-native
(torch.amp autocast + GradScaler, torch DDP, torch.nn.SyncBatchNorm, torch.optim), with helpers
that still load checkpoints written by apex. Used by legacy.py, the legacy path's entry point.
"""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import Analysis, call_args, code, dotted
from ddpify.transforms.base import Context, append_kwarg
from ddpify.transforms.precision import PrecisionTransform
from ddpify.transforms.wrapping import WrappingTransform
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare("DDP092", "apex-modernised", "modernised legacy apex to torch-native", fix=True, check="loss")
declare("DDP096", "apex-not-rewritten", "apex rewrite not applied: fix by hand", severity="blocking")

# apex name -> torch-native replacement
NATIVE = {
    "apex.parallel.DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "apex.parallel.distributed.DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "apex.parallel.convert_syncbn_model": "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
    "apex.parallel.SyncBatchNorm": "torch.nn.SyncBatchNorm",
    "apex.optimizers.FusedAdam": "torch.optim.AdamW",
    "apex.optimizers.fused_adam.FusedAdam": "torch.optim.AdamW",
    "apex.optimizers.FusedSGD": "torch.optim.SGD",
    "apex.optimizers.fused_sgd.FusedSGD": "torch.optim.SGD",
}
# torch DDP takes these; apex-only ones (delay_allreduce, message_size, ...) have no meaning there
DDP_KWARGS = {"device_ids", "output_device", "broadcast_buffers", "process_group", "bucket_cap_mb", "find_unused_parameters", "gradient_as_bucket_view", "static_graph"}
ADAM_DROP = {"bias_correction", "adam_w_mode", "set_grad_none", "capturable", "master_weights"}
SGD_DROP = {"wd_after_momentum", "materialize_master_grads", "set_grad_none"}

AMP_GLOBALS = '''\
# ddpify: apex amp (opt_level {level}) became torch.amp: {what}.
AMP_DTYPE = {dtype}
SCALER = torch.amp.GradScaler("cuda", enabled=AMP_DTYPE is not None)  # one scaler for every loss and optimizer
'''
SCALER_STATE = '''\


def scaler_state(state):
    """GradScaler state, also from checkpoints written by apex amp ({"loss_scaler0": {"loss_scale": ...}})."""
    if "loss_scaler0" not in state:
        return state
    old = state["loss_scaler0"]
    return {**SCALER.state_dict(), "scale": float(old["loss_scale"]), "_growth_tracker": int(old["unskipped"])}
'''
FUSED_ADAM_STATE = '''\


def load_fused_adam_state(optimizer, state):
    """Load optimizer state, also from apex's FusedAdam (one `step` per group, none of torch's flags)."""
    for group, saved in zip(optimizer.param_groups, state["param_groups"]):
        step = saved.pop("step", None)
        saved.pop("bias_correction", None)
        for key, value in group.items():
            saved.setdefault(key, value)
        for i in saved["params"]:
            if step is not None and i in state["state"]:
                state["state"][i].setdefault("step", torch.tensor(float(step)))
    optimizer.load_state_dict(state)
'''
AUTOCAST = 'torch.autocast("cuda", dtype=AMP_DTYPE, enabled=AMP_DTYPE is not None)'


def _apex_q(a: Analysis, node: cst.CSTNode) -> str | None:
    for q in a.qualified(node):
        if q.startswith("apex."):
            return q
    return None



def _eq() -> cst.AssignEqual:
    return cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def _module_name(ctx: Context, module: str) -> str:
    """The script's name for `module` (import os), importing it at the top if needed."""
    for name, fulls in ctx._bound.items():
        if module in fulls:
            return name
    if module not in ctx.imports_needed:
        ctx.imports_needed.append(module)
        a = ctx.a
        first = _first_import(a)
        stmt = ctx.stmt(f"import {module}\n")
        if first is not None:
            ctx.edits.before[first].append(stmt)
        else:
            ctx.edits.before[a.module.body[0]].append(stmt)
    return module


def _first_import(a: Analysis) -> cst.BaseStatement | None:
    for s in a.module.body:
        if isinstance(s, cst.SimpleStatementLine) and any(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body):
            return s
    return None


def _last_import(a: Analysis) -> cst.BaseStatement | None:
    last = None
    for s in a.module.body:
        if isinstance(s, (cst.FunctionDef, cst.ClassDef)) or s is a.main_guard:
            break
        if isinstance(s, cst.SimpleStatementLine) and any(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body):
            last = s
    return last


# -- apex -> torch-native -------------------------------------------------------------
class Modernise:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.a = ctx.a
        self.level: str | None = None  # literal opt_level of amp.initialize
        self.uses_amp = False
        self.fused_adam: set[str] = set()  # optimizers that were FusedAdam
        self.helpers: list[str] = []

    def plan(self) -> None:
        ctx, a = self.ctx, self.a
        if _module_name(ctx, "torch") != "torch":
            ctx.finding(None, "DDP096", "`torch` is not imported as torch: apex left in place", False)
            return
        PrecisionTransform()._modernise(ctx)  # torch.cuda.amp -> torch.amp
        WrappingTransform()._replace_dataparallel(ctx)  # DDP already does the parallelism
        self._names()
        self._amp_calls()
        self._imports()
        self._globals()

    # names from apex.parallel / apex.optimizers
    def _names(self) -> None:
        ctx, a = self.ctx, self.a
        done: set[int] = set()
        for node in [*a.calls]:
            q = _apex_q(a, node.func)
            if q not in NATIVE or not ctx.editable(node):
                continue
            done.add(id(node.func))
            native = NATIVE[q]
            pos, kw = call_args(node)
            if native.endswith("DistributedDataParallel"):
                drop = [k for k in kw if k not in DDP_KWARGS]
                self._call(node, native, drop)
                extra = f"; dropped apex-only {', '.join(drop)}" if drop else ""
                ctx.finding(node, "DDP092", f"apex.parallel.DistributedDataParallel -> torch DistributedDataParallel{extra}", True)
            elif native.endswith("convert_sync_batchnorm"):
                self._call(node, native, [k for k in kw if k != "process_group"])
                ctx.finding(node, "DDP092", "apex convert_syncbn_model -> torch.nn.SyncBatchNorm.convert_sync_batchnorm", True)
            elif q.endswith("FusedAdam"):
                adamw = not ("adam_w_mode" in kw and m.matches(kw["adam_w_mode"].value, m.Name("False")))
                if "bias_correction" in kw and m.matches(kw["bias_correction"].value, m.Name("False")):
                    ctx.finding(node, "DDP096", "FusedAdam(bias_correction=False) has no torch equivalent: kept apex", False)
                    continue
                # FusedAdam's weight decay defaults to 0; AdamW's to 0.01
                add = {"fused": "True"} if "weight_decay" in kw else {"weight_decay": "0.0", "fused": "True"}
                self._call(node, "torch.optim.AdamW" if adamw else "torch.optim.Adam", [k for k in kw if k in ADAM_DROP], add)
                target = a._assign_target(node)
                if target:
                    self.fused_adam.add(target)
                ctx.finding(node, "DDP092", f"apex FusedAdam -> torch.optim.{'AdamW' if adamw else 'Adam'}(fused=True)", True)
            elif q.endswith("FusedSGD"):
                self._call(node, native, [k for k in kw if k in SGD_DROP], {"fused": "True"})
                ctx.finding(node, "DDP092", "apex FusedSGD -> torch.optim.SGD(fused=True)", True)
            else:
                ctx.edits.replace(node.func, ctx.expr(native))
                ctx.finding(node, "DDP092", f"{q} -> {native}", True)
        # other references (isinstance checks, attributes)
        for node in [*a.attributes, *a.findall(a.module, m.Name())]:
            if id(node) in done or a.ancestor(node, cst.Import, cst.ImportFrom) is not None:
                continue
            q = _apex_q(a, node)
            par = a.parent.get(node)
            if q in NATIVE and not (isinstance(par, cst.Attribute) and par.value is node) and ctx.editable(node):
                ctx.edits.replace(node, ctx.expr(NATIVE[q]))

    def _call(self, node: cst.Call, func: str, drop: list[str], add: dict[str, str] | None = None) -> None:
        ctx = self.ctx
        add = dict(add or {})

        def fn(n: cst.Call) -> cst.Call:
            args = [x for o, x in zip(node.args, n.args) if not (o.keyword is not None and o.keyword.value in drop)]
            out = n.with_changes(func=ctx.expr(func), args=_commas(args, n.args))
            for k, v in add.items():  # in the call's own layout (one a line where it is so)
                out = append_kwarg(out, k, ctx.expr(v))
            return out

        ctx.edits.replace(node, fn)

    # amp.initialize / scale_loss / master_params / state_dict
    def _amp_calls(self) -> None:
        ctx, a = self.ctx, self.a
        update_after: dict[int, cst.BaseStatement] = {}
        blocks: dict[int, cst.CSTNode] = {}
        stepped: set[int] = set()
        for call in a.calls:
            q = _apex_q(a, call.func)
            if q is None or not q.startswith("apex.amp") or not ctx.editable(call):
                continue
            what = q.rsplit(".", 1)[-1]
            if what == "initialize":
                self._initialize(call)
            elif what == "scale_loss":
                self._scale_loss(call, update_after, blocks, stepped)
            elif what == "master_params":
                pos, _ = call_args(call)
                opt = code(pos[0].value) if pos else "optimizer"
                ctx.edits.replace(call, ctx.expr(f'[p for group in {opt}.param_groups for p in group["params"]]'))
                stmt = a.statement(call)
                if isinstance(a.block(stmt), (cst.IndentedBlock, cst.Module)):
                    ctx.edits.before[stmt].append(ctx.stmt(f"SCALER.unscale_({opt})  # clip the true gradients\n"))
                ctx.finding(call, "DDP092", "amp.master_params(opt) -> the optimizer's parameters, unscaled first (SCALER.unscale_)", True)
            elif what == "state_dict":
                self.uses_amp = True
                ctx.edits.replace(call.func, ctx.expr("SCALER.state_dict"))
                ctx.finding(call, "DDP092", "amp.state_dict() -> SCALER.state_dict()", True)
            elif what == "load_state_dict":
                self.uses_amp = True
                if "scaler_state" not in self.helpers:
                    self.helpers.append("scaler_state")
                ctx.edits.replace(call, lambda n: n.with_changes(func=ctx.expr("SCALER.load_state_dict"), args=[n.args[0].with_changes(value=cst.Call(cst.Name("scaler_state"), [cst.Arg(n.args[0].value)]))]))
                ctx.finding(call, "DDP092", "amp.load_state_dict(s) -> SCALER.load_state_dict(scaler_state(s)); apex's loss-scale entries still load", True)
            else:
                ctx.finding(call, "DDP096", f"amp.{what} has no torch.amp rewrite: change it by hand", False)
        for key, last in update_after.items():
            ctx.edits.after[last].append(ctx.stmt("SCALER.update()\n"))
        # optimizer state saved by FusedAdam
        for call in a.calls:
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "load_state_dict" and dotted(call.func.value) in self.fused_adam and ctx.editable(call):
                if "load_fused_adam_state" not in self.helpers:
                    self.helpers.append("load_fused_adam_state")
                opt = dotted(call.func.value)
                ctx.edits.replace(call, lambda n, opt=opt: n.with_changes(func=cst.Name("load_fused_adam_state"), args=[cst.Arg(ctx.expr(opt), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), *n.args]))
                ctx.finding(call, "DDP092", "optimizer state loaded through load_fused_adam_state: checkpoints written by FusedAdam still load", True)

    def _initialize(self, call: cst.Call) -> None:
        ctx, a = self.ctx, self.a
        self.uses_amp = True
        pos, kw = call_args(call)
        level = kw.get("opt_level")
        if level is None:
            self.level = self.level or "O1"  # apex's default
        elif isinstance(level.value, cst.SimpleString):
            self.level = level.value.evaluated_value
        else:
            self.level = self.level or "O1"
            ctx.finding(call, "DDP096", f"opt_level={code(level.value)} is decided at run time: torch.amp fp16 is used; set AMP_DTYPE = None to train in full precision", False, "note")
        stmt = a.statement(call)
        par = a.parent.get(call)
        args = [code(p.value) for p in pos[:2]]
        if isinstance(par, cst.Assign) and len(par.targets) == 1 and isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
            lhs = par.targets[0].target
            if _names_of(lhs) == [n for p in pos[:2] for n in _names_of(p.value)]:
                ctx.edits.removed.add(stmt)
                ctx.finding(call, "DDP092", f"amp.initialize removed: torch.amp needs no set-up (opt_level {self.level} -> {self._what()})", True)
                return
        ctx.edits.replace(call, ctx.expr(args[0] if len(args) == 1 else f"({', '.join(args)})"))
        ctx.finding(call, "DDP092", f"amp.initialize(...) -> its models and optimizers as they are (opt_level {self.level} -> {self._what()})", True)

    def _what(self) -> str:
        return "full precision" if self.level == "O0" else "fp16 autocast + GradScaler"

    def _scale_loss(self, call: cst.Call, update_after, blocks, stepped) -> None:
        ctx, a = self.ctx, self.a
        self.uses_amp = True
        with_ = a.ancestor(call, cst.With)
        pos, _ = call_args(call)
        if with_ is None or len(with_.items) != 1 or with_.items[0].item is not call or not pos or not isinstance(with_.body, cst.IndentedBlock):
            ctx.finding(call, "DDP096", "amp.scale_loss outside `with amp.scale_loss(loss, opt) as scaled:`: rewrite it as SCALER.scale(loss) by hand", False)
            return
        loss = code(pos[0].value)
        asname = with_.items[0].asname
        scaled = dotted(asname.name) if asname is not None else None
        body = list(with_.body.body)
        single = (
            len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine) and len(body[0].body) == 1
            and isinstance(body[0].body[0], cst.Expr) and m.matches(body[0].body[0].value, m.Call(func=m.Attribute(value=m.Name(scaled or ""), attr=m.Name("backward"))))
        )
        if single:
            bw = body[0].body[0].value

            def fn(n, bw=bw):
                line = n.body.body[0]
                call_ = line.body[0].value
                new = call_.with_changes(func=call_.func.with_changes(value=ctx.expr(f"SCALER.scale({loss})")))
                return line.with_changes(body=[line.body[0].with_changes(value=new)], leading_lines=n.leading_lines)

            ctx.edits.replace(with_, fn)
        else:
            first = ctx.stmt(f"{scaled or '_scaled'} = SCALER.scale({loss})\n")
            ctx.edits.before[with_].append(first.with_changes(leading_lines=with_.leading_lines))
            ctx.edits.before[with_].extend(body)
            ctx.edits.removed.add(with_)
        ctx.finding(call, "DDP092", "amp.scale_loss -> SCALER.scale(loss).backward()", True)
        # the unit: outermost statement around the with inside its loop/function body
        unit = with_
        while isinstance(a.parent.get(a.parent.get(unit)), (cst.If, cst.Else, cst.With)) and not isinstance(a.parent.get(unit), cst.Module):
            unit = a.parent.get(a.parent.get(unit))
        block = a.block(unit)
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return
        # plain backward next to it (an `else: loss.backward()` branch) is scaled too
        for c in a.findall(unit, m.Call(func=m.Attribute(attr=m.Name("backward")))):
            if c is not None and not _inside(a, c, with_) and dotted(c.func.value) not in (scaled,):
                ctx.edits.replace(c, lambda n: n.with_changes(func=n.func.with_changes(value=ctx.expr(f"SCALER.scale({code(n.func.value)})"))))
        body = list(block.body)
        idx = body.index(unit)
        self._autocast(block, body[:idx], pos[0].value)
        last = None
        for s in body[idx + 1 :]:
            for c in a.findall(s, m.Call(func=m.Attribute(attr=m.Name("step")))):
                if a.is_optimizer_ref(c.func.value) and id(c) not in stepped:
                    stepped.add(id(c))
                    ctx.edits.replace(c, ctx.expr(f"SCALER.step({code(c.func.value)})"))
                    last = a.statement(c)
            if last is not None and s is not last and any(a.findall(s, m.With(items=[m.WithItem(item=m.Call(func=m.Attribute(attr=m.Name("scale_loss"))))]))):
                break  # the next loss of the same iteration steps its own optimizer
        if last is None:
            ctx.finding(call, "DDP096", "no optimizer.step() after amp.scale_loss in its block: call SCALER.step(opt) and SCALER.update() there", False)
            return
        prev = update_after.get(id(block))
        if prev is None or body.index(last) > body.index(prev):
            update_after[id(block)] = last

    def _autocast(self, block, before: list, loss: cst.BaseExpression) -> None:
        """forward pass and loss, in the block before the backward, under autocast."""
        ctx, a = self.ctx, self.a
        name = dotted(loss)
        loss_stmt = next((s for s in reversed(before) if name and a._assigns(s, name)), None)
        if loss_stmt is None:
            return
        first = next((s for s in before if a.runs_model(s)), loss_stmt)
        i, j = before.index(first), before.index(loss_stmt)
        if i > j:
            first = loss_stmt
        if any((f, l) for f, l, _ in ctx.edits.wraps if f is first):
            return
        ctx.edits.wraps.append((first, loss_stmt, ctx.expr(AUTOCAST)))
        ctx.finding(first, "DDP092", "forward pass and loss under torch.autocast (fp16 on GPUs, what apex amp's O1 did)", True)

    # imports and module-level helpers
    def _imports(self) -> None:
        ctx, a = self.ctx, self.a
        for s in a.findall(a.module, m.SimpleStatementLine()):
            if len(s.body) != 1 or not isinstance(s.body[0], (cst.Import, cst.ImportFrom)):
                continue
            imp = s.body[0]
            mods = [dotted(x.name) or "" for x in imp.names] if isinstance(imp, cst.Import) else [dotted(imp.module) or ""] if imp.module else []
            if not any(mo == "apex" or mo.startswith("apex.") for mo in mods):
                continue
            if isinstance(imp, cst.ImportFrom) and not isinstance(imp.names, cst.ImportStar):
                keep = [x for x in imp.names if not self._replaced(f"{mods[0]}.{x.evaluated_name}")]
                if keep and len(keep) < len(imp.names):
                    ctx.edits.replace(imp, lambda n, keep=keep: n.with_changes(names=[x.with_changes(comma=cst.MaybeSentinel.DEFAULT) if i == len(keep) - 1 else x for i, x in enumerate(keep)]))
                    continue
                if keep:
                    continue
            elif isinstance(imp, cst.Import) and self._apex_left():
                continue
            if ctx.editable(s):
                ctx.edits.removed.add(s)
        self._keep_spacing()

    def _keep_spacing(self) -> None:
        """A removed import's blank line (between import groups) moves to the next statement."""
        ctx, a = self.ctx, self.a
        body = list(a.module.body)
        for i, s in enumerate(body[:-1]):
            if s not in ctx.edits.removed or not s.leading_lines:
                continue
            nxt = body[i + 1]
            if nxt in ctx.edits.removed or nxt in ctx.edits.before or nxt.leading_lines:
                continue
            ctx.edits.replace(nxt, lambda n, lead=s.leading_lines: n.with_changes(leading_lines=lead))

    def _replaced(self, q: str) -> bool:
        return q in NATIVE or q.startswith("apex.amp") or q == "apex.amp"

    def _apex_left(self) -> bool:
        """apex names that stay (e.g. FusedLAMB): `import apex` is still needed."""
        a = self.a
        for node in a.attributes:
            q = _apex_q(a, node)
            if q and not self._replaced(q) and not isinstance(a.parent.get(node), cst.Attribute):
                return True
        return False

    def _globals(self) -> None:
        ctx, a = self.ctx, self.a
        if not (self.uses_amp or self.helpers):
            return
        level = self.level or "O1"
        if level == "O0":
            text = AMP_GLOBALS.format(level=level, what="full precision, as O0 was", dtype="None")
        else:
            text = AMP_GLOBALS.format(level=level, what="fp16 autocast with loss scaling on GPUs; full precision on CPU", dtype="torch.float16 if torch.cuda.is_available() else None")
        for h in self.helpers:
            text += {"scaler_state": SCALER_STATE, "load_fused_adam_state": FUSED_ADAM_STATE}[h]
        block = list(cst.parse_module("pass\n" + text).body)[1:]
        block[0] = block[0].with_changes(leading_lines=[cst.EmptyLine(), *block[0].leading_lines])
        anchor = _last_import(a)
        if anchor is None:
            ctx.edits.before[a.module.body[0]].extend(block)
            return
        ctx.edits.after[anchor].extend(block)
        body = list(a.module.body)
        nxt = body[body.index(anchor) + 1] if body.index(anchor) + 1 < len(body) else None
        if self.helpers and nxt is not None and not isinstance(nxt, (cst.FunctionDef, cst.ClassDef)):
            # two blank lines after the helper functions
            comments = [ln for ln in nxt.leading_lines if ln.comment is not None]
            ctx.edits.replace(nxt, lambda n: n.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *comments]))


def _names_of(node: cst.BaseExpression) -> list[str]:
    if isinstance(node, (cst.Tuple, cst.List)):
        return [n for el in node.elements for n in _names_of(el.value)]
    return [dotted(node) or code(node)]


def _inside(a: Analysis, node: cst.CSTNode, container: cst.CSTNode) -> bool:
    cur = a.parent.get(node)
    while cur is not None:
        if cur is container:
            return True
        cur = a.parent.get(cur)
    return False


def _commas(args: list[cst.Arg], original) -> list[cst.Arg]:
    """Commas between arguments; the last keeps the original call's trailing layout."""
    tail = original[-1].comma if original else cst.MaybeSentinel.DEFAULT
    out = []
    for i, x in enumerate(args):
        if i < len(args) - 1:
            out.append(x.with_changes(comma=x.comma if isinstance(x.comma, cst.Comma) else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))))
        else:
            out.append(x.with_changes(comma=tail))
    return out
