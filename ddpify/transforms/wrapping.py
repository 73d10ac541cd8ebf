"""Model wrapping: DistributedDataParallel after the model reaches its device; DataParallel
replaced, not wrapped; SyncBatchNorm where asked."""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import forwards, gradients, lifecycle, model_code, model_uses
from ddpify.analysis import call_args, code, dotted
from ddpify.transforms.base import Context, Transform
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare("DDP030", "ddp-wrap", "model wrapped in DistributedDataParallel", fix=True, check="params-in-sync")
declare("DDP031", "dataparallel-replaced", "nn.DataParallel replaced by DistributedDataParallel", fix=True, check="params-in-sync")
declare("DDP032", "sync-batchnorm", "BatchNorm converted to SyncBatchNorm", fix=True, check="params-in-sync")
declare("DDP034", "model-not-found", "no model found: wrap it in DistributedDataParallel by hand", severity="blocking")
declare("DDP035", "model-on-cpu", "model never moved to a device: it stays on the CPU", severity="blocking")
declare("DDP036", "model-changed-after-wrap", "model changed where DDP cannot follow (in training, or later): not wrapped", severity="blocking")
declare("DDP037", "unused-parameters", "parameters that may get no gradient: find_unused_parameters=True", fix=True, check="ranks")
declare("DDP038", "model-in-container", "model run through a list or dict that holds it: not wrapped", severity="blocking")
declare("DDP039", "model-frozen", "model with every parameter frozen: not wrapped")
declare("DDP136", "broadcast-buffers-off", "model run more than once before one backward: DDP broadcast_buffers=False (each rank keeps its own BatchNorm statistics)", fix=True, check="ranks")

PLACEMENT_METHODS = ("to", "cuda", "half", "float", "bfloat16", "double", "to_empty")


class WrappingTransform(Transform):
    name = "wrapping"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        dp_stmts = self._replace_dataparallel(ctx)
        held = model_uses.container_models(a)
        for call, what in held:
            ctx.finding(call, "DDP034", f"the model `{what}` is held in a dict or list: wrap each trained one by hand after its last change, {what} = DDP({what}, device_ids=[LOCAL_RANK]), and use {what}.module where the plain model is needed", False)
        if not a.models:
            if a.steps and not held:
                why = self._trains_itself(ctx) or "no model found (no optimizer over model.parameters()): wrap it with DDP(model, device_ids=[LOCAL_RANK]) by hand"
                ctx.finding(a.steps[0].backward, "DDP034", why, False)
            return
        for name in a.models:
            self._wrap(ctx, name, dp_stmts)

    @staticmethod
    def _trains_itself(ctx: Context) -> str | None:
        """A module class that builds its own optimizer over self.parameters() and steps it in
        its own method (forward-forward's per-layer training): no outside forward for a DDP
        wrap to sync, so say that, and what to do by hand."""
        a = ctx.a
        for step in a.steps:
            cls, fn = a.class_of(step.stmt), a.function_of(step.stmt)
            if cls is None or fn is None:
                continue
            for call in a.findall(cls, m.Call()):
                if a._is_optimizer_call(call) and "self" in a._param_sources(call):
                    return (f"class `{cls.name.value}` builds its own optimizer over self.parameters() (line {a.pos[call].start.line}) "
                            f"and updates itself in its method `{fn.name.value}`: no forward of the model runs outside it, so a DDP wrap "
                            "would sync nothing; by hand, give each rank its share of the data and average the gradients before "
                            "each step (for p in self.parameters(): dist.all_reduce(p.grad); p.grad /= WORLD_SIZE)")
        return None

    def _replace_dataparallel(self, ctx: Context) -> set[cst.BaseStatement]:
        a = ctx.a
        stmts: set[cst.BaseStatement] = set()
        for call in a.dataparallel_calls:
            if not ctx.editable(call):
                continue
            pos, _ = call_args(call)
            if not pos:
                continue
            inner = pos[0].value
            stmt = a.statement(call)
            stmts.add(stmt)
            par = a.parent.get(call)
            if isinstance(par, cst.Assign) and len(par.targets) == 1 and dotted(par.targets[0].target) == dotted(inner) and isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
                ctx.edits.removed.add(stmt)
            else:
                ctx.edits.replace(call, lambda node: node.args[0].value)
            ctx.finding(call, "DDP031", "nn.DataParallel replaced by DistributedDataParallel (one process per GPU)", True)
        for call in a.functional_dp_calls:
            if not ctx.editable(call):
                continue
            pos, _ = call_args(call)
            if len(pos) < 2:
                continue

            def fn(node):
                return cst.Call(func=node.args[0].value, args=[node.args[1].with_changes(comma=cst.MaybeSentinel.DEFAULT)])

            ctx.edits.replace(call, fn)
            ctx.finding(call, "DDP031", "nn.parallel.data_parallel(model, x) becomes model(x); DDP does the parallelism", True)
        return stmts

    def _binding(self, ctx: Context, name: str) -> cst.BaseStatement | None:
        a = ctx.a
        opt_fns = {a.function_of(c) for o, c in a.optimizers.items() if name in a._param_sources(c)}
        cands = []
        for asg in a.assigns:
            targets = [t.target for t in asg.targets] if isinstance(asg, cst.Assign) else [asg.target]
            from ddpify.analysis import _flatten_targets

            if any(dotted(el) == name for t in targets for el in _flatten_targets(t)):
                stmt = self._lift(ctx, a.statement(asg), name)
                if isinstance(a.block(stmt), (cst.IndentedBlock, cst.Module)) and stmt not in cands:
                    cands.append(stmt)
        if not cands:
            return None
        same = [s for s in cands if a.function_of(s) in opt_fns]
        return (same or cands)[0]

    def _lift(self, ctx: Context, stmt: cst.BaseStatement, name: str) -> cst.BaseStatement:
        """A model built in `if/else` (or try, with) branches is wrapped once, after the
        whole statement, unless the branch goes on to train it."""
        a = ctx.a
        while True:
            block = a.block(stmt)
            if not isinstance(block, cst.IndentedBlock):
                return stmt
            rest = list(block.body)[list(block.body).index(stmt) + 1 :]
            if any(isinstance(s, (cst.For, cst.While)) or ctx.a.findall(s, m.For() | m.While()) or self._uses_model(ctx, s, name) for s in rest):
                return stmt
            owner = a.branch_owner(stmt)
            if owner is None:
                return stmt
            stmt = owner

    @staticmethod
    def _other_trainers(a, name: str, bind: cst.CSTNode) -> list[str]:
        """Other classes that also bind `self.X` and train (GAN, CGAN, ... each with self.G): one
        wrap of self.X covers only the class it is placed in."""
        if not name.startswith("self.") or name.count(".") != 1:
            return []
        mine = a.class_of(bind)
        training = {id(c): c for c in (a.class_of(st.stmt) for st in a.steps) if c is not None and c is not mine}
        out = []
        for cls in training.values():
            binds = any(isinstance(t.target, cst.Attribute) and dotted(t.target) == name
                        for asg in a.findall(cls, m.Assign()) for t in asg.targets)
            if binds:
                out.append(cls.name.value)
        return sorted(out)

    def _wrap(self, ctx: Context, name: str, dp_stmts: set[cst.BaseStatement]) -> None:
        a = ctx.a
        bind = self._binding(ctx, name)
        if bind is None:
            ctx.finding(None, "DDP034", f"could not find where `{name}` is created: wrap it with DDP({name}, device_ids=[LOCAL_RANK]) by hand", False)
            return
        block = a.block(bind)
        body = list(block.body)
        anchor = bind
        # after the last change to the model (placement, init, weights, freezing, compile,
        # SyncBatchNorm), before the first statement that runs it or hands it on
        for s in body[body.index(bind) + 1 :]:
            if lifecycle.trains(a, s):
                break
            effect = lifecycle.statement_effect(a, s, name)
            if effect == "use":
                break
            if effect == "change" or s in dp_stmts or any(x in dp_stmts for x in ctx.a.findall(s, m.SimpleStatementLine())):
                anchor = s
        if not ctx.editable(anchor):
            ctx.skipped_here(anchor, f"`{name}` not wrapped in DistributedDataParallel: the ranks would train unsynchronised copies", blocking=True)
            return
        frozen = gradients.fully_frozen(a, name, body[body.index(bind) : body.index(anchor) + 1])
        if frozen is not None:
            ctx.finding(frozen, "DDP039", f"every parameter of `{name}` is frozen here, and DDP refuses a module with nothing to train: not wrapped (its weights must be the same on every rank: loaded, or built after the same seed)", True)
            return
        held = model_uses.forward_through_container(a, name)
        if held is not None:
            ctx.finding(held[0], "DDP038", f"`{held[1]}` holds `{name}` itself and runs it: forwards through `{held[1]}` would bypass a DDP wrap of `{name}` (no gradient sync), and its state dicts need the plain module: not wrapped; put the wrapped model in `{held[1]}` (DDP({name}, device_ids=[LOCAL_RANK])) and use .module for its state dict", False)
            return
        part = next((c for c in a.calls if isinstance(c.func, cst.Subscript) and dotted(c.func.value) == name), None)
        if part is not None:
            # model[0](x) runs a layer of the model itself: no DDP forward, and a wrapper has no [ ]
            ctx.finding(part, "DDP038", f"`{code(part.func)}` runs a part of `{name}` directly: a DDP wrapper has no `[ ]`, and a forward that bypasses it syncs no gradients: not wrapped; run the whole model (or give it a forward that does this) and wrap it with DDP({name}, device_ids=[LOCAL_RANK])", False)
            return
        late = lifecycle.late_changes(a, name, anchor)
        if late:
            for node, kind in late:
                ctx.finding(node, "DDP036", f"`{name}` is changed here ({lifecycle.WHAT[kind]}) after the point where it must be wrapped in DistributedDataParallel (before its first training forward), and DDP cannot follow that change once it holds the model: not wrapped; make the change before training starts (or rebuild DDP after it), then wrap it with DDP({name}, device_ids=[LOCAL_RANK])", False)
            return
        others = self._other_trainers(a, name, bind)
        if others:
            ctx.finding(bind, "DDP034", f"`{name}` is a model trained in several classes ({', '.join(others)} besides "
                        f"{a.class_of(bind).name.value}), and which one trains is decided at run time: ddpify wraps one model in one place, "
                        f"so the others would train unsynchronised; wrap {name} = DDP({name}, device_ids=[LOCAL_RANK]) by hand in each class", False)
            return
        ctx.wrapped[name] = anchor
        if ctx.opts.amp == "apex":  # apex.py places amp.initialize and apex's DDP
            ctx.apex_models.append((name, bind, anchor))
            return
        ddp = ctx.name("DDP")
        bn = model_code.has_batchnorm(model_code.model_code(a, bind, ctx.path)) if ctx.opts.sync_bn else None
        if ctx.opts.sync_bn and bn is False:
            ctx.finding(bind, "DDP032", f"--sync-bn: `{name}` has no BatchNorm layers (its code is read), so nothing is converted", False)
        elif ctx.opts.sync_bn:
            # SyncBatchNorm runs on GPUs only: a model the script keeps on the CPU keeps BatchNorm
            ctx.edits.after[anchor].append(ctx.stmt(
                f'{name} = {ctx.name("torch")}.nn.SyncBatchNorm.convert_sync_batchnorm({name}) if next({name}.parameters()).is_cuda else {name}\n'
            ))
            maybe = "" if bn else ", if it has any (ddpify cannot read all of its code),"
            ctx.finding(bind, "DDP032", f"BatchNorm layers of `{name}`{maybe} converted to SyncBatchNorm (--sync-bn)", True)
        unused = gradients.unused_parameters(a, bind)
        dropped = gradients.discarded_outputs(a, name)
        if dropped:
            unused.append(f"outputs of {name}(...) are discarded at line {a.pos[dropped[0]].start.line} (the parameters behind them may get no gradient from that loss)")
        extra = ", find_unused_parameters=True" if unused else ""
        repeat = forwards.repeated_forward(a, name)
        if repeat is not None and forwards.may_hold_buffers(a, bind, ctx.path):
            extra += ", broadcast_buffers=False"
            self._repeat_finding(ctx, name, *repeat)
        # no device_ids: DDP works on the device the model is on, this rank's GPU or the CPU
        # where the script keeps it (a --cuda flag left off); device_ids=[LOCAL_RANK] would
        # refuse a CPU module, and would also move every input (CPU lengths included) to the GPU
        ctx.edits.after[anchor].append(ctx.stmt(f"{name} = {ddp}({name}{extra})\n"))
        if unused:
            ctx.finding(bind, "DDP037", f"`{name}`: {'; '.join(unused)}: DDP would wait for their gradients (\"Expected to have finished reduction\" at step 2), so find_unused_parameters=True (slower; drop what is never used to avoid it)", True)
        why = lifecycle.last_change(a, anchor, name) if anchor is not bind else None
        if why:
            ctx.finding(bind, "DDP030", f"`{name}` wrapped in DistributedDataParallel after line {a.pos[anchor].start.line}, the last statement that changes it before training ({why})", True)
        else:
            where = "where it is built (a CPU program: no device_ids)" if ctx.cpu_only else "after it reaches its device (no device_ids: DDP follows the model's own device, this rank's GPU or the CPU where the script keeps it)"
            ctx.finding(bind, "DDP030", f"`{name}` wrapped in DistributedDataParallel {where}", True)
        if not ctx.cpu_only and not self._ever_placed(ctx, name, bind):
            ctx.finding(bind, "DDP035", f"`{name}` is never moved to a device, but the script places other things on one: on GPUs it would stay on the CPU while its inputs go to the GPU (the script fails there already); move it with .to(LOCAL_DEVICE) where it is built (or keep the whole script on the CPU: remove its device handling)", False)

    @staticmethod
    def _repeat_finding(ctx: Context, name: str, again: cst.Call, backward: cst.Call) -> None:
        a = ctx.a
        how = "in a loop" if forwards._in_loop(a, again, a.block(a.statement(backward))) else "a second time"
        why = (f"`{name}` runs {how} here before one backward ({code(backward).strip()}): DDP copies rank 0's buffers into "
               "it in place at every forward, which (torch < 2.13, pytorch issue #175024) breaks the first forward's backward "
               "on GPUs (BatchNorm: \"modified by an inplace operation\"), so broadcast_buffers=False")
        if ctx.opts.sync_bn:
            why += ("; with --sync-bn its BatchNorm statistics are computed over all ranks on GPUs (SyncBatchNorm), so they stay "
                    "the same on every rank without the broadcast; on CPU, where BatchNorm stays, each rank keeps its own")
        else:
            why += ("; each rank keeps its own buffers (BatchNorm running statistics from its own shard) and rank 0's are "
                    "the ones saved; parameters stay in sync (--sync-bn would share the statistics)")
        ctx.finding(again, "DDP136", why, True)

    def _ever_placed(self, ctx: Context, name: str, bind: cst.BaseStatement) -> bool:
        """Whether anything in the script may put the model on a device: a placement call on
        it or in the statement that builds it, a device handed to its constructor, or a
        default device. Unsure means yes: the finding is for scripts that plainly train on CPU."""
        a = ctx.a
        for c in a.calls:
            f = c.func
            if isinstance(f, cst.Attribute) and f.attr.value in PLACEMENT_METHODS and dotted(f.value) in (name, "self"):
                return True
            if a.is_call(c, "torch.set_default_device") or a.is_call(c, "torch.device") and isinstance(a.parent.get(a.parent.get(c)), cst.WithItem):
                return True
        for c in a.findall(bind, m.Call()):
            if isinstance(c.func, cst.Attribute) and c.func.attr.value in PLACEMENT_METHODS:
                return True
            if any(x.keyword is not None and "device" in x.keyword.value for x in c.args):
                return True
            if any("device" in (dotted(x.value) or "").lower() for x in c.args):
                return True
        # a model built by the script's own function, or unpickled whole, may already be placed
        return any((dotted(x.func) or "").split(".")[0] in a.functions or a.is_call(x, "torch.load") for x in a.findall(bind, m.Call()))

    def _uses_model(self, ctx: Context, stmt: cst.CSTNode, name: str) -> bool:
        """The model runs or is handed to other code: it must be wrapped by then."""
        for c in ctx.a.findall(stmt, m.Call()):
            if dotted(c.func) == name:
                return True
            fname = dotted(c.func)
            if fname and fname.rsplit(".", 1)[-1] in ctx.a.functions and any(dotted(x.value) == name for x in c.args):
                return True
        return False
