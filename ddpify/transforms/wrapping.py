"""Model wrapping: DistributedDataParallel after the model reaches its device; DataParallel
replaced, not wrapped; SyncBatchNorm where asked."""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import (
    devices,
    forwards,
    gradients,
    lifecycle,
    loss_flow,
    model_code,
    model_uses,
    routes,
)
from ddpify.analysis import call_args, code, dotted
from ddpify.analysis.tree import _inside
from ddpify.transforms.base import Context, Transform
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP030",
    "ddp-wrap",
    "model wrapped in DistributedDataParallel",
    fix=True,
    check="params-in-sync",
)
declare(
    "DDP031",
    "dataparallel-replaced",
    "nn.DataParallel replaced by DistributedDataParallel",
    fix=True,
    check="params-in-sync",
)
declare(
    "DDP032",
    "sync-batchnorm",
    "BatchNorm converted to SyncBatchNorm",
    fix=True,
    check="params-in-sync",
)
declare(
    "DDP034",
    "model-not-found",
    "no model found: wrap it in DistributedDataParallel by hand",
    severity="blocking",
)
declare(
    "DDP035",
    "model-on-cpu",
    "model never moved to a device: it stays on the CPU",
    severity="blocking",
)
declare(
    "DDP036",
    "model-changed-after-wrap",
    "model changed where DDP cannot follow (in training, or later): not wrapped",
    severity="blocking",
)
declare(
    "DDP037",
    "unused-parameters",
    "parameters that may get no gradient: find_unused_parameters=True",
    fix=True,
    check="ranks",
)
declare(
    "DDP038",
    "model-in-container",
    "model run through a list or dict that holds it: not wrapped",
    severity="blocking",
)
declare(
    "DDP039",
    "model-frozen",
    "model with every parameter frozen: not wrapped",
    fix=True,
    check="ranks",
)
declare(
    "DDP138",
    "params-outside-forward",
    "parameters read outside forward reach the loss while find_unused_parameters=True is needed: not wrapped",
    severity="blocking",
)
declare(
    "DDP139",
    "forward-not-routable",
    "a training forward that cannot run through the DDP wrapper: not wrapped",
    severity="blocking",
)
declare(
    "DDP136",
    "broadcast-buffers-off",
    "model run more than once before one backward: DDP broadcast_buffers=False (each rank keeps its own BatchNorm statistics)",
    fix=True,
    check="ranks",
)

PLACEMENT_METHODS = ("to", "cuda", "half", "float", "bfloat16", "double", "to_empty")

# Holds the DDP wrapper of a part beside an nn.Module that owns that part: pickling or copying
# the module (torch.save(gan), deepcopy) leaves the wrapper out, whose unpickling would need a
# process group; calls and attributes go to the wrapper.
NOT_PICKLED = '''\


class NotPickled:
    """The DDP wrapper kept beside a module (not a submodule, not pickled with it)."""

    def __init__(self, wrapper):
        self.wrapper = wrapper

    def __call__(self, *args, **kwargs):
        return self.wrapper(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.__dict__["wrapper"], name)

    def __reduce__(self):
        return type(None), ()
'''

# Runs a model's method (or a submodule) as the forward of a module DDP wraps: DDP synchronises
# gradients only through its own forward, so model.loss(x) trains as ddp_model(x, method="loss").
FORWARD_TO = '''\


class ForwardTo({torch}.nn.Module):
    """A model whose training loss comes from a method: ddp_model(x, method="loss")
    runs model.loss(x) as DDP's forward (DDP synchronises gradients only through its
    forward)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args, method="__call__", **kwargs):
        run = self.model
        for part in method.split("."):  # "encoder": a submodule's forward
            run = getattr(run, part)
        return run(*args, **kwargs)
'''


class WrappingTransform(Transform):
    name = "wrapping"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        dp_stmts = self._replace_dataparallel(ctx)
        held = model_uses.container_models(a)
        for call, what in held:
            ctx.finding(
                call,
                "DDP034",
                f"the model `{what}` is held in a dict or list: wrap each trained one by hand after its last change, under a name of its own (ddp_net = DDP({what}), no device_ids: it follows the model's device), and run its training forward through that",
                False,
            )
        if not a.models:
            if a.steps and not held:
                why = (
                    self._trains_itself(ctx)
                    or "no model found (no optimizer over model.parameters()): wrap it by hand after its last change, ddp_model = DDP(model) (no device_ids: it follows the model's device), and run its training forward through ddp_model"
                )
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
                    return (
                        f"class `{cls.name.value}` builds its own optimizer over self.parameters() (line {a.pos[call].start.line}) "
                        f"and updates itself in its method `{fn.name.value}`: no forward of the model runs outside it, so a DDP wrap "
                        "would sync nothing; by hand, give each rank its share of the data and average the gradients before "
                        "each step (for p in self.parameters(): dist.all_reduce(p.grad); p.grad /= WORLD_SIZE)"
                    )
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
            if (
                isinstance(par, cst.Assign)
                and len(par.targets) == 1
                and dotted(par.targets[0].target) == dotted(inner)
                and isinstance(stmt, cst.SimpleStatementLine)
                and len(stmt.body) == 1
            ):
                ctx.edits.removed.add(stmt)
            else:
                ctx.edits.replace(call, lambda node: node.args[0].value)
            ctx.finding(
                call,
                "DDP031",
                "nn.DataParallel replaced by DistributedDataParallel (one process per GPU)",
                True,
            )
            self._dataparallel_module(ctx, dotted(inner), call)
        for call in a.functional_dp_calls:
            if not ctx.editable(call):
                continue
            pos, _ = call_args(call)
            if len(pos) < 2:
                continue

            def fn(node):
                return cst.Call(
                    func=node.args[0].value,
                    args=[node.args[1].with_changes(comma=cst.MaybeSentinel.DEFAULT)],
                )

            ctx.edits.replace(call, fn)
            ctx.finding(
                call,
                "DDP031",
                "nn.parallel.data_parallel(model, x) becomes model(x); DDP does the parallelism",
                True,
            )
        return stmts

    @staticmethod
    def _dataparallel_module(ctx: Context, name: str | None, call: cst.Call) -> None:
        """`model.module` written for DataParallel names the model itself once DataParallel is
        gone (the model keeps its name; the DDP wrapper has its own)."""
        a = ctx.a
        if name is None:
            return
        fn = a.function_of(call)
        for attr in a.attributes:
            if (
                attr.attr.value != "module"
                or dotted(attr.value) != name
                or not ctx.editable(attr)
            ):
                continue
            if a.pos[attr].start.line <= a.pos[call].start.line or (
                a.function_of(attr) is not fn
                and "." not in name
                and a.function_of(attr) is not None
                and a._is_local(a.function_of(attr), name)
            ):
                continue
            done = ctx.__dict__.setdefault("_dp_module_attrs", set())
            if id(attr) in done:
                continue  # several DataParallel(...) calls of one model: one edit per attribute
            done.add(id(attr))
            ctx.edits.replace(attr, lambda n: n.value)
            ctx.finding(
                attr,
                "DDP031",
                f"{name}.module was DataParallel's: without DataParallel it is {name} itself",
                True,
            )

    def _binding(self, ctx: Context, name: str) -> cst.BaseStatement | cst.Param | None:
        """Where the model is bound for the wrap: its assignment in the function that builds its
        optimizer; the parameter of that function when the model is handed in (`def
        train(model, ...): opt = SGD(model.parameters())`: wrapped there, where it trains);
        else its first assignment in a block."""
        a = ctx.a
        opt_fns = {a.function_of(c) for c in a.optimizers_of(name).values()}
        cands = []
        for asg in a.assigns:
            targets = (
                [t.target for t in asg.targets]
                if isinstance(asg, cst.Assign)
                else [asg.target]
            )
            from ddpify.analysis import _flatten_targets

            if any(dotted(el) == name for t in targets for el in _flatten_targets(t)):
                stmt = self._lift(ctx, a.statement(asg), name)
                if (
                    isinstance(a.block(stmt), (cst.IndentedBlock, cst.Module))
                    and stmt not in cands
                ):
                    cands.append(stmt)
        # a factory that builds the model and returns it (model, opt, sched = build(cfg)): the
        # model trains where it is returned to, so it is wrapped there
        factories = {
            id(fn)
            for fn in opt_fns
            if fn is not None
            and _returns(a, fn, name)
            and not any(a.function_of(st.stmt) is fn for st in a.steps)
        }
        kept = [s for s in cands if id(a.function_of(s)) not in factories]
        cands = kept or cands
        same = [
            s
            for s in cands
            if a.function_of(s) in opt_fns and id(a.function_of(s)) not in factories
        ]
        if same:
            return same[0]
        for fn in opt_fns:
            if id(fn) in factories:
                continue
            param = next(
                (
                    p
                    for p in (fn.params.params if fn is not None else ())
                    if p.name.value == name
                ),
                None,
            )
            if param is not None and "." not in name:
                return param
        return cands[0] if cands else None

    def _lift(
        self, ctx: Context, stmt: cst.BaseStatement, name: str
    ) -> cst.BaseStatement:
        """A model built in `if/else` (or try, with) branches is wrapped once, after the
        whole statement, unless the branch goes on to train it."""
        a = ctx.a
        while True:
            block = a.block(stmt)
            if not isinstance(block, cst.IndentedBlock):
                return stmt
            rest = list(block.body)[list(block.body).index(stmt) + 1 :]
            if any(
                isinstance(s, (cst.For, cst.While))
                or ctx.a.findall(s, m.For() | m.While())
                or self._uses_model(ctx, s, name)
                for s in rest
            ):
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
        training = {
            id(c): c
            for c in (a.class_of(st.stmt) for st in a.steps)
            if c is not None and c is not mine
        }
        out = []
        for cls in training.values():
            binds = any(
                isinstance(t.target, cst.Attribute) and dotted(t.target) == name
                for asg in a.findall(cls, m.Assign())
                for t in asg.targets
            )
            if binds:
                out.append(cls.name.value)
        return sorted(out)

    def _wrap(
        self, ctx: Context, name: str, dp_stmts: set[cst.BaseStatement], bind=None
    ) -> None:
        a = ctx.a
        bind = bind or self._binding(ctx, name)
        if bind is None:
            ctx.finding(
                None,
                "DDP034",
                f"could not find where `{name}` is created: wrap it by hand after its last change, ddp_{name.rsplit('.', 1)[-1]} = DDP({name}), and run its training forward through that",
                False,
            )
            return
        r = routes.route(a, name, bind)
        anchor, first_need = self._anchor(ctx, name, bind, r, dp_stmts)
        place = (
            anchor if anchor is not None else first_need
        )  # the wrap goes after anchor, else before the first need
        if place is None:
            ctx.finding(
                None,
                "DDP139",
                f"no statement of `{a.function_of(bind).name.value}()` that trains `{name}` was found to wrap it before: not wrapped; wrap it by hand, ddp_{name} = DDP({name}), and run its training forward through that",
                False,
            )
            return
        if a.function_of(place) is None and (a.region_of(place) != 0 or ctx.console()):
            # a model built at import time of a module (or of one a console script starts from):
            # the group is set up later, in the entry or in the function that trains it
            moved = self._into_trainer(ctx, name, r)
            if moved is not None:
                anchor, place = None, moved
                ctx.relocated.add(name)
        if not ctx.editable(place):
            ctx.skipped_here(
                place,
                f"`{name}` not wrapped in DistributedDataParallel: the ranks would train unsynchronised copies",
                blocking=True,
            )
            return
        body = list(a.block(place).body)
        start = body.index(bind) if bind in body else 0
        frozen = gradients.fully_frozen(
            a, name, body[start : body.index(anchor) + 1] if anchor is not None else []
        )
        if frozen is not None:
            ctx.finding(
                frozen,
                "DDP039",
                f"every parameter of `{name}` is frozen here, and DDP refuses a module with nothing to train: not wrapped (its weights must be the same on every rank: loaded, or built after the same seed)",
                True,
            )
            return
        held = model_uses.forward_through_container(a, name)
        if held is not None:
            ctx.finding(
                held[0],
                "DDP038",
                f"`{held[1]}` holds `{name}` itself and runs it: forwards through `{held[1]}` would bypass a DDP wrapper (no gradient sync): not wrapped; wrap it by hand, ddp_{name.rsplit('.', 1)[-1]} = DDP({name}), and run the training forwards through ddp_{name.rsplit('.', 1)[-1]} instead of `{held[1]}`",
                False,
            )
            return
        part = next(
            (
                c
                for c in a.calls
                if isinstance(c.func, cst.Subscript) and dotted(c.func.value) == name
            ),
            None,
        )
        if part is not None:
            # model[0](x) runs a layer of the model itself: no DDP forward, and a wrapper has no [ ]
            ctx.finding(
                part,
                "DDP038",
                f"`{code(part.func)}` runs a part of `{name}` directly: a DDP wrapper has no `[ ]`, and a forward that bypasses it syncs no gradients: not wrapped; run the whole model (or give it a forward that does this) and wrap it by hand, ddp_{name.rsplit('.', 1)[-1]} = DDP({name})",
                False,
            )
            return
        late = lifecycle.late_changes(a, name, place, before=anchor is None)
        inner = (
            self._descend(ctx, r, late)
            if late or self._holder_needs_module(ctx, r)
            else None
        )
        if inner is not None:
            # the function that trains it changes it first (moves it to the device): the wrap
            # goes there, after that change, and the caller hands it the plain model
            self._wrap(ctx, inner.name.value, dp_stmts, bind=inner)
            return
        if late:
            for node, kind in late:
                ctx.finding(
                    node,
                    "DDP036",
                    f"`{name}` is changed here ({lifecycle.WHAT[kind]}) after the point where it must be wrapped (before its first training forward), and DDP cannot follow that change once it holds the model (it fixed the parameters, their device and which need gradients when it was built): not wrapped; make the change before training starts, or build the wrapper again after it (ddp_{name.rsplit('.', 1)[-1]} = DDP({name}), no device_ids: it follows the model's device)",
                    False,
                )
            return
        others = self._other_trainers(a, name, bind)
        if others:
            ctx.finding(
                bind,
                "DDP034",
                f"`{name}` is a model trained in several classes ({', '.join(others)} besides "
                f"{a.class_of(bind).name.value}), and which one trains is decided at run time: ddpify wraps one model in one place, "
                f"so the others would train unsynchronised; wrap it by hand in each class, self.ddp_{name.rsplit('.', 1)[-1]} = DDP({name}), and run its training forward through that",
                False,
            )
            return
        if not self._routable(ctx, name, r, place):
            return
        methods = sorted({f.method.split(".")[0] for f in r.forwards() if f.method})
        plain = any(f.method is None for f in r.forwards())
        build = _build(a, name, bind)
        outside = self._outside_reads(ctx, name, r)
        # a parameter read outside forward on the way to the loss gets its gradient there
        used = {
            "self." + (dotted(node) or "")[len(dotted(ref) or "") + 1 :].split(".")[0]
            for node, ref, _ in outside
        }
        entries = (["forward"] if plain or not methods else []) + methods
        unused = gradients.unused_parameters(a, build, entries, used)
        if not unused and len(entries) > 1:
            # each kind of training forward has its own backward (TD3's critic: forward() for
            # its loss, Q1() in the actor's): parameters one of them never reaches get no
            # gradient in that backward
            for e in entries:
                per = gradients.unused_parameters(a, build, [e], used)
                if per:
                    unused = [
                        per[0].replace(" in forward", f" in .{e}()")
                        + ", which runs in a backward of its own"
                    ]
                    break
        dropped = gradients.discarded_outputs(a, name)
        if dropped:
            unused.append(
                f"outputs of {name}(...) are discarded at line {a.pos[dropped[0]].start.line} (the parameters behind them may get no gradient from that loss)"
            )
        if unused and outside:
            node, _, what = outside[0]
            ctx.finding(
                node,
                "DDP138",
                f'`{what}` is read outside the forward of `{name}` and its value reaches the loss, while some parameters may get no gradient ({unused[0]}): with find_unused_parameters=True, DDP marks parameters its forward did not use as ready at the forward, and their gradient then arrives a second time at backward ("Expected to mark a variable ready only once"): not wrapped; move the computation that reads `{what}` into the model\'s forward (return it with the output), or make every parameter get a gradient',
                False,
            )
            return
        wrapper = self._wrapper_name(ctx, name, bind)
        ctx.wrapped[name] = place
        if anchor is None:
            ctx.wrap_before.add(name)
        ctx.wrappers[name] = wrapper
        ctx.routes[name] = r
        if (
            ctx.opts.amp == "apex" and not a.apex_amp
        ):  # apex.py places amp.initialize and apex's DDP
            ctx.apex_models.append((name, bind, place))
            return
        ddp = ctx.name("DDP")
        at = ctx.edits.after[anchor] if anchor is not None else ctx.edits.before[place]
        bn = (
            model_code.has_batchnorm(model_code.model_code(a, build, ctx.path))
            if ctx.opts.sync_bn
            else None
        )
        if ctx.opts.sync_bn and bn is False:
            ctx.finding(
                bind,
                "DDP032",
                f"--sync-bn: `{name}` has no BatchNorm layers (its code is read), so nothing is converted",
                False,
            )
        elif ctx.opts.sync_bn:
            # SyncBatchNorm runs on GPUs only: a model the script keeps on the CPU keeps BatchNorm
            at.append(
                ctx.stmt(
                    f"{name} = {ctx.name('torch')}.nn.SyncBatchNorm.convert_sync_batchnorm({name}) if next({name}.parameters()).is_cuda else {name}\n"
                )
            )
            maybe = (
                "" if bn else ", if it has any (ddpify cannot read all of its code),"
            )
            ctx.finding(
                bind,
                "DDP032",
                f"BatchNorm layers of `{name}`{maybe} converted to SyncBatchNorm (--sync-bn)",
                True,
            )
        extra = ", find_unused_parameters=True" if unused else ""
        repeat = forwards.repeated_forward(a, name, methods)
        if repeat is not None and forwards.may_hold_buffers(a, build, ctx.path):
            extra += ", broadcast_buffers=False"
            self._repeat_finding(ctx, name, *repeat)
        inner = name
        if methods:
            inner = f"{self._adapter(ctx)}({name})"
        # no device_ids: DDP works on the device the model is on, this rank's GPU or the CPU
        # where the script keeps it (a --cuda flag left off); device_ids=[LOCAL_RANK] would
        # refuse a CPU module, and would also move every input (CPU lengths included) to the GPU
        stmt = f"{wrapper} = {ddp}({inner}{extra})\n"
        if wrapper.startswith("self.") and self._module_class(a, a.class_of(bind)):
            # the holder is an nn.Module itself: the wrapper must not become its submodule (its
            # state dict would gain the wrapper's keys)
            held = self._not_pickled(ctx)
            stmt = f'# ddpify: not a submodule: state dict and pickle stay as they were\nobject.__setattr__(self, "{wrapper[5:]}", {held}({ddp}({inner}{extra})))\n'
        at.append(ctx.stmt(stmt))
        if unused:
            ctx.finding(
                bind,
                "DDP037",
                f'`{name}`: {"; ".join(unused)}: DDP would wait for their gradients ("Expected to have finished reduction" at step 2), so find_unused_parameters=True (slower; drop what is never used to avoid it)',
                True,
            )
        uses = f"; training forwards run through `{wrapper}`, every other use keeps the plain `{name}`"
        if methods:
            uses += f" (`{inner}` runs {', '.join(f'.{x}()' for x in methods)} as DDP's forward: DDP synchronises gradients only through its forward)"
        why = (
            lifecycle.last_change(a, anchor, name)
            if anchor is not bind and anchor is not None
            else None
        )
        if why:
            ctx.finding(
                bind,
                "DDP030",
                f"`{name}` wrapped in DistributedDataParallel as `{wrapper}` after line {a.pos[anchor].start.line}, the last statement that changes it before training ({why}){uses}",
                True,
            )
        else:
            where = (
                "where it is built (a CPU program: no device_ids)"
                if ctx.cpu_only
                else "after it reaches its device (no device_ids: DDP follows the model's own device, this rank's GPU or the CPU where the script keeps it)"
            )
            if name in ctx.relocated:
                where = f"in `{a.function_of(place).name.value}()`, before it trains (the model is built when its module is imported, before the process group exists)"
            ctx.finding(
                bind,
                "DDP030",
                f"`{name}` wrapped in DistributedDataParallel as `{wrapper}` {where}{uses}",
                True,
            )
        # only where something else is placed: a script that places nothing trains on the CPU
        # wherever it runs, its model and batches alike (a GradScaler or autocast enabled by
        # torch.cuda.is_available() names a device without placing anything)
        if (
            not ctx.cpu_only
            and devices.places_anything(a)
            and not self._ever_placed(ctx, name, bind)
        ):
            ctx.finding(
                bind,
                "DDP035",
                f"`{name}` is never moved to a device, but the script places other things on one: on GPUs it would stay on the CPU while its inputs go to the GPU (the script fails there already); move it with .to(LOCAL_DEVICE) where it is built (or keep the whole script on the CPU: remove its device handling)",
                False,
            )

    @staticmethod
    def _into_trainer(ctx: Context, name: str, r) -> cst.BaseStatement | None:
        """The first statement of the one module-level function that runs every training forward
        of a model built at module level (wrapped there, once the group exists), or None."""
        a = ctx.a
        fns = {id(f): f for f in (a.function_of(tf.call) for tf, _, _ in r.direct)}
        fns.update({id(f): f for f in (a.function_of(c) for c, _, _ in r.handed)})
        if len(fns) != 1 or "." in name:
            return None
        fn = next(iter(fns.values()))
        if (
            fn is None
            or a.function_of(fn) is not None
            or a.class_of(fn) is not None
            or a._is_local(fn, name)
        ):
            return None
        body = list(fn.body.body) if isinstance(fn.body, cst.IndentedBlock) else []
        sites = r.sites()
        return next(
            (s for s in body if any(n is s or _inside(a, n, s) for n in sites)), None
        )

    @staticmethod
    def _holder_needs_module(ctx: Context, r) -> bool:
        """A function handed the wrapper would need the plain module back (`model.state_dict()`,
        an evaluation, a save inside train(model))."""
        return any(routes.module_uses(ctx.a, r, fn, p) for fn, p in r.holders)

    @staticmethod
    def _descend(ctx: Context, r, late) -> cst.Param | None:
        """The parameter to wrap instead: the one function that runs all the training forwards
        (`train(model)`) makes every change the wrap cannot follow (it moves the model, then
        trains it), or uses the model for more than training (saves it, evaluates it): wrapped
        there, after the change, so every other use keeps the plain model. Not where that
        function is called in loops within loops (once per batch: a DDP built per call), nor in
        one loop only to keep the module inside (a DDP built per epoch: handed the wrapper, the
        function reads `model.module` instead)."""
        a = ctx.a
        if r.direct or len(r.holders) != 1:
            return None
        fn, param = r.holders[0]
        if any(
            (dotted(c.func) or "").rsplit(".", 1)[-1] != fn.name.value
            for c, _, _ in r.handed
        ):
            return None
        for c, _, _ in r.handed:
            loops, cur = 0, a.enclosing_loop(a.statement(c))
            while cur is not None:
                loops, cur = loops + 1, a.enclosing_loop(cur)
            if (
                loops > 1
                or (loops == 1 and not late)
                or (a.function_of(c) is not None and a.function_of(c) is fn)
            ):
                return None
        for node, _ in late:
            inside = a.function_of(node) is fn
            if not inside and not (
                isinstance(node, cst.Call) and any(node is c for c, _, _ in r.handed)
            ):
                return None
        return next((p for p in fn.params.params if p.name.value == param), None)

    # -- where the wrap goes -------------------------------------------------------------------
    def _anchor(
        self, ctx: Context, name: str, bind, r, dp_stmts: set[cst.BaseStatement]
    ) -> tuple[cst.BaseStatement | None, cst.BaseStatement | None]:
        """(the statement the wrap follows, or None; the first statement that needs it). After
        the last change to the model (placement, init, weights, freezing, compile, SyncBatchNorm),
        before the first statement that needs the wrapper: one that holds a training forward or
        hands the wrapper on, or calls code that does. Uses that are no training forward (a
        summary, an EMA copy, evaluation) keep the plain model: the wrap does not have to come
        before them. A model bound as a parameter may need it at the function's first statement:
        (None, that statement)."""
        a = ctx.a
        if isinstance(bind, cst.Param):
            body, anchor = list(a.function_of(bind).body.body), None
            rest = body[1:] if body and _is_docstring(body[0]) else body
        else:
            body, anchor = list(a.block(bind).body), bind
            rest = body[body.index(bind) + 1 :]
        needs = self._needs(a, r)
        prev = None
        for s in rest:
            if needs:
                if any(n is s or _inside(a, n, s) for n in needs):
                    return anchor or prev, s
            elif (
                lifecycle.trains(a, s)
                or lifecycle.statement_effect(a, s, name) == "use"
            ):
                return (
                    anchor or prev,
                    s,
                )  # no training forward found: before the model first runs
            if (
                lifecycle.changes(a, s, name)
                or s in dp_stmts
                or any(x in dp_stmts for x in a.findall(s, m.SimpleStatementLine()))
            ):
                anchor = s
            prev = s
        return anchor, None

    @staticmethod
    def _needs(a, r) -> list[cst.CSTNode]:
        """The nodes that need the wrapper (its training forwards and hand-overs), and the calls
        that lead to them."""
        nodes: list[cst.CSTNode] = list(r.sites())
        work = [fn for n in nodes if (fn := a.function_of(n)) is not None]
        seen: set[int] = set()
        while work:
            fn = work.pop()
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            for c in a.callers(fn):
                nodes.append(c)
                if (g := a.function_of(c)) is not None:
                    work.append(g)
        return nodes

    # -- the wrapper -----------------------------------------------------------------------------
    @staticmethod
    def _wrapper_name(ctx: Context, name: str, bind: cst.CSTNode) -> str:
        """ddp_<name> (self.ddp_<attr> for an attribute), unless the script uses that name."""
        a = ctx.a
        head, _, last = name.rpartition(".")
        taken = {n for names in a.bindings.values() for n in names} | {
            x.attr.value for x in a.attributes
        }
        taken |= {w.rpartition(".")[2] for w in ctx.wrappers.values()}
        base = f"ddp_{last}"
        cand, k = base, 1
        while cand in taken:
            cand, k = f"{base}_{k}", k + 1
        return f"{head}.{cand}" if head else cand

    @staticmethod
    def _module_class(a, cls: cst.ClassDef | None) -> bool:
        """cls derives from nn.Module (or another *Module class)."""
        if cls is None:
            return False
        for base in cls.bases:
            d = dotted(base.value) or ""
            if d.endswith("Module") or any(
                q.startswith("torch.nn.") for q in a.qualified(base.value)
            ):
                return True
            inner = a.classes.get(d.rsplit(".", 1)[-1])
            if (
                inner is not None
                and inner is not cls
                and WrappingTransform._module_class(a, inner)
            ):
                return True
        return False

    @staticmethod
    def _stepped(a, name: str) -> bool:
        """An optimizer over the model's parameters is stepped (opt.step(), scaler.step(opt))."""
        opts = set(a.optimizers_of(name))
        for c in a.calls:
            if isinstance(c.func, cst.Attribute) and c.func.attr.value == "step":
                if dotted(c.func.value) in opts or any(
                    dotted(x.value) in opts for x in c.args
                ):
                    return True
        return False

    @staticmethod
    def _not_pickled(ctx: Context) -> str:
        """The generated holder that keeps a wrapper out of its module's pickle (once per file)."""
        taken = {n for names in ctx.a.bindings.values() for n in names}
        name = "NotPickled" if "NotPickled" not in taken else "DDPNotPickled"
        if not any(f"class {name}:" in t for t in ctx.helper_texts):
            ctx.helper_texts.append(NOT_PICKLED.replace("NotPickled", name))
        return name

    @staticmethod
    def _adapter(ctx: Context) -> str:
        """The generated module that runs any method of a model as its forward (once per file)."""
        a = ctx.a
        taken = {n for names in a.bindings.values() for n in names}
        name = "ForwardTo" if "ForwardTo" not in taken else "DDPForwardTo"
        if not any(name in t for t in ctx.helper_texts):
            ctx.helper_texts.append(FORWARD_TO.replace("ForwardTo", name))
        return name

    def _routable(self, ctx: Context, name: str, r, place: cst.CSTNode) -> bool:
        """Every training forward of the model can name the wrapper where it runs; else say which
        cannot and why (nothing is wrapped: the ranks would train unsynchronised copies)."""
        a = ctx.a
        bad = list(r.unresolved)
        for tf, node, _ in r.direct:
            if not ctx.editable(tf.call):
                bad.append((tf, "it is in code marked `# ddpify: skip`/`off`"))
            elif model_uses.rebound_unwrapped(a, name, place, tf.call):
                bad.append(
                    (
                        tf,
                        f"`{name}` is bound to another model between the wrap and this call, and one wrapper holds one model",
                    )
                )
        for c, arg, _ in r.handed:
            if not ctx.editable(c):
                bad.append(
                    (
                        None,
                        f"the call `{code(c.func)}(...)` that hands `{name}` to the function running it is marked `# ddpify: skip`/`off`",
                    )
                )
        lf = loss_flow.loss_flow(a)
        for call, ref in lf.foreign:
            if (
                dotted(ref) == name
                or routes.reaches(a, r, a.statement(call), ref) is not None
            ):
                if not any(
                    a.statement(tf.call) is a.statement(call) for tf in r.forwards()
                ):
                    fname = code(call.func)
                    ctx.finding(
                        call,
                        "DDP139",
                        f"`{name}` is handed to `{fname}`, outside this program, and what it returns reaches the loss: its forward runs in code ddpify does not change, so it cannot run through the DDP wrapper (DDP synchronises gradients only through its own forward): not wrapped; restructure so that the script calls the model itself (what `{fname}` does around the call can move into the model's forward), then wrap it by hand, ddp_{name.rsplit('.', 1)[-1]} = DDP({name}), and call ddp_{name.rsplit('.', 1)[-1]}(...)",
                        False,
                    )
                    return False
        for tf, why in bad:
            node = tf.call if tf is not None else None
            ctx.finding(
                node,
                "DDP139",
                f"a training forward of `{name}` cannot run through the DDP wrapper: {why}; the ranks would train unsynchronised copies: not wrapped; run that forward through a wrapper by hand, ddp_{name.rsplit('.', 1)[-1]} = DDP({name})",
                False,
            )
        if bad:
            return False
        if not r.direct and not r.handed and self._stepped(a, name):
            # its optimizer steps, so its parameters change: the forward is where ddpify cannot see
            ctx.finding(
                bind_or_none(a, name),
                "DDP139",
                f"`{name}`'s optimizer steps, but ddpify found no call of `{name}` whose output reaches a backward(): its training forward runs where ddpify cannot follow it, and unwrapped the ranks would train unsynchronised copies: not wrapped; call the model in the training step itself (its output assigned, then the loss), or wrap it by hand, ddp_{name.rsplit('.', 1)[-1]} = DDP({name}), and run its training forward through that",
                False,
            )
            return False
        if not r.direct and not r.handed:
            # an optimizer over it, but no forward of it reaches a backward: nothing to synchronise
            ctx.finding(
                bind_or_none(a, name),
                "DDP030",
                f"`{name}` has an optimizer, but no call of it reaches a backward() in this program: not wrapped (its parameters get no gradient to average)",
                False,
            )
            return False
        return True

    @staticmethod
    def _outside_reads(ctx: Context, name: str, r) -> list:
        """Parameters of the model read outside its forward on the way to the loss (learned
        loss weights, a penalty over model.parameters()): (read, model reference, what)."""
        a = ctx.a
        out = []
        for node, ref, what in loss_flow.loss_flow(a).outside:
            holder = any(
                p == dotted(ref) and a.function_of(node) is fn for fn, p in r.holders
            )
            if (
                dotted(ref) == name
                or holder
                or routes.reaches(a, r, a.statement(node), ref) is not None
            ):
                out.append((node, ref, what))
        return out

    @staticmethod
    def _repeat_finding(
        ctx: Context, name: str, again: cst.Call, backward: cst.Call
    ) -> None:
        a = ctx.a
        how = (
            "in a loop"
            if forwards._in_loop(a, again, a.block(a.statement(backward)))
            else "a second time"
        )
        why = (
            f"`{name}` runs {how} here before one backward ({code(backward).strip()}): DDP copies rank 0's buffers into "
            "it in place at every forward, which (torch < 2.13, pytorch issue #175024) breaks the first forward's backward "
            'on GPUs (BatchNorm: "modified by an inplace operation"), so broadcast_buffers=False'
        )
        if ctx.opts.sync_bn:
            why += (
                "; with --sync-bn its BatchNorm statistics are computed over all ranks on GPUs (SyncBatchNorm), so they stay "
                "the same on every rank without the broadcast; on CPU, where BatchNorm stays, each rank keeps its own"
            )
        else:
            why += (
                "; each rank keeps its own buffers (BatchNorm running statistics from its own shard) and rank 0's are "
                "the ones saved; parameters stay in sync (--sync-bn would share the statistics)"
            )
        ctx.finding(again, "DDP136", why, True)

    def _ever_placed(self, ctx: Context, name: str, bind) -> bool:
        """Whether anything in the script may put the model on a device: a placement call on
        it, on a name it is handed in under (`model.to(device)` in the entry script, then
        `Trainer(model)`), or in a statement that builds it; a device handed to its constructor,
        or a default device. Unsure means yes: the finding is for scripts that plainly train on CPU."""
        a = ctx.a
        origins = _origins(a, name, bind)
        names = {name, "self"} | {d for o in origins if (d := dotted(o)) is not None}
        names |= a.model_aliases.get(name, set())  # the factory's own name for it
        cls = a.class_of(bind) if name.startswith("self.") else None
        if cls is not None and self._module_class(a, cls):
            # a part of a module that is placed whole: gan = GAN().to(device) moves self.gen
            for c in a.calls:
                if (dotted(c.func) or "").rsplit(".", 1)[-1] == cls.name.value:
                    if (
                        isinstance(a.parent.get(c), cst.Attribute)
                        and a.parent[c].attr.value in PLACEMENT_METHODS
                    ):
                        return True
                    names |= {
                        dotted(t.target)
                        for t in getattr(a.parent.get(c), "targets", [])
                    } - {None}
        names |= {
            dotted(t.target)
            for o in origins
            if isinstance(o, cst.SimpleStatementLine)
            for asg in o.body
            if isinstance(asg, cst.Assign)
            for t in asg.targets
        }
        for c in a.calls:
            f = c.func
            if (
                isinstance(f, cst.Attribute)
                and f.attr.value in PLACEMENT_METHODS
                and dotted(f.value) in names
            ):
                return True
            if (
                isinstance(f, cst.Attribute)
                and f.attr.value in PLACEMENT_METHODS
                and isinstance(f.value, cst.Call)
                and any(dotted(x.value) in names for x in f.value.args)
            ):
                return True  # nn.DataParallel(model).cuda() moves the model it holds
            if (
                a.is_call(c, "torch.set_default_device")
                or a.is_call(c, "torch.device")
                and isinstance(a.parent.get(a.parent.get(c)), cst.WithItem)
            ):
                return True
        for node in origins:
            for c in a.findall(node, m.Call()) + (
                [node] if isinstance(node, cst.Call) else []
            ):
                if (
                    isinstance(c.func, cst.Attribute)
                    and c.func.attr.value in PLACEMENT_METHODS
                ):
                    return True
                if any(
                    x.keyword is not None and "device" in x.keyword.value
                    for x in c.args
                ):
                    return True
                if any("device" in (dotted(x.value) or "").lower() for x in c.args):
                    return True
                # a model built by the script's own function, or unpickled whole, may already be placed
                if (dotted(c.func) or "").split(".")[0] in a.functions or a.is_call(
                    c, "torch.load"
                ):
                    return True
        return False

    def _uses_model(self, ctx: Context, stmt: cst.CSTNode, name: str) -> bool:
        """The model runs or is handed to other code: it must be wrapped by then."""
        for c in ctx.a.findall(stmt, m.Call()):
            if dotted(c.func) == name:
                return True
            fname = dotted(c.func)
            if (
                fname
                and fname.rsplit(".", 1)[-1] in ctx.a.functions
                and any(dotted(x.value) == name for x in c.args)
            ):
                return True
        return False


def _origins(a, name: str, bind) -> list[cst.CSTNode]:
    """What the model is built from: the statement that binds it, and where it is a parameter
    (`def train(model)`, `self.model = model.to(device)` in __init__), what the callers hand it
    and the statements that bind that (the model built in the entry script, handed to a Trainer)."""
    out: list[cst.CSTNode] = []
    work: list[tuple[cst.CSTNode, int]] = [(bind, 0)]
    while work:
        node, depth = work.pop()
        if node is None or any(node is o for o in out) or depth > 4:
            continue
        out.append(node)
        fn = a.function_of(node)
        params: list[str] = []
        if isinstance(node, cst.Param):
            params = [node.name.value]
        elif isinstance(node, cst.SimpleStatementLine) and fn is not None:
            for asg in node.body:
                value = getattr(asg, "value", None)
                while (
                    isinstance(value, cst.Call)
                    and isinstance(value.func, cst.Attribute)
                    and value.func.attr.value in PLACEMENT_METHODS
                ):
                    value = value.func.value  # self.model = model.to(device)
                if isinstance(value, cst.Name) and value.value in {
                    p.name.value for p in fn.params.params
                }:
                    params.append(value.value)
        for p in params:
            for c in a.callers(fn):
                arg = a.argument_for(c, fn, p)
                if arg is None:
                    continue
                work.append((arg, depth + 1))
                if isinstance(arg, cst.Name):  # the caller's binding of it
                    g = a.function_of(c)
                    for asg in a.assigns:
                        if (
                            isinstance(asg, cst.Assign)
                            and a.function_of(asg) is g
                            and any(dotted(t.target) == arg.value for t in asg.targets)
                        ):
                            work.append((a.statement(asg), depth + 1))
                    if g is not None and arg.value in {
                        q.name.value for q in g.params.params
                    }:
                        work.append(
                            (
                                next(
                                    q
                                    for q in g.params.params
                                    if q.name.value == arg.value
                                ),
                                depth + 1,
                            )
                        )
    return out


def _build(a, name: str, bind) -> cst.CSTNode:
    """The node that builds the model (its class's constructor call in it), for reading its class."""
    stmt = (
        bind.body[0]
        if isinstance(bind, cst.SimpleStatementLine) and len(bind.body) == 1
        else bind
    )
    if (
        isinstance(stmt, cst.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0].target, cst.Tuple)
        and isinstance(stmt.value, cst.Tuple)
    ):
        # `actor, critic = Actor(), Critic()`: the element that builds this one
        names = [dotted(el.value) for el in stmt.targets[0].target.elements]
        if name in names and len(names) == len(stmt.value.elements):
            bind = stmt.value.elements[names.index(name)].value
    for node in _origins(a, name, bind):
        calls = a.findall(node, m.Call()) + (
            [node] if isinstance(node, cst.Call) else []
        )
        if any(
            (dotted(c.func) or "").rsplit(".", 1)[-1] in a.classes
            or a.call_qualname(c).startswith("torch.nn.")
            for c in calls
        ):
            return node
    return bind


def _returns(a, fn: cst.FunctionDef, name: str) -> bool:
    """fn returns the model to its caller: `return model`, or inside a returned tuple or dict."""
    for ret in a.findall(fn, m.Return()):
        if a.function_of(ret) is not fn or ret.value is None:
            continue
        value = ret.value
        parts = (
            [value]
            if not isinstance(value, (cst.Tuple, cst.List, cst.Dict))
            else (
                [
                    e.value
                    for e in value.elements
                    if isinstance(e, (cst.Element, cst.DictElement))
                ]
            )
        )
        if any(dotted(p) == name for p in parts):
            return True
    return False


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def bind_or_none(a, name: str):
    return next(
        (
            asg
            for asg in a.assigns
            if any(dotted(t.target) == name for t in getattr(asg, "targets", []))
        ),
        None,
    )
