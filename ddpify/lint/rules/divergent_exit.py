"""A rank leaving a loop, or skipping the rest of its body, on a condition computed from its own
values (its rank, its loss, a metric over its shard of the data) while the loop runs collectives:
the other ranks go on and wait for it in the next collective. Early stopping on a local metric
is the usual case."""

from __future__ import annotations

import re

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import code, dotted
from ddpify.lint.rules.common import sampler_kind
from ddpify.lint.values import UNK
from ddpify.rules import declare

declare(
    "DDP211",
    "rank-local-loop-exit",
    "a break/return/continue on a condition computed from one rank's values (its rank, its loss, a metric of its shard) in a loop that runs collectives: that rank leaves, the others hang",
    severity="blocking",
    tool="lint",
)

PLACEMENT = {"to", "cuda", "cpu", "pin_memory"}  # where a value sits is not what it is
DEVICE_ARGS = {"device", "device_ids", "output_device", "map_location", "non_blocking"}
OPTIONS = re.compile(r"^(args|opts?|cfg|config|conf|hparams|flags|params|hp)$")
SAME_ON_EVERY_RANK = {
    "len",
    "shape",
    "size",
    "numel",
    "dim",
    "ndim",
    "range",
    "enumerate",
}


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if not f.distributed:
        return
    local = None
    for x in a.findall(a.module, m.Break() | m.Continue() | m.Return()):
        loop = a.enclosing_loop(x)
        if loop is None:
            continue
        conds = [(t, k) for t, k in f.reach.conditions(x) if f.order(t) > f.order(loop)]
        if not conds:
            continue
        syncs = [
            c
            for c in a.findall(loop, m.Call())
            if (not isinstance(x, cst.Continue) or f.order(c) > f.order(x))
            and f.sync_point(c) is not None
            and not f.reach.divergent(c)
            and not silent_forward(f, c)
        ]
        if not syncs:
            continue
        why = None
        for test, _ in conds:
            if f.ranks.depends(test):
                why = f"`{code(test)}` depends on the rank"
                break
            local = local or _Local(ctx)
            src = local.source(test)
            if src:
                why = f"`{code(test)}` is computed from this rank's own values ({src})"
                break
        if why is None:
            continue
        word = {cst.Break: "break", cst.Continue: "continue", cst.Return: "return"}[
            type(x)
        ]
        effect = (
            "skips the rest of this iteration"
            if word == "continue"
            else "leaves the loop"
        )
        ctx.report(
            x,
            "DDP211",
            f"`{word}` {effect} on one rank: {why}, but the loop runs {f.sync_point(syncs[0])} on every rank, so the other ranks wait for this one and hang; decide on every rank alike (all_reduce the value first, or broadcast rank 0's decision)",
        )


def silent_forward(f, c: cst.Call) -> bool:
    """A forward of a DDP model without buffers under torch.no_grad(): it communicates nothing."""
    w = f.wrapper(c.func)
    return w is not None and w.kind == "ddp" and f.no_grad(c) and f.buffers(w) == "no"


class _Local:
    """Which values a rank computes from its own share of the work: its rank, the batches of a
    sharded loader and what is computed from them (losses, metrics), through assignments (the
    last binding before a read, and those later in the loop around it), `if`s that set a flag,
    `self` attributes and the return values of the script's functions; asked on demand. A value
    that went through a collective (all_reduce, broadcast, a function that runs one) is the same
    on every rank again; so are shapes and lengths (a DistributedSampler gives each rank as many
    samples)."""

    def __init__(self, ctx) -> None:
        self.a = ctx.a
        self.f = ctx.facts
        self.ctx = ctx
        a, f = self.a, self.f
        self.sites: dict[
            tuple[int, str], list[tuple[int, cst.CSTNode]]
        ] = {}  # (function, name) -> (order, binding)
        self.attr_sites: dict[str, list[cst.CSTNode]] = {}
        self._why: dict[int, str | None] = {}
        self._returns: dict[str, str | None] = {}
        self.seeds: dict[int, str] = {}
        self.index_targets: set[int] = set()
        # dist.all_reduce(t) / broadcast(t): t is the same on every rank from there on
        self.reduced: dict[tuple[int, str], list[int]] = {}
        for c in a.calls:
            what = f.collective(c)
            if (
                what is not None
                and c.args
                and not what.startswith("the forward")
                and dotted(c.args[0].value)
            ):
                self.reduced.setdefault(
                    (id(a.function_of(c)), dotted(c.args[0].value)), []
                ).append(f.order(c))
        for node in a.findall(
            a.module, m.Assign() | m.AugAssign() | m.AnnAssign() | m.For() | m.Call()
        ):
            if isinstance(node, cst.Call):
                if not (
                    isinstance(node.func, cst.Attribute)
                    and node.func.attr.value
                    in ("append", "extend", "add", "update", "add_", "copy_")
                ):
                    continue
                targets = [node.func.value]
            elif isinstance(node, cst.For):
                targets = [node.target]
            elif isinstance(node, cst.Assign):
                targets = [t.target for t in node.targets]
            else:
                targets = [node.target]
            for t in targets:
                for el in _flatten(t):
                    d = dotted(el)
                    if not d:
                        continue
                    if d.startswith("self.") and d.count(".") == 1:
                        self.attr_sites.setdefault(d, []).append(node)
                    else:
                        self.sites.setdefault((id(a.function_of(node)), d), []).append(
                            (f.order(node), node)
                        )
        for ld in a.loaders:
            sampler = f.loader_args(ld.call).get("sampler")
            if (
                not ld.target
                or sampler is None
                or sampler_kind(ctx, sampler) != "distributed"
            ):
                continue
            for site, _ in a.loader_iteration_sites(ld.target, a.function_of(ld.call)):
                if isinstance(site, cst.For):
                    self.seeds[id(site)] = (
                        f"the batches of {ld.target}, sharded by rank"
                    )
                    t = site.target
                    if (
                        m.findall(site.iter, m.Call(func=m.Name("enumerate")))
                        and isinstance(t, (cst.Tuple, cst.List))
                        and len(t.elements) == 2
                    ):
                        self.index_targets.add(
                            id(t.elements[0].value)
                        )  # the index is the same on every rank

    def _binding_why(self, node: cst.CSTNode, name: str) -> str | None:
        key = id(node)
        if key in self._why:
            return self._why[key]
        self._why[key] = None  # a value defined through itself adds nothing
        why = self._compute(node, name)
        self._why[key] = why
        return why

    def _compute(self, node: cst.CSTNode, name: str) -> str | None:
        if isinstance(node, cst.Call):
            return next(
                (
                    w
                    for x in node.args
                    if not self._flag(x.value) and (w := self.source(x.value))
                ),
                None,
            )
        if isinstance(node, cst.For):
            if id(node) in self.seeds:
                if any(
                    id(el) in self.index_targets and dotted(el) == name
                    for el in _flatten(node.target)
                ):
                    return None
                return self.seeds[id(node)]
            why = self.source(node.iter)
        else:
            value = getattr(node, "value", None)
            why = self.source(value) if value is not None else None
            if why is None and isinstance(node, cst.AugAssign):
                why = self.source(node.target)
        if why is None:
            for test, _ in self.f.reach.conditions(node):
                why = self.source(test)
                if why:
                    break
        return why

    def _lookup(self, node: cst.CSTNode, name: str) -> str | None:
        a, f = self.a, self.f
        if name.startswith("self.") and name.count(".") == 1:
            return next(
                (
                    w
                    for b in self.attr_sites.get(name, [])[:12]
                    if b is not node and (w := self._binding_why(b, name))
                ),
                None,
            )
        fn = a.function_of(node)
        at = f.order(node)
        for scope in (fn, None) if fn is not None else (None,):
            sites = self.sites.get((id(scope), name))
            if not sites:
                continue
            if (
                scope is not fn
            ):  # a module-level name read in a function: any of its values
                return next(
                    (w for _, b in sites if (w := self._binding_why(b, name))), None
                )
            before = [(o, b) for o, b in sites if o < at]
            if before and any(
                before[-1][0] < r < at for r in self.reduced.get((id(fn), name), [])
            ):
                return None  # all-reduced (or broadcast) since it was computed
            chosen = [b for _, b in before[-1:]]
            loop = a.enclosing_loop(node)
            while (
                loop is not None
            ):  # bindings later in the loop reach this read at the next iteration
                end = a._subtree_end(loop)
                chosen += [b for o, b in sites if at < o < end]
                loop = a.enclosing_loop(loop)
            return next((w for b in chosen if (w := self._binding_why(b, name))), None)
        return None

    def _return_why(self, name: str) -> str | None:
        if name in self._returns:
            return self._returns[name]
        self._returns[name] = None
        a = self.a
        why = None
        if name not in self.f.reduced_in_functions():
            for fn in a.functions.get(name, [])[:3]:
                why = next(
                    (
                        w
                        for r in a.findall(fn, m.Return())
                        if r.value is not None
                        and a.function_of(r) is fn
                        and (w := self.source(r.value))
                    ),
                    None,
                )
                if why:
                    break
        self._returns[name] = why
        return why

    def _flag(self, node: cst.CSTNode) -> bool:
        """A rank-0 test handed to a function (`log_info=is_primary(args)`): it chooses who logs,
        not what is computed."""
        v = self.f.ranks.values(node)
        return self.f.ranks.depends(node) and all(
            isinstance(x, bool) for x in v if x is not UNK
        )

    def source(self, node: cst.CSTNode, depth: int = 0) -> str | None:
        """Why node's value is this rank's own (None: the same on every rank, as far as is seen)."""
        a, f = self.a, self.f
        if depth > 12 or node is None:
            return None
        if isinstance(node, (cst.Name, cst.Attribute)):
            d = dotted(node)
            if d is not None:
                if (
                    isinstance(node, cst.Attribute)
                    and node.attr.value in SAME_ON_EVERY_RANK
                ):
                    return None
                if (
                    f.wrapper(node) is not None
                    or a.is_model_ref(node)
                    or d in a.optimizers
                ):
                    return None  # the model is the same on every rank (it may sit on the rank's own device)
                why = self._lookup(node, d)
                if why:
                    return why
                if f.ranks.depends(node):
                    return f"{d} is the rank"
                if isinstance(node, cst.Name):
                    return None
                if isinstance(node.value, cst.Name) and OPTIONS.match(node.value.value):
                    return None  # args.val_interval: an option, the same on every rank
                return self.source(node.value, depth + 1)
        if isinstance(node, cst.Call):
            callee = (dotted(node.func) or "").rsplit(".", 1)[-1]
            if (
                callee in SAME_ON_EVERY_RANK
                or f.own_call(node) in f.reduced_in_functions()
                or callee in PLACEMENT
            ):
                return (
                    None
                    if callee not in PLACEMENT
                    else self.source(node.func.value, depth + 1)
                )  # type: ignore[attr-defined]
            if a.is_call(node, "torch.device"):
                return None
            if f.own_call(node):
                why = self._return_why(callee)
                if why:
                    return f"{callee}() returns a value computed from {why}"
            for x in node.args:
                if not (
                    x.keyword is not None and x.keyword.value in DEVICE_ARGS
                ) and not self._flag(x.value):
                    why = self.source(x.value, depth + 1)
                    if why:
                        return why
            return self.source(node.func, depth + 1)
        for kid in a.kids.get(id(node), []):
            why = self.source(kid, depth + 1)
            if why:
                return why
        return None


def _flatten(t: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(t, (cst.Tuple, cst.List)):
        return [x for el in t.elements for x in _flatten(el.value)]
    if isinstance(t, cst.StarredElement):
        return _flatten(t.value)
    return [t]
