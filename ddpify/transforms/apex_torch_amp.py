"""apex amp rewritten to torch.amp: autocast over each scaled step's forward pass and loss, one
GradScaler for every loss and optimizer (SCALER.scale(loss).backward(), SCALER.step(opt),
SCALER.update() once per iteration), amp state through the scaler (checkpoints written by apex
still load). Mixed precision only where the script had it: an amp.initialize that always runs
becomes module-level settings (fp16 on GPUs, full precision for O0 and on CPU); one behind the
script's own switch (`if args.fp16:`, an opt_level from the config, enabled=...) becomes
amp_initialize(...), which turns it on there and only there.

Every shape of scale_loss apex documents: one backward then the step; an if/else whose other
branch is a plain backward; a helper whose caller steps; several losses (loss_id) onto fewer
optimizers, each step matched to the optimizers its loss was scaled for.
"""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import Step, call_args, code, dotted
from ddpify.analysis.tree import _inside
from ddpify.transforms.apex_common import apex_q, commas, module_block
from ddpify.transforms.base import Context

DTYPE = {
    "bf16": "torch.bfloat16",
    "none": "None",
}  # --amp choice -> dtype; else fp16, what apex amp did
STATIC = """\


# ddpify: apex amp (opt_level {level}) became torch.amp: {what}.
AMP_DTYPE = {dtype}
SCALER = torch.amp.GradScaler("cuda", enabled=AMP_DTYPE == torch.float16)  # one scaler for every loss and optimizer
"""
DYNAMIC = '''\


# ddpify: apex amp became torch.amp: full precision until amp_initialize() runs where amp.initialize() did.
AMP_DTYPE = None
SCALER = torch.amp.GradScaler("cuda", enabled=False)  # one scaler for every loss and optimizer


def amp_initialize(models, optimizers=None, enabled=True, opt_level="O1"):
    """apex's amp.initialize in torch.amp: {what} on GPUs
    from here on (O0: full precision); its arguments back."""
    global AMP_DTYPE, SCALER
    AMP_DTYPE = {dtype} if enabled and opt_level != "O0" and torch.cuda.is_available() else None
    SCALER = torch.amp.GradScaler("cuda", enabled=AMP_DTYPE == torch.float16)
    return models if optimizers is None else (models, optimizers)
'''
SCALER_STATE = '''\


def scaler_state(state):
    """GradScaler state, also from checkpoints written by apex amp
    ({"loss_scaler0": {"loss_scale": ...}})."""
    if "loss_scaler0" not in state:
        return state or SCALER.state_dict()  # {}: saved while the scaler was off
    old = state["loss_scaler0"]
    return {**SCALER.state_dict(), "scale": float(old["loss_scale"]), "_growth_tracker": int(old["unskipped"])}
'''
FUSED_ADAM_STATE = '''\


def load_fused_adam_state(optimizer, state):
    """Load optimizer state, also from apex's FusedAdam (one `step` per group, none of
    torch's flags)."""
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
CLIP = (
    "torch.nn.utils.clip_grad_norm_",
    "torch.nn.utils.clip_grad_value_",
    "torch.nn.utils.clip_grad.clip_grad_norm_",
    "torch.nn.utils.clip_grad.clip_grad_value_",
)
INIT_KWARGS = (
    "models",
    "optimizers",
    "enabled",
    "opt_level",
)  # apex's order; the rest is apex-only


class AmpToTorch:
    def __init__(self, ctx: Context, fused_adam: set[str]) -> None:
        self.ctx = ctx
        self.a = ctx.a
        self.fused_adam = fused_adam
        self.level: str | None = (
            None  # literal opt_level of an amp.initialize that always runs
        )
        self.used = False
        self.dynamic = False
        self.helpers: list[str] = []
        self.stepped: dict[int, cst.Call] = {}  # optimizer steps rewritten
        self.update_after: dict[
            int, tuple[cst.CSTNode, cst.BaseStatement]
        ] = {}  # block -> last step statement
        self.autocast_done: set[int] = set()
        self.failed: set[str] = set()  # apex names left as they are: their import stays
        self.unscaled: set[int] = set()  # statements SCALER.unscale_ was placed before

    def plan(self) -> None:
        ctx, a = self.ctx, self.a
        calls = [(c, apex_q(a, c.func)) for c in a.calls]
        calls = [
            (c, q)
            for c, q in calls
            if q is not None and q.startswith("apex.amp") and ctx.editable(c)
        ]
        inits = [c for c, q in calls if q.endswith(".initialize")]
        self.dynamic = any(not self._static(c) for c in inits)
        if self.dynamic and a.several_files():
            self._one_file(
                inits, [c for c, q in calls if not q.endswith(".initialize")]
            )
        for call, q in calls:
            what = q.rsplit(".", 1)[-1]
            if what == "initialize":
                self._initialize(call)
            elif what == "scale_loss":
                self._scale_loss(call)
            elif what == "master_params":
                pos, _ = call_args(call)
                opt = code(pos[0].value) if pos else "optimizer"
                ctx.edits.replace(
                    call,
                    ctx.expr(
                        f'[p for group in {opt}.param_groups for p in group["params"]]'
                    ),
                )
                self._unscale(a.statement(call), opt)
                ctx.finding(
                    call,
                    "DDP092",
                    "amp.master_params(opt) -> the optimizer's parameters, unscaled first (SCALER.unscale_)",
                    True,
                )
            elif what == "state_dict":
                self.used = True
                ctx.edits.replace(call.func, ctx.expr("SCALER.state_dict"))
                ctx.finding(
                    call, "DDP092", "amp.state_dict() -> SCALER.state_dict()", True
                )
            elif what == "load_state_dict":
                self.used = True
                self._helper("scaler_state")
                ctx.edits.replace(
                    call,
                    lambda n: n.with_changes(
                        func=ctx.expr("SCALER.load_state_dict"),
                        args=[
                            n.args[0].with_changes(
                                value=cst.Call(
                                    cst.Name("scaler_state"), [cst.Arg(n.args[0].value)]
                                )
                            )
                        ],
                    ),
                )
                ctx.finding(
                    call,
                    "DDP092",
                    "amp.load_state_dict(s) -> SCALER.load_state_dict(scaler_state(s)); apex's loss-scale entries still load",
                    True,
                )
            else:
                self.failed.add(q)
                ctx.finding(
                    call,
                    "DDP096",
                    f"amp.{what} has no torch.amp rewrite: change it by hand",
                    False,
                )
        for block, last in self.update_after.values():
            ctx.edits.after[last].append(ctx.stmt("SCALER.update()\n"))
        # optimizer state saved by FusedAdam
        for call in a.calls:
            if (
                isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "load_state_dict"
                and dotted(call.func.value) in self.fused_adam
                and ctx.editable(call)
            ):
                self._helper("load_fused_adam_state")
                opt = dotted(call.func.value)
                ctx.edits.replace(
                    call,
                    lambda n, opt=opt: n.with_changes(
                        func=cst.Name("load_fused_adam_state"),
                        args=[
                            cst.Arg(
                                ctx.expr(opt),
                                comma=cst.Comma(
                                    whitespace_after=cst.SimpleWhitespace(" ")
                                ),
                            ),
                            *n.args,
                        ],
                    ),
                )
                ctx.finding(
                    call,
                    "DDP092",
                    "optimizer state loaded through load_fused_adam_state: checkpoints written by FusedAdam still load",
                    True,
                )

    def _helper(self, name: str) -> None:
        if name not in self.helpers:
            self.helpers.append(name)

    # -- amp.initialize -----------------------------------------------------------------
    def _static(self, call: cst.Call) -> bool:
        """Runs whenever its function (or the script) runs, with a literal opt_level: the precision is
        fixed, and module-level settings say it. Otherwise the script's own switch decides at run time."""
        a = self.a
        stmt = a.statement(call)
        block = a.block(stmt)
        if not (
            isinstance(block, cst.Module)
            or isinstance(a.parent.get(block), cst.FunctionDef)
        ):
            return False
        _, kw = call_args(call)
        level = kw.get("opt_level")
        enabled = kw.get("enabled")
        return (level is None or isinstance(level.value, cst.SimpleString)) and (
            enabled is None or m.matches(enabled.value, m.Name("True"))
        )

    def _one_file(self, inits: list[cst.Call], uses: list[cst.Call]) -> None:
        """Project mode: each file gets its own copy of the generated settings, so the switch
        amp_initialize() flips in one file does not reach the scaled steps of another."""
        a = self.a
        files = {a.region_of(c) for c in inits}
        apart = next((c for c in uses if a.region_of(c) not in files), None)
        if apart is not None:
            self.ctx.finding(
                apart,
                "DDP096",
                "amp.initialize runs behind a switch in another file of the project than this amp call: "
                "the torch.amp settings it turns on would not reach this file (each file gets its own copy); "
                "call amp.initialize in the file that scales the loss, or convert with --amp apex",
                False,
            )

    def _initialize(self, call: cst.Call) -> None:
        ctx, a = self.ctx, self.a
        self.used = True
        pos, kw = call_args(call)
        level = kw.get("opt_level")
        literal = (
            level.value.evaluated_value
            if level is not None and isinstance(level.value, cst.SimpleString)
            else None
        )
        if not self.dynamic:
            self.level = self.level or literal or "O1"
            args = [code(p.value) for p in pos[:2]]
            stmt = a.statement(call)
            par = a.parent.get(call)
            if (
                isinstance(par, cst.Assign)
                and len(par.targets) == 1
                and isinstance(stmt, cst.SimpleStatementLine)
                and len(stmt.body) == 1
            ):
                if _names_of(par.targets[0].target) == [
                    n for p in pos[:2] for n in _names_of(p.value)
                ]:
                    ctx.edits.removed.add(stmt)
                    ctx.finding(
                        call,
                        "DDP092",
                        f"amp.initialize removed: torch.amp needs no set-up (opt_level {self.level} -> {self._what(self.level)})",
                        True,
                    )
                    return
            ctx.edits.replace(
                call, ctx.expr(args[0] if len(args) == 1 else f"({', '.join(args)})")
            )
            ctx.finding(
                call,
                "DDP092",
                f"amp.initialize(...) -> its models and optimizers as they are (opt_level {self.level} -> {self._what(self.level)})",
                True,
            )
            return
        dropped = [k for k in kw if k not in INIT_KWARGS]

        def fn(n: cst.Call) -> cst.Call:
            args = [
                x
                for o, x in zip(call.args, n.args)
                if o.keyword is None or o.keyword.value in INIT_KWARGS
            ]
            return n.with_changes(
                func=cst.Name("amp_initialize"), args=commas(args, n.args)
            )

        ctx.edits.replace(call, fn)
        said = (
            f"opt_level {literal}"
            if literal
            else f"opt_level={code(level.value)}"
            if level is not None
            else "opt_level O1"
        )
        extra = (
            f"; apex-only {', '.join(dropped)} dropped (the GradScaler scales dynamically)"
            if dropped
            else ""
        )
        ctx.finding(
            call,
            "DDP092",
            f"amp.initialize -> amp_initialize: {self._what(literal or 'O1')} where the script initialises amp ({said}), full precision where it does not{extra}",
            True,
        )

    def _what(self, level: str) -> str:
        dtype = DTYPE.get(self.ctx.opts.amp, "torch.float16")
        if level == "O0" or dtype == "None":
            return "full precision"
        return (
            "bf16 autocast"
            if dtype == "torch.bfloat16"
            else "fp16 autocast + GradScaler"
        )

    # -- amp.scale_loss -----------------------------------------------------------------
    def _scale_loss(self, call: cst.Call) -> None:
        ctx, a = self.ctx, self.a
        self.used = True
        with_ = a.ancestor(call, cst.With)
        pos, _ = call_args(call)
        if (
            with_ is None
            or len(with_.items) != 1
            or with_.items[0].item is not call
            or not pos
            or not isinstance(with_.body, cst.IndentedBlock)
        ):
            self.failed.add(apex_q(a, call.func))
            ctx.finding(
                call,
                "DDP096",
                "amp.scale_loss outside `with amp.scale_loss(loss, opt) as scaled:`: rewrite it as SCALER.scale(loss) by hand",
                False,
            )
            return
        loss = code(pos[0].value)
        opts = _names_of(pos[1].value) if len(pos) > 1 else []
        step = next(
            (s for s in a.steps if s.backward in a.findall(with_, m.Call())), None
        )
        self._rewrite_with(with_, loss)
        ctx.finding(
            call, "DDP092", "amp.scale_loss -> SCALER.scale(loss).backward()", True
        )
        unit = step.stmt if step is not None else with_
        if isinstance(
            unit, cst.If
        ):  # if fp16: <scaled backward> else: loss.backward(): one scaled backward
            ctx.edits.replace(
                unit,
                lambda n, w=with_: cst.SimpleStatementLine(
                    [cst.Expr(ctx.expr(f"SCALER.scale({loss}).backward()"))],
                    leading_lines=n.leading_lines,
                ),
            )
        else:
            unit = self._unit(with_)
            for c in a.findall(unit, m.Call(func=m.Attribute(attr=m.Name("backward")))):
                if (
                    not _inside(a, c, with_) and code(c.func.value) == loss
                ):  # a plain backward beside it
                    ctx.edits.replace(
                        c,
                        lambda n: n.with_changes(
                            func=n.func.with_changes(
                                value=ctx.expr(f"SCALER.scale({code(n.func.value)})")
                            )
                        ),
                    )
        if step is not None:
            self._autocast(step.block, step.forward_first, step.loss_stmt, unit)
        block = a.block(unit)
        if isinstance(block, (cst.IndentedBlock, cst.Module)) and self._steps_after(
            block, unit, opts
        ):
            return
        if self._through_callers(call, unit, loss, opts):
            return
        ctx.finding(
            call,
            "DDP096",
            f"no optimizer.step() of {', '.join(opts) or 'its optimizer'} found after amp.scale_loss (in its block, or after the calls of its function): call SCALER.step(opt) and SCALER.update() there",
            False,
        )

    def _rewrite_with(self, with_: cst.With, loss: str) -> None:
        ctx = self.ctx
        asname = with_.items[0].asname
        scaled = dotted(asname.name) if asname is not None else None
        body = list(with_.body.body)
        single = (
            len(body) == 1
            and isinstance(body[0], cst.SimpleStatementLine)
            and len(body[0].body) == 1
            and isinstance(body[0].body[0], cst.Expr)
            and m.matches(
                body[0].body[0].value,
                m.Call(
                    func=m.Attribute(
                        value=m.Name(scaled or ""), attr=m.Name("backward")
                    )
                ),
            )
        )
        if single:

            def fn(n):
                line = n.body.body[0]
                call_ = line.body[0].value
                new = call_.with_changes(
                    func=call_.func.with_changes(
                        value=ctx.expr(f"SCALER.scale({loss})")
                    )
                )
                return line.with_changes(
                    body=[line.body[0].with_changes(value=new)],
                    leading_lines=n.leading_lines,
                )

            ctx.edits.replace(with_, fn)
        else:
            first = ctx.stmt(f"{scaled or '_scaled'} = SCALER.scale({loss})\n")
            ctx.edits.before[with_].append(
                first.with_changes(leading_lines=with_.leading_lines)
            )
            ctx.edits.before[with_].extend(body)
            ctx.edits.removed.add(with_)

    def _unit(self, with_: cst.With) -> cst.CSTNode:
        """The outermost if/else/with around the scaled backward in its loop or function body."""
        a = self.a
        unit = with_
        while (
            isinstance(a.parent.get(a.parent.get(unit)), (cst.If, cst.Else, cst.With))
            and a.parent.get(a.parent.get(unit)) is not a.main_guard
        ):
            unit = a.parent.get(a.parent.get(unit))
            if isinstance(unit, cst.Else):
                unit = a.parent.get(unit)
        return unit

    def _steps_after(
        self,
        block,
        unit: cst.CSTNode,
        opts: list[str],
        names: dict[str, str] | None = None,
    ) -> bool:
        """SCALER.step for the steps of the loss's optimizers after unit in block (the first
        statement that steps one of them); True when found."""
        a = self.a
        body = list(block.body)
        pending = {names.get(o, o) if names else o for o in opts}
        found_any = False
        between: list[cst.BaseStatement] = []
        for s in body[body.index(unit) + 1 :]:
            found = [
                c
                for c in a.findall(s, m.Call(func=m.Attribute(attr=m.Name("step"))))
                if not c.args
                and (
                    code(c.func.value) in pending
                    if opts
                    else a.is_optimizer_ref(c.func.value)
                )
            ]
            for c in found:
                self._step(c)
                pending.discard(code(c.func.value))
            if found:
                self._unscale_before_clips(between, code(found[0].func.value))
            between.append(s)
            found_any = found_any or bool(found)
            if (
                found and not pending
            ):  # every optimizer the loss was scaled for has stepped
                break
        return found_any

    def _unscale_before_clips(self, stmts: list[cst.BaseStatement], opt: str) -> None:
        """Clipping after the scaled backward needs the true gradients (apex's scale_loss unscaled
        them on exit; the GradScaler does it in SCALER.unscale_(opt))."""
        a = self.a
        for s in stmts:
            for c in a.findall(s, m.Call()):
                if a.is_call(c, *CLIP):
                    self._unscale(a.statement(c), opt)

    def _unscale(self, stmt: cst.BaseStatement, opt: str) -> None:
        if id(stmt) in self.unscaled or not isinstance(
            self.a.block(stmt), (cst.IndentedBlock, cst.Module)
        ):
            return
        self.unscaled.add(id(stmt))
        self.ctx.edits.before[stmt].append(
            self.ctx.stmt(f"SCALER.unscale_({opt})  # clip the true gradients\n")
        )

    def _step(self, call: cst.Call) -> None:
        ctx, a = self.ctx, self.a
        if id(call) not in self.stepped:
            self.stepped[id(call)] = call
            ctx.edits.replace(call, ctx.expr(f"SCALER.step({code(call.func.value)})"))
        stmt = a.statement(call)
        block = a.block(stmt)
        prev = self.update_after.get(id(block))
        if prev is None or list(block.body).index(stmt) > list(block.body).index(
            prev[1]
        ):
            self.update_after[id(block)] = (block, stmt)

    def _through_callers(
        self, call: cst.Call, unit, loss: str, opts: list[str]
    ) -> bool:
        """scale_loss in a helper (`def backward(loss, optimizer)`) whose callers step: each caller's
        step after the call, and autocast over the caller's forward pass and loss."""
        a = self.a
        fn = a.function_of(unit)
        if (
            fn is None
            or list(fn.body.body)[-1] is not unit
            and not _only_returns_after(fn, unit)
        ):
            return False
        params = [p.name.value for p in fn.params.params]
        found = False
        for c in a.callers(fn):
            stmt = a.statement(c)
            block = a.block(stmt)
            if (
                not isinstance(block, (cst.IndentedBlock, cst.Module))
                or stmt not in block.body
            ):
                continue
            names = {}
            for o in [*opts, loss]:
                if o in params:
                    arg = a.argument_for(c, fn, o)
                    if arg is not None:
                        names[o] = code(arg)
            if self._steps_after(block, stmt, opts, names):
                found = True
                lname = names.get(loss)
                body = list(block.body)
                before = body[: body.index(stmt)]
                loss_stmt = next(
                    (s for s in reversed(before) if lname and a._assigns(s, lname)),
                    None,
                )
                first = next((s for s in before if a.runs_model(s)), loss_stmt)
                self._autocast(block, first, loss_stmt, stmt)
        return found

    def _autocast(self, block, first, loss_stmt, unit) -> None:
        """The forward pass and loss, in the block before the backward, under autocast."""
        ctx = self.ctx
        body = list(block.body)
        if (
            loss_stmt is None
            or loss_stmt not in body
            or unit not in body
            or body.index(loss_stmt) > body.index(unit)
        ):
            return
        if (
            first is None
            or first not in body
            or body.index(first) > body.index(loss_stmt)
        ):
            first = loss_stmt
        if id(first) in self.autocast_done or any(
            f is first for f, _, _ in ctx.edits.wraps
        ):
            return
        self.autocast_done.add(id(first))
        ctx.edits.wraps.append((first, loss_stmt, ctx.expr(AUTOCAST)))
        ctx.finding(
            first,
            "DDP092",
            "forward pass and loss under torch.autocast (fp16 on GPUs where amp is on, as apex amp did)",
            True,
        )

    # -- the module-level settings ------------------------------------------------------
    def emit(self) -> None:
        ctx = self.ctx
        if not (self.used or self.helpers):
            return
        dtype = DTYPE.get(ctx.opts.amp, "torch.float16")
        what = self._what(self.level or "O1")
        if self.dynamic:
            text = DYNAMIC.format(what=what, dtype=dtype)
        else:
            level = self.level or "O1"
            on = (
                "None"
                if what == "full precision"
                else f"{dtype} if torch.cuda.is_available() else None"
            )
            said = {
                "full precision": "full precision"
                + (", as O0 was" if level == "O0" else " (--amp none)"),
                "bf16 autocast": "bf16 autocast on GPUs; full precision on CPU",
            }.get(
                what, "fp16 autocast with loss scaling on GPUs; full precision on CPU"
            )
            text = STATIC.format(level=level, what=said, dtype=on)
        for h in self.helpers:
            text += {
                "scaler_state": SCALER_STATE,
                "load_fused_adam_state": FUSED_ADAM_STATE,
            }[h]
        ctx.setup_extra.extend(module_block(text))


def _names_of(node: cst.BaseExpression) -> list[str]:
    if isinstance(node, (cst.Tuple, cst.List)):
        return [n for el in node.elements for n in _names_of(el.value)]
    return [dotted(node) or code(node)]


def _only_returns_after(fn: cst.FunctionDef, unit) -> bool:
    body = list(fn.body.body)
    return unit in body and all(
        isinstance(s, cst.SimpleStatementLine)
        and all(isinstance(x, cst.Return) for x in s.body)
        for s in body[body.index(unit) + 1 :]
    )


__all__ = ["AmpToTorch", "Step"]
