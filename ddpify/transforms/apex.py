"""The opt-in apex target (--amp apex): the classic recipe for teams pinned to apex <= 25.04.

amp.initialize(models, optimizers, opt_level=...) once the optimizers exist; the models are made
distributed in place by wrapping.py, and DDP starts at their first forward, after
amp.initialize, as the recipe asks; backward through amp.scale_loss; amp.state_dict() saved with
the optimizer's and restored after amp.initialize.
"""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import builds, call_args, code, dotted
from ddpify.transforms.amp_safety import unsafe_calls
from ddpify.transforms.base import Context, Transform
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP093",
    "apex-initialize-before-wrap",
    "amp.initialize before apex's DistributedDataParallel (--amp apex)",
    fix=True,
    check="params-in-sync",
)
declare(
    "DDP094",
    "apex-scale-loss",
    "backward through amp.scale_loss (--amp apex)",
    fix=True,
    check="loss",
)
declare(
    "DDP095",
    "apex-amp-state",
    "amp state saved with the checkpoint and restored after amp.initialize",
    fix=True,
    check="saved",
)

# The message names the version, the install line and the torch-native way out.
APEX_VERSION_MSG = (
    '        "this script needs NVIDIA apex <= 25.04: apex.amp and apex.parallel were removed after tag 25.04. "\n'
    '        "Install it with `git clone --branch 25.04 https://github.com/NVIDIA/apex && pip install --no-build-isolation ./apex`, "\n'
    '        "or convert the script again without --amp apex to use torch.amp"\n'
)


def free_name(ctx: Context, want: str, fallback: str) -> str:
    """`want` unless the script binds it to something else already."""
    bound = ctx._bound.get(want)
    return want if not bound else fallback


def guard_block(names: dict[str, str], sync_bn: bool) -> list[cst.BaseStatement]:
    """The import guard: fail at start-up, naming the apex version, when apex.amp is gone."""
    amp = "amp" if names["amp"] == "amp" else f"amp as {names['amp']}"
    imports = [
        f"    from apex import {amp}\n",
    ]
    if sync_bn:
        imports.append("    from apex.parallel import convert_syncbn_model\n")
    text = (
        "# ddpify: --amp apex needs NVIDIA apex <= 25.04; fail at start-up, not at the first amp call.\n"
        "try:\n" + "".join(imports) + "except ImportError as e:\n"
        "    raise SystemExit(\n" + APEX_VERSION_MSG + "    ) from e\n"
    )
    # a leading statement keeps the comment out of the module header
    return list(cst.parse_module("pass\n" + text).body)[1:]


class ApexTransform(Transform):
    name = "apex"

    def plan(self, ctx: Context) -> None:
        if ctx.opts.amp != "apex":
            return
        a = ctx.a
        from ddpify.transforms.legacy import kept_extensions

        kept_extensions(a, ctx)
        if a.apex_amp:
            self._own_amp(ctx)
            return
        entries = self._entries(ctx)
        if not entries:
            return  # wrapping already reported that no model was found
        if a.existing_amp:
            self._fallback(
                ctx,
                entries,
                "the script already uses torch AMP (autocast/GradScaler); apex amp would scale twice",
            )
            return
        place = self._placement(ctx, entries)
        if isinstance(place, str):
            self._fallback(ctx, entries, place)
            return
        point, optimizers = place
        names = {"amp": free_name(ctx, "amp", "apex_amp")}
        amp = names["amp"]
        steps = [s for s in a.steps if self._scalable(ctx, s)]
        models = [n for n, _, _ in entries]
        sync_bn = ctx.opts.sync_bn and self._sync_bn(ctx, entries, optimizers)
        ctx.preamble.extend(guard_block(names, sync_bn))
        # one amp.initialize for every model and optimizer: apex allows a single call
        if len(models) == 1 and len(optimizers) == 1:
            lhs, args = f"{models[0]}, {optimizers[0]}", f"{models[0]}, {optimizers[0]}"
        else:
            ms, os_ = ", ".join(models), ", ".join(optimizers)
            lhs = f"[{ms}], [{os_}]"
            args = f"[{ms}], [{os_}]"
        extra = f", num_losses={len(steps)}" if len(steps) > 1 else ""
        ctx.edits.after[point].append(
            ctx.stmt(
                f'{lhs} = {amp}.initialize({args}, opt_level="{ctx.opts.opt_level}"{extra})\n'
            )
        )
        first_bind = entries[0][1]
        ctx.finding(
            first_bind,
            "DDP093",
            f'amp.initialize({", ".join(models + optimizers)}, opt_level="{ctx.opts.opt_level}") once the optimizer exists; DDP starts at the first forward, after it',
            True,
        )
        for i, step in enumerate(steps):
            self._scale_loss(ctx, step, amp, i if len(steps) > 1 else None, optimizers)
        self._checkpoints(ctx, amp, point)
        if ctx.opts.opt_level == "O1":
            self._banned(ctx, steps)

    def _own_amp(self, ctx: Context) -> None:
        """A script that uses apex amp already keeps its amp.initialize and scale_loss as they are;
        the model is made distributed in place (wrapping.py), and DDP starts at its first forward,
        after amp.initialize; amp's state joins the checkpoint where amp.initialize always runs
        (amp.state_dict() fails before amp.initialize: a script that initialises amp behind a
        switch saves it itself, or not at all)."""
        a = ctx.a
        inits = [c for c in a.calls if a.is_call(c, "apex.amp.initialize")]
        if len(inits) != 1 or any(
            a.is_call(c, "apex.amp.state_dict", "apex.amp.load_state_dict")
            for c in a.calls
        ):
            return
        stmt = a.statement(inits[0])
        block = a.block(stmt)
        if isinstance(block, cst.Module) or isinstance(
            a.parent.get(block), cst.FunctionDef
        ):
            amp = (
                code(inits[0].func.value)
                if isinstance(inits[0].func, cst.Attribute)
                else "amp"
            )
            self._checkpoints(ctx, amp, stmt)

    @staticmethod
    def _banned(ctx: Context, steps) -> None:
        """O1 bans binary_cross_entropy on fp16 inputs (a sigmoid's output is fp16 there): the
        converted script would stop at its first step. Said, not changed: apex is kept as asked."""
        found = unsafe_calls(ctx, [s for step in steps for s in step.block.body])
        if found:
            call, what = found[0]
            ctx.finding(
                call,
                "DDP044",
                f"--amp apex O1 bans {what} on fp16 inputs (NotImplementedError at the first step): have the model "
                'return logits and use nn.BCEWithLogitsLoss, or call amp.register_float_function(torch, "sigmoid") before '
                "amp.initialize, or convert with --amp none",
                False,
            )

    # -- where amp.initialize goes ------------------------------------------------------
    def _placement(self, ctx: Context, entries):
        """(statement amp.initialize follows, optimizer names) or why it cannot be placed."""
        a = ctx.a
        blocks = {id(a.block(anchor)) for _, _, anchor in entries}
        if len(blocks) != 1:
            return "the models are created in different places; amp.initialize must see all of them at once"
        block = a.block(entries[0][2])
        body = list(block.body)
        opts: list[str] = []
        idx = [body.index(anchor) for _, _, anchor in entries]
        for name in a.optimizers:
            found = [i for i, s in enumerate(body) if a._assigns(s, name)]
            if found:
                opts.append(name)
                idx.append(found[0])
        if not opts:
            return (
                "no optimizer is created next to the model; amp.initialize needs both"
            )
        if len(opts) < len(a.optimizers):
            missing = ", ".join(n for n in a.optimizers if n not in opts)
            return f"optimizer {missing} is created elsewhere; amp.initialize must see every optimizer at once"
        start, point = min(body.index(anchor) for _, _, anchor in entries), max(idx)
        models = [n for n, _, _ in entries]
        for s in body[start + 1 : point + 1]:
            if isinstance(s, (cst.For, cst.While)) or self._runs(ctx, s, models):
                return "the model is used before its optimizer exists; call amp.initialize by hand"
        if not ctx.editable(body[point]):
            return "amp.initialize would follow a statement marked `# ddpify: skip`"
        return body[point], opts

    @staticmethod
    def _runs(ctx: Context, stmt: cst.CSTNode, models: list[str]) -> bool:
        for c in ctx.a.findall(stmt, m.Call()):
            if dotted(c.func) in models:
                return True
            fname = dotted(c.func)
            if (
                fname
                and fname.rsplit(".", 1)[-1] in ctx.a.functions
                and any(dotted(x.value) in models for x in c.args)
            ):
                return True
        return False

    @staticmethod
    def _entries(ctx: Context) -> list[tuple[str, cst.CSTNode, cst.BaseStatement]]:
        """(model as the wrap names it, its binding, the wrap's statement), once a model."""
        out = []
        for w in ctx.plans.wrap.wraps if ctx.plans.wrap is not None else ():
            if not any(w.model == n for n, _, _ in out):
                bind = builds.binding(ctx.a, w.model) or w.site
                out.append((w.module, bind, w.site))
        return out

    def _sync_bn(self, ctx: Context, entries, optimizers) -> bool:
        """apex's convert_syncbn_model builds new parameters: it goes with the wrap, before the
        optimizer takes the model's parameters."""
        for name, bind, site in entries:
            ctx.edits.before[site].insert(
                0, ctx.stmt(f"{name} = convert_syncbn_model({name})\n")
            )
            ctx.finding(
                bind,
                "DDP032",
                f"BatchNorm layers of `{name}` converted by apex.parallel.convert_syncbn_model (--sync-bn)",
                True,
            )
        return True

    def _fallback(self, ctx: Context, entries, why: str) -> None:
        """The apex recipe does not fit: the models stay as wrapping.py made them, without
        mixed precision."""
        if ctx.opts.sync_bn:
            torch = ctx.name("torch")
            for name, _, site in entries:
                ctx.edits.before[site].insert(
                    0,
                    ctx.stmt(
                        f"{name} = {torch}.nn.SyncBatchNorm.convert_sync_batchnorm({name}) "
                        f'if LOCAL_DEVICE.type == "cuda" else {name}\n'
                    ),
                )
        ctx.finding(
            entries[0][1],
            "DDP096",
            f"--amp apex not applied: {why}; made distributed in place without mixed precision",
            False,
        )

    # -- backward -----------------------------------------------------------------------
    def _scalable(self, ctx: Context, step) -> bool:
        stmt = step.stmt
        ok = (
            isinstance(stmt, cst.SimpleStatementLine)
            and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)
            and stmt.body[0].value is step.backward
        )
        if not ok and ctx.editable(step.stmt):
            ctx.finding(
                step.backward,
                "DDP096",
                "backward() is not a statement of its own: write `with amp.scale_loss(loss, optimizer) as scaled_loss: scaled_loss.backward()` by hand",
                False,
            )
        return ok and ctx.editable(stmt)

    def _scale_loss(
        self, ctx: Context, step, amp: str, loss_id: int | None, optimizers: list[str]
    ) -> None:
        opts: list[str] = []
        # steps after the next backward of the block belong to that loss (GAN-style)
        body = list(step.block.body)
        later = [
            body.index(s.stmt)
            for s in ctx.a.steps
            if s.block is step.block and body.index(s.stmt) > body.index(step.stmt)
        ]
        end = min(later) if later else len(body)
        for c in step.step_calls:
            if (
                body.index(
                    ctx.a.statement(c) if ctx.a.statement(c) in body else step.stmt
                )
                >= end
            ):
                continue
            o = code(c.func.value)
            if o not in opts:
                opts.append(o)
        if not opts:
            opts = optimizers
        opt = opts[0] if len(opts) == 1 else f"[{', '.join(opts)}]"
        lid = f", loss_id={loss_id}" if loss_id is not None else ""

        def fn(node: cst.SimpleStatementLine) -> cst.BaseStatement:
            call = node.body[0].value
            loss = code(call.func.value)
            inner = node.with_changes(
                body=[
                    node.body[0].with_changes(
                        value=call.with_changes(
                            func=call.func.with_changes(value=cst.Name("scaled_loss"))
                        )
                    )
                ],
                leading_lines=(),
            )
            header = ctx.expr(f"{amp}.scale_loss({loss}, {opt}{lid})")
            return cst.With(
                items=[
                    cst.WithItem(header, asname=cst.AsName(cst.Name("scaled_loss")))
                ],
                body=cst.IndentedBlock(body=[inner]),
                leading_lines=node.leading_lines,
            )

        ctx.edits.replace(step.stmt, fn)
        ctx.finding(
            step.backward,
            "DDP094",
            f"backward through amp.scale_loss(loss, {opt}{lid}): apex scales the loss",
            True,
        )

    # -- checkpoints --------------------------------------------------------------------
    def _checkpoints(self, ctx: Context, amp: str, point: cst.BaseStatement) -> None:
        a = ctx.a
        for d in a.findall(a.module, m.Dict()):
            if not ctx.editable(d) or not d.elements:
                continue
            keys = [
                e.key.evaluated_value
                for e in d.elements
                if isinstance(e, cst.DictElement)
                and isinstance(e.key, cst.SimpleString)
            ]
            if "amp" in keys:
                continue
            if not any(
                isinstance(e, cst.DictElement) and self._optimizer_state(ctx, e.value)
                for e in d.elements
            ):
                continue
            ctx.edits.replace(
                d,
                lambda n: _append_element(
                    n,
                    cst.DictElement(
                        cst.SimpleString('"amp"'), ctx.expr(f"{amp}.state_dict()")
                    ),
                ),
            )
            ctx.finding(
                d,
                "DDP095",
                "amp.state_dict() saved beside the optimizer's state (loss scale)",
                True,
            )
        init_fn, init_line = a.function_of(point), a.pos[point].end.line
        for call in a.calls:
            if not (
                isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "load_state_dict"
                and a.is_optimizer_ref(call.func.value)
            ):
                continue
            pos, _ = call_args(call)
            if (
                not pos
                or not isinstance(pos[0].value, cst.Subscript)
                or dotted(pos[0].value.value) is None
            ):
                continue
            stmt = a.statement(call)
            if not ctx.editable(stmt) or not isinstance(
                a.block(stmt), (cst.IndentedBlock, cst.Module)
            ):
                continue
            if a.function_of(stmt) is init_fn and a.pos[stmt].start.line <= init_line:
                ctx.finding(
                    call,
                    "DDP096",
                    "optimizer state restored before amp.initialize: restore model, optimizer and amp state after it",
                    False,
                )
                continue
            ck = dotted(pos[0].value.value)
            ctx.edits.after[stmt].append(
                ctx.stmt(f'if "amp" in {ck}:\n    {amp}.load_state_dict({ck}["amp"])\n')
            )
            ctx.finding(
                call,
                "DDP095",
                "amp.load_state_dict() restores the loss scale after amp.initialize",
                True,
            )

    @staticmethod
    def _optimizer_state(ctx: Context, value: cst.BaseExpression) -> bool:
        return (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value == "state_dict"
            and ctx.a.is_optimizer_ref(value.func.value)
        )


def _append_element(d: cst.Dict, new: cst.DictElement) -> cst.Dict:
    """Add `new` last, keeping the dict's one-line or one-entry-per-line layout."""
    els = list(d.elements)
    last = els[-1]
    sep = (
        els[-2].comma
        if len(els) > 1 and isinstance(els[-2].comma, cst.Comma)
        else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    )
    els[-1] = last.with_changes(comma=sep)
    els.append(new.with_changes(comma=last.comma))
    return d.with_changes(elements=els)
