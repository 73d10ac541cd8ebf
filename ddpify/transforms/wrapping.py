"""Wrapping: DDP applied in place to each module the optimizers step, right before the statement
that takes its parameters for the optimizer (torch's composable `replicate`, through the
generated `ddp_in_place`). The model stays one object under every name: every call of it, from
any function, method or library, runs DDP's forward hooks, so backward averages its gradients;
its class, attributes, state_dict keys, copies and pickles stay those of the plain model. DDP
starts at the model's first forward, so what the script does to the model before it trains
(placement, initialisation, loaded weights, freezing, torch.compile) is taken as it is; a change
while it trains is refused (DDP036). nn.DataParallel is removed: DDP does its work."""

from __future__ import annotations

from dataclasses import replace

import libcst as cst
import ddpify.match as m

from ddpify.analysis import builds, devices, gradients, lifecycle, loss_flow, model_code
from ddpify.analysis import call_args, code, dotted
from ddpify.analysis.tree import _inside
from ddpify.rules import Said, declare
from ddpify.transforms.base import Concern, Context
from ddpify.transforms.plans import Wrap, WrapPlan

# The codes this module raises (the registry: ddpify/rules.py).
DDP030 = declare(
    "DDP030",
    "ddp-in-place",
    "model made distributed in place (DDP's hooks on the module itself)",
    fix=True,
    check="params-in-sync",
    says={
        "": "`{model}` made distributed in place before its optimizer takes its parameters "
        "(ddp_in_place: DDP's hooks on the module itself): every call of it, under any name, "
        "averages its gradients, and it keeps its class, attributes and state_dict keys{more}",
        "relocated": "`{model}` made distributed in place in `{fn}()`, before it trains (it is "
        "built when its module is imported, before the process group exists){more}",
        "unstepped": (
            "`{model}` is not made distributed: no optimizer over its parameters steps",
            False,
        ),
    },
)
DDP031 = declare(
    "DDP031",
    "dataparallel-replaced",
    "nn.DataParallel replaced by DDP (one process per GPU)",
    fix=True,
    check="params-in-sync",
    says={
        "": "nn.DataParallel removed: DDP, one process per GPU, does its work",
        "functional": "nn.parallel.data_parallel(model, x) becomes model(x); DDP does the "
        "parallelism",
        "module": "{name}.module was DataParallel's: without DataParallel it is {name} itself",
    },
)
DDP032 = declare(
    "DDP032",
    "sync-batchnorm",
    "BatchNorm converted to SyncBatchNorm",
    fix=True,
    check="params-in-sync",
    says={
        "": "BatchNorm layers of `{model}`{maybe} converted to SyncBatchNorm on GPUs "
        "(--sync-bn), before its optimizer takes the new layers' parameters",
        "none": (
            "--sync-bn: `{model}` has no BatchNorm layers (its code is read), so nothing is "
            "converted",
            False,
        ),
    },
)
DDP034 = declare(
    "DDP034",
    "model-not-found",
    "no model to make distributed found: make it distributed by hand",
    severity="blocking",
    says={
        "": "no model found: no optimizer ddpify can follow takes a module's parameters; "
        "before the optimizer is built, apply DDP to the trained module in place by hand "
        "(`from torch.distributed._composable import replicate`; `replicate(model)`)",
        "tensors": "the optimizer built at line {line} steps tensors that no module holds "
        "({what}): DDP averages the gradients of modules; keep them as nn.Parameter "
        "attributes of an nn.Module the training calls, or average their gradients by hand "
        "before each step (dist.all_reduce(t.grad); t.grad /= WORLD_SIZE)",
        "itself": "class `{cls}` builds its own optimizer over self.parameters() (line {line}) and "
        "updates itself in its method `{fn}`: no forward of the model runs outside it, so DDP "
        "would sync nothing; by hand, give each rank its share of the data and average the "
        "gradients before each step (for p in self.parameters(): dist.all_reduce(p.grad); "
        "p.grad /= WORLD_SIZE)",
        "inner": "`{model}` runs a backward pass inside its own `{fn}` (line {line}), as inner "
        "training loops do (meta-learning): DDP would average gradients inside the forward it "
        "is running, which it cannot; average the outer gradients by hand "
        "(dist.all_reduce(p.grad) over its parameters before the outer step)",
        "part-method": "the training runs `{call}`, a method of a part of `{model}`, which no "
        "module call reaches: DDP averages gradients through module calls and the model's own "
        "methods; call it through a method of `{model}` (or make it that part's forward)",
    },
)
DDP035 = declare(
    "DDP035",
    "model-on-cpu",
    "model never moved to a device: it stays on the CPU",
    severity="blocking",
    says="`{model}` is never moved to a device, but the script places other things on one: on "
    "GPUs it would stay on the CPU while its inputs go to the GPU (the script fails there "
    "already); move it with .to(LOCAL_DEVICE) where it is built (or keep the whole script on "
    "the CPU: remove its device handling)",
)
DDP036 = declare(
    "DDP036",
    "model-changed-while-training",
    "model changed while it trains, where DDP cannot follow: not made distributed",
    severity="blocking",
    says="`{model}` is changed here ({what}) while it trains: DDP fixes the model's parameters, "
    "their device and which of them need gradients at its first forward, and cannot follow "
    "this change: not made distributed; make the change before training starts (or train each "
    "phase as a run of its own, the next one loading the last one's weights)",
)
DDP037 = declare(
    "DDP037",
    "unused-parameters",
    "parameters that may get no gradient: find_unused_parameters=True",
    fix=True,
    check="ranks",
    says='`{model}`: {why}: DDP would wait for their gradients ("Expected to have finished '
    'reduction" at step 2), so find_unused_parameters=True (slower; drop what is never used '
    "to avoid it)",
)
DDP039 = declare(
    "DDP039",
    "model-frozen",
    "model with every parameter frozen: not made distributed",
    fix=True,
    check="ranks",
    says="every parameter of `{model}` is frozen here, and DDP refuses a module with nothing "
    "to train: not made distributed (its weights must be the same on every rank: loaded, or "
    "built after the same seed)",
)
DDP138 = declare(
    "DDP138",
    "params-outside-forward",
    "parameters read outside forward reach the loss while find_unused_parameters=True is "
    "needed: not made distributed",
    severity="blocking",
    says="`{what}` is read outside the forward of `{model}` and its value reaches the loss, "
    "while some parameters may get no gradient ({why}): with find_unused_parameters=True, DDP "
    "marks parameters its forward did not use as ready at the forward, and their gradient "
    'then arrives a second time at backward ("Expected to mark a variable ready only '
    "once\"): not made distributed; move the computation that reads `{what}` into the model's "
    "forward (return it with the output), or make every parameter get a gradient",
)

# DDP's hooks on the module itself. torch's composable replicate swaps in a subclass of the
# model's own class for that one module; copies and pickles are given the plain model back.
IN_PLACE = '''

def ddp_in_place(module, entries=(), **options):
    """DDP on `module` itself: every call of it, under any name, syncs its gradients."""
    # torch's composable replicate: the module keeps its class, attributes and
    # state_dict keys, and its copies and pickles are the plain model. `entries`:
    # methods and parts the training calls directly, which run DDP's hooks too.
    import copy
    import copyreg

    from torch.distributed._composable import _get_registry, replicate

    # no process group: another script imports this one
    if not {dist}.is_initialized() or "replicate" in (_get_registry(module) or {{}}):
        return module
    replicate(module, **options)
    state, cls = replicate.state(module), type(module)  # cls: replicate's subclass
    hooks = (state.forward_pre_hook, state.forward_post_hook)
    base = cls.__mro__[2]  # the model's own class
{entries}
    def plain(self):
        out = object.__new__(base)
        for key, value in self.__dict__.items():
            if key in ("_forward_pre_hooks", "_forward_hooks"):  # all but DDP's
                value = type(value)((k, h) for k, h in value.items() if h not in hooks)
            if not key.startswith("__composable_api_state_key"):
                out.__dict__[key] = value
        return out

    # copies (an EMA, the best model) and pickles (a whole model saved): the plain model
    cls.__deepcopy__ = lambda self, memo: copy.deepcopy(plain(self), memo)
    cls.__reduce_ex__ = lambda self, protocol: (
        copyreg._reconstructor,
        (base, object, None),
        plain(self).__dict__,
    )
    return module
'''
ENTRIES = """
    def through(method):
        def run(self, *args, **kwargs):
            state.forward_pre_hook(self, args, kwargs)
            return state.forward_post_hook(self, args, method(self, *args, **kwargs))

        return run

    parts = []
    for name in entries:
        if name.endswith("*"):  # every part of a container the training runs one by one
            parts += list(module.get_submodule(name[:-2]).children())
            continue
        run = module.get_submodule(name) if "." in name else getattr(module, name)
        if isinstance(run, {torch}.nn.Module):
            parts.append(run)
        else:
            setattr(cls, name, through(getattr(base, name)))
    if parts:
        # global hooks: the parts hold nothing of DDP, and copy and pickle as they were
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        def pre(part, args):
            if any(part is p for p in parts):
                state.forward_pre_hook(part, args, {{}})

        def post(part, args, out):
            if any(part is p for p in parts):
                return state.forward_post_hook(part, args, out)

        register_module_forward_pre_hook(pre)
        register_module_forward_hook(post)

"""

PARAMETERS = ("parameters", "named_parameters")


class WrappingTransform(Concern):
    name = "wrapping"
    makes = "wrap"

    # -- decide -----------------------------------------------------------------------------------
    def decide(self, ctx: Context) -> WrapPlan:
        a = ctx.a
        said = []
        dp = tuple(c for c in a.dataparallel_calls if ctx.editable(c))
        if not a.models:
            if a.steps:
                said.append(
                    self._trains_itself(ctx)
                    or self._tensors(ctx)
                    or DDP034.at(a.steps[0].backward)
                )
            return WrapPlan(dataparallel=dp, said=tuple(said))
        wraps: list[Wrap] = []
        for model in a.models:
            found, why = self._wraps_of(ctx, model)
            said += why
            for w in found:
                if not any(w.module == o.module and w.site is o.site for o in wraps):
                    wraps.append(w)
        return WrapPlan(tuple(wraps), dp, tuple(said))

    def _wraps_of(self, ctx: Context, model: str) -> tuple[list[Wrap], list]:
        """Where `model` is made distributed, and what it takes; or the findings that say why it
        cannot be."""
        a = ctx.a
        said: list = []
        opts = a.optimizer_calls_of(model)
        if opts and not builds.stepped(a, model):
            # an auxiliary model: its optimizer is built, never stepped
            return [], [DDP030.at(opts[0], "unstepped", model=model)]
        late = lifecycle.changes_in_training(a, model)
        if late:
            for node, kind in late:
                said.append(DDP036.at(node, model=model, what=lifecycle.WHAT[kind]))
            return [], said
        inner = self._inner_training(ctx, model)
        if inner is not None:
            return [], [inner]
        frozen = self._frozen(ctx, model)
        if frozen is not None:
            return [], [DDP039.at(frozen, model=model)]
        sites = self._sites(ctx, model, opts)
        if not sites and not opts and (hand := self._by_hand(ctx, model)) is not None:
            return [hand], [DDP030.at(hand.site, model=model, more="")]
        if not sites:
            said.append(DDP034.at(None))
            return [], said
        bind = builds.binding(a, model)
        build = builds.build_node(a, model, bind) if bind is not None else None
        entries, bad = self._entries(ctx, model)
        if bad is not None:
            return [], [bad]
        options: list[tuple[str, str]] = []
        if build is not None:
            unused, outside = self._unused(ctx, model, build, entries)
            if unused and outside:
                node, _, what = outside[0]
                return [], [DDP138.at(node, what=what, model=model, why=unused[0])]
            if unused:
                options.append(("find_unused_parameters", "True"))
                said.append(DDP037.at(bind, model=model, why="; ".join(unused)))
        if (
            not ctx.cpu_only
            and devices.places_anything(a)
            and bind is not None
            and not builds.ever_placed(a, model, bind)
        ):
            said.append(DDP035.at(bind, model=model))
        sync_bn = False
        if ctx.opts.sync_bn and build is not None and ctx.opts.amp != "apex":
            bn = model_code.has_batchnorm(model_code.model_code(a, build, ctx.path))
            if bn is False:
                said.append(DDP032.at(bind, "none", model=model))
            else:
                sync_bn = True
                maybe = (
                    ""
                    if bn
                    else ", if it has any (ddpify cannot read all of its code),"
                )
                said.append(DDP032.at(bind, model=model, maybe=maybe))
        wraps = []
        for module, site, moved, over in sites:
            if not ctx.editable(site):
                what = f"`{model}` not made distributed before this statement: the ranks would train unsynchronised copies"
                said.append(
                    Said(
                        site,
                        "DDP098",
                        f"not done because of `# ddpify: skip`/`off`: {what}",
                        False,
                        "blocking",
                    )
                )
                return [], said
            # the entries are the model's methods and parts: a part of it made distributed
            # alone runs its hooks through the model's own calls of it
            mine = () if module.startswith(model + ".") else entries
            wraps.append(
                Wrap(module, site, model, mine, tuple(options), sync_bn, over=over)
            )
            said.append(self._done(ctx, wraps[-1], moved))
        return wraps, said

    def _sites(
        self, ctx: Context, model: str, opts: dict
    ) -> list[tuple[str, cst.BaseStatement, bool]]:
        """(the module as named there, the statement it goes before) for each optimizer over
        the model: the statement that takes the module's parameters (`model.parameters()` in
        the optimizer's call, or in the list of parameter groups built before it), where the
        module is in scope by construction. A model updated by hand goes after its binding."""
        a = ctx.a
        out: list[tuple[str, cst.BaseStatement, bool, str]] = []
        for call in opts:
            sources = [_plain_source(s) for s in a._param_sources(call)]
            owner = _owner(model, sources)
            if owner is None:
                continue
            site, over = self._taking(a, call, owner)
            site = site or a.statement(call)
            site = self._before_forward_reads(ctx, model, site)
            moved = self._relocated(ctx, owner, site)
            if not any(o == owner and s is (moved or site) for o, s, _, _ in out):
                out.append((owner, moved or site, moved is not None, over))
        return out

    def _before_forward_reads(self, ctx: Context, model: str, site):
        """A bound `model.forward` kept before the site is taken before the wrap exists: the
        wrap goes before the first such statement of the site's block."""
        a = ctx.a
        body = list(getattr(a.block(site), "body", ()))
        if site not in body:
            return site
        for read in self._forward_reads(ctx, model):
            stmt = a.statement(read)
            if stmt in body and body.index(stmt) < body.index(site):
                site = stmt
        return site

    @staticmethod
    def _by_hand(ctx: Context, model: str) -> Wrap | None:
        """A model updated by hand (no optimizer): made distributed after its binding."""
        bind = builds.binding(ctx.a, model)
        if isinstance(bind, cst.BaseStatement):
            return Wrap(model, bind, model, after=True)
        return None

    @staticmethod
    def _taking(a, call: cst.Call, owner: str) -> tuple[cst.BaseStatement | None, str]:
        """The statement that takes `owner`'s parameters for the optimizer `call`: the call's
        own statement when it does, else the first statement of the call's function (the
        parameter groups built before it), else of any function (handed in by a caller); and,
        where a comprehension binds the module (`[p for m in models for p in m.parameters()]`),
        the `for` that gives each of them."""
        stmt = a.statement(call)
        fn = a.function_of(call)
        found = []
        for c in a.findall(a.module, m.Call(func=m.Attribute())):
            if c.func.attr.value not in PARAMETERS:  # type: ignore[attr-defined]
                continue
            base = _plain_source(dotted(c.func.value) or "")  # type: ignore[attr-defined]
            if base == owner or base.startswith(owner + "."):
                found.append(c)
        mine = [c for c in found if _within(a, c, stmt)]
        local = [c for c in found if a.function_of(c) is fn]
        earlier = [c for c in local if a.pos[c].start.line < a.pos[call].start.line]
        if not (mine or earlier):
            # handed to a factory that takes its parameters: `opt = make(model)`, here or at
            # the call of the function that builds the optimizer
            for s in [stmt, *(a.statement(c) for c in (a.callers(fn) if fn else ()))]:
                if _mentions(a, s, owner):
                    return s, ""
        pick = mine or earlier or local or found
        if not pick:
            return None, ""
        return (stmt if mine else a.statement(pick[0])), _comprehension(
            a, pick[0], owner
        )

    def _relocated(self, ctx: Context, owner: str, site) -> cst.BaseStatement | None:
        """A model built with its optimizer when its module is imported (or by the module a
        console script starts): the process group does not exist yet there, so it is made
        distributed at the start of the one module-level function that trains it."""
        a = ctx.a
        if a.function_of(site) is not None or not (
            a.region_of(site) != 0 or ctx.console()
        ):
            return None
        fns = {
            id(f): f
            for tf in loss_flow.loss_flow(a).forwards
            if (f := a.function_of(tf.call)) is not None
        }
        if len(fns) != 1 or "." in owner:
            return None
        fn = next(iter(fns.values()))
        if a.function_of(fn) is not None or a.class_of(fn) is not None:
            return None
        body = list(fn.body.body) if isinstance(fn.body, cst.IndentedBlock) else []
        body = body[1:] if body and builds._is_docstring(body[0]) else body
        return body[0] if body and not a._is_local(fn, owner) else None

    def _entries(self, ctx: Context, model: str) -> tuple[tuple[str, ...], object]:
        """The model's methods and submodules its training forwards call directly
        (`model.loss(x)`, `model.encoder(x)`): DDP's hooks must run around them too. A method
        that calls the model itself (`self(x)`) runs them already."""
        a = ctx.a
        out: list[str] = []
        for tf in loss_flow.loss_flow(a).forwards:
            if tf.method is None or not _same_model(a, tf.receiver, model):
                continue
            cls = loss_flow.model_class(a, tf.receiver)
            head, *rest = tf.method.split(".")
            methods = (
                {
                    f.name.value: f
                    for f in cls.body.body
                    if isinstance(f, cst.FunctionDef)
                }
                if cls is not None
                else {}
            )
            if head in methods:
                if rest:
                    return (), DDP034.at(
                        tf.call, "part-method", call=code(tf.call.func), model=model
                    )
                if head == "forward" or not _calls_itself(a, cls, methods[head]):
                    name = head
                else:
                    continue
            elif (
                rest and cls is not None and head in loss_flow.owned_attributes(a, cls)
            ):
                name = tf.method  # a submodule's submodule: model.encoder.block(x)
            else:
                name = tf.method
            if name not in out:
                out.append(name)
        for part in self._parts_called(ctx, model):
            if part not in out:
                out.append(part)
        # model.forward read, not called through the module (step = model.forward): it runs
        # no hook unless forward itself does
        if "forward" not in out and self._forward_reads(ctx, model):
            out.append("forward")
        return tuple(out), None

    @staticmethod
    def _parts_called(ctx: Context, model: str) -> list[str]:
        """Parts of the model the training calls by index (`model[0](x)`) or one by one (`for
        layer in model.layers: x = layer(x)`): "0", or "layers.*" for every part of
        model.layers."""
        a = ctx.a
        out: list[str] = []
        for call in a.calls:
            func = call.func
            if isinstance(func, cst.Subscript) and dotted(func.value) == model:
                index = func.slice[0].slice
                if isinstance(index, cst.Index) and isinstance(
                    index.value, (cst.Integer, cst.SimpleString)
                ):
                    value = index.value
                    key = (
                        value.value
                        if isinstance(value, cst.Integer)
                        else value.evaluated_value
                    )
                    out.append(str(key))
                    continue
                out.append("*")
            elif isinstance(func, cst.Name):
                loop = next(
                    (
                        f
                        for f in a.fors
                        if isinstance(f.target, cst.Name)
                        and f.target.value == func.value
                        and _inside(a, call, f)
                    ),
                    None,
                )
                holder = dotted(loop.iter) if loop is not None else None
                if holder == model or (holder or "").startswith(model + "."):
                    rest = holder[len(model) + 1 :]
                    part = f"{rest}.*" if rest else "*"
                    if part not in out:
                        out.append(part)
        return out

    @staticmethod
    def _forward_reads(ctx: Context, model: str) -> list[cst.Attribute]:
        a = ctx.a
        return [
            attr
            for attr in a.attributes
            if attr.attr.value == "forward"
            and (d := dotted(attr.value)) is not None
            and (d == model or (d != "self" and _same_model(a, attr.value, model)))
        ]

    @staticmethod
    def _unused(ctx: Context, model: str, build, entries) -> tuple[list[str], list]:
        """Why some parameters may get no gradient (DDP then needs find_unused_parameters), and
        the parameters read outside forward on the way to the loss."""
        a = ctx.a
        outside = [
            (node, ref, what)
            for node, ref, what in loss_flow.loss_flow(a).outside
            if _same_model(a, ref, model)
        ]
        used = {
            "self." + (dotted(node) or "")[len(dotted(ref) or "") + 1 :].split(".")[0]
            for node, ref, _ in outside
        }
        methods = [e for e in entries if "." not in e]
        runs = ["forward"] + [e for e in methods if e != "forward"]
        unused = gradients.unused_parameters(a, build, runs, used)
        if not unused and len(runs) > 1:
            # each kind of training forward has its own backward (TD3's critic: forward() for
            # its loss, Q1() in the actor's): what one of them never reaches gets no gradient
            for e in runs:
                per = gradients.unused_parameters(a, build, [e], used)
                if per:
                    unused = [
                        per[0].replace(" in forward", f" in .{e}()")
                        + ", which runs in a backward of its own"
                    ]
                    break
        dropped = gradients.discarded_outputs(a, model)
        if dropped:
            unused.append(
                f"outputs of {model}(...) are discarded at line {a.pos[dropped[0]].start.line} "
                "(the parameters behind them may get no gradient from that loss)"
            )
        return unused, outside

    def _trains_itself(self, ctx: Context):
        """A module class that builds its own optimizer over self.parameters() and steps it in
        its own method (forward-forward's per-layer training)."""
        a = ctx.a
        for step in a.steps:
            cls, fn = a.class_of(step.stmt), a.function_of(step.stmt)
            if cls is None or fn is None:
                continue
            for call in a.findall(cls, m.Call()):
                if a._is_optimizer_call(call) and "self" in a._param_sources(call):
                    return DDP034.at(
                        step.backward,
                        "itself",
                        cls=cls.name.value,
                        line=a.pos[call].start.line,
                        fn=fn.name.value,
                    )
        return None

    @staticmethod
    def _frozen(ctx: Context, model: str) -> cst.CSTNode | None:
        """The statement that freezes every parameter of the model before it trains."""
        a = ctx.a
        bind = builds.binding(a, model)
        if not isinstance(bind, cst.BaseStatement):
            return None
        start = lifecycle.training_start(a, model)
        body = list(getattr(a.block(bind), "body", ()))
        stmts = body[body.index(bind) :] if bind in body else []
        if start is not None:
            stmts = [st for st in stmts if a.pos[st].start.line < start]
        return gradients.fully_frozen(a, model, stmts)

    @staticmethod
    def _tensors(ctx: Context):
        """An optimizer over tensors the script made itself, no module's parameters."""
        a = ctx.a
        for call in a.optimizer_calls:
            pos, _ = call_args(call)
            if pos and isinstance(pos[0].value, (cst.List, cst.Tuple)):
                names = [code(e.value) for e in pos[0].value.elements]
                return DDP034.at(
                    call, "tensors", line=a.pos[call].start.line, what=", ".join(names)
                )
        return None

    @staticmethod
    def _inner_training(ctx: Context, model: str):
        """A backward pass inside the model's own forward (an inner loop: meta-learning)."""
        a = ctx.a
        bind = builds.binding(a, model)
        build = builds.build_node(a, model, bind) if bind is not None else None
        if build is None:
            return None
        cls = next(
            (
                a.classes[n]
                for c in a.findall(build, m.Call())
                if (n := (dotted(c.func) or "").rsplit(".", 1)[-1]) in a.classes
            ),
            None,
        )
        if cls is None:
            return None
        for step in a.steps:
            fn = a.function_of(step.stmt)
            if fn is not None and a.class_of(fn) is cls and fn.name.value == "forward":
                return DDP034.at(
                    step.backward,
                    "inner",
                    model=model,
                    fn=fn.name.value,
                    line=a.pos[step.backward].start.line,
                )
        return None

    @staticmethod
    def _done(ctx: Context, w: Wrap, moved: bool):
        if w.over:  # every module a comprehension takes the parameters of
            w = replace(w, model=f"{w.module}` in `{w.over}")
        elif w.module.startswith(w.model + "."):  # a part with an optimizer of its own
            w = replace(w, model=f"{w.module}`, a part of `{w.model}")
        more = ""
        if w.entries:
            shown = ", ".join(f".{e}()" for e in w.entries)
            more = f"; {shown} run DDP's hooks too (the training calls them directly)"
        if moved:
            fn = ctx.a.function_of(w.site)
            return DDP030.at(
                w.site, "relocated", model=w.model, fn=fn.name.value, more=more
            )
        return DDP030.at(w.site, model=w.model, more=more)

    # -- emit -------------------------------------------------------------------------------------
    def emit(self, ctx: Context, plan: WrapPlan) -> None:
        for said in plan.said:
            ctx.say(said)
        self._replace_dataparallel(ctx, plan.dataparallel)
        if not plan.wraps:
            return
        torch = ctx.name("torch")
        options = {}
        for extra in (ctx.plans.ddp_buckets, ctx.plans.static_graph):
            for model, key, value in extra.options if extra is not None else ():
                options.setdefault(model, []).append((key, value))
        for w in plan.wraps:
            if w.sync_bn:
                # SyncBatchNorm runs on GPUs only: on the CPU, BatchNorm stays
                ctx.edits.before[w.site].append(
                    ctx.stmt(
                        f"{w.module} = {torch}.nn.SyncBatchNorm.convert_sync_batchnorm("
                        f'{w.module}) if LOCAL_DEVICE.type == "cuda" else {w.module}\n'
                    )
                )
            args = [w.module]
            if w.entries:
                quoted = [f'"{e}"' for e in w.entries]
                args.append(
                    f"({quoted[0]},)" if len(quoted) == 1 else f"({', '.join(quoted)})"
                )
            args += [f"{k}={v}" for k, v in (*w.options, *options.get(w.model, ()))]
            at = ctx.edits.after if w.after else ctx.edits.before
            call = f"ddp_in_place({', '.join(args)})\n"
            at[w.site].append(ctx.stmt(f"{w.over}:\n    {call}" if w.over else call))
        # launch.py fills in {dist} and {torch}
        entries = ENTRIES if any(w.entries for w in plan.wraps) else "\n"
        text = IN_PLACE.replace("{entries}\n", entries)
        if not any("def ddp_in_place(" in t for t in ctx.helper_texts):
            ctx.helper_texts.append(text)

    @staticmethod
    def _replace_dataparallel(ctx: Context, calls) -> None:
        a = ctx.a
        for call in calls:
            pos, _ = call_args(call)
            if not pos:
                continue
            inner = pos[0].value
            stmt = a.statement(call)
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
            ctx.say(DDP031.at(call))
            _dataparallel_module(ctx, dotted(inner), call)
        for call in a.functional_dp_calls:
            pos, _ = call_args(call)
            if not ctx.editable(call) or len(pos) < 2:
                continue

            def fn(node):
                return cst.Call(
                    func=node.args[0].value,
                    args=[node.args[1].with_changes(comma=cst.MaybeSentinel.DEFAULT)],
                )

            ctx.edits.replace(call, fn)
            ctx.say(DDP031.at(call, "functional"))


def _dataparallel_module(ctx: Context, name: str | None, call: cst.Call) -> None:
    """`model.module` written for DataParallel names the model itself once DataParallel is gone."""
    a = ctx.a
    if name is None:
        return
    fn = a.function_of(call)
    done = ctx.__dict__.setdefault("_dp_module_attrs", set())
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
        if id(attr) in done:
            continue  # several DataParallel(...) calls of one model: one edit per attribute
        done.add(id(attr))
        ctx.edits.replace(attr, lambda n: n.value)
        ctx.say(DDP031.at(attr, "module", name=name))


def _plain_source(source: str) -> str:
    """`model.module` (DataParallel's) is the model itself once DataParallel is gone."""
    while source.endswith(".module"):
        source = source[: -len(".module")]
    return source


def _owner(model: str, sources: list[str]) -> str | None:
    """The module to make distributed for `model` among an optimizer's parameter sources: the
    common owner of the parts it takes (`model` for model.backbone and model.head), the source
    that is the model, or, for a model named otherwise at the optimizer (a factory's local,
    `net` for `self.net`), the one source there is."""
    if not sources:
        return None
    roots: dict[str, list[str]] = {}
    for s in sources:
        head = s.split(".")[0]
        key = ".".join(s.split(".")[:2]) if head == "self" and "." in s else head
        roots.setdefault(key, []).append(s)
    owners = [_common(group) for group in roots.values()]
    last = model.rsplit(".", 1)[-1]
    for o in owners:
        if o == model or model.startswith(o + ".") or o.startswith(model + "."):
            return o
    for o in owners:
        if o.rsplit(".", 1)[-1] == last:
            return o
    return owners[0] if len(owners) == 1 else None


def _common(paths: list[str]) -> str:
    parts = [p.split(".") for p in paths]
    out = []
    for group in zip(*parts):
        if len(set(group)) != 1:
            break
        out.append(group[0])
    return ".".join(out) or paths[0]


def _same_model(a, ref: cst.BaseExpression, model: str) -> bool:
    """`ref` (a training forward's receiver) names `model`: the same path, an alias or a
    parameter the model is handed to, the same class; with one model, any."""
    if len(a.models) == 1:
        return True
    d = dotted(ref)
    if d == model or (d and d.rsplit(".", 1)[-1] == model.rsplit(".", 1)[-1]):
        return True
    mine = loss_flow.model_class(a, ref)
    bind = builds.binding(a, model)
    if mine is None or bind is None:
        return False
    node = builds.build_node(a, model, bind)
    names = {
        (dotted(c.func) or "").rsplit(".", 1)[-1] for c in a.findall(node, m.Call())
    }
    return mine.name.value in names


def _calls_itself(a, cls: cst.ClassDef, fn: cst.FunctionDef) -> bool:
    """fn (a method of the model's class) calls the model itself, `self(...)`, on every path
    ddpify can read: the module call runs DDP's hooks."""
    methods = {f.name.value: f for f in cls.body.body if isinstance(f, cst.FunctionDef)}
    todo, seen = [fn], set()
    while todo:
        f = todo.pop()
        if f.name.value in seen:
            continue
        seen.add(f.name.value)
        for c in a.findall(f, m.Call()):
            d = dotted(c.func) or ""
            if d == "self":
                return True
            if d.startswith("self.") and d[5:] in methods:
                todo.append(methods[d[5:]])
    return False


def _comprehension(a, node: cst.CSTNode, owner: str) -> str:
    """`for m in models.values()` where a comprehension around node binds owner's root."""
    root = owner.split(".")[0]
    cur = a.parent.get(node)
    while cur is not None and not isinstance(cur, cst.BaseStatement):
        comp = getattr(cur, "for_in", None)
        while comp is not None:
            if root in {n.value for n in a.findall(comp.target, m.Name())}:
                return f"for {code(comp.target)} in {code(comp.iter)}"
            comp = comp.inner_for_in
        cur = a.parent.get(cur)
    return ""


def _mentions(a, stmt: cst.CSTNode, owner: str) -> bool:
    """`owner` (a name or dotted path) is read in `stmt`."""
    return any(
        _plain_source(dotted(n) or "") == owner
        for n in a.findall(stmt, m.Name() | m.Attribute())
    )


def _within(a, node: cst.CSTNode, stmt: cst.CSTNode) -> bool:
    cur = node
    while cur is not None:
        if cur is stmt:
            return True
        cur = a.parent.get(cur)
    return False
