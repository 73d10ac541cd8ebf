"""find_unused_parameters=False (the default) while some parameters get no gradient in a step:
a submodule forward never reaches, one used only under an `if`, or outputs of the training
forward thrown away. DDP then fails at the second step ("Expected to have finished reduction in
the prior iteration")."""

from __future__ import annotations

import re

import libcst as cst

import ddpify.match as m
from ddpify.analysis.gradients import discarded_outputs, unused_parameters
from ddpify.analysis.tree import call_args, code, dotted
from ddpify.rules import declare

declare(
    "DDP260",
    "unused-parameters-without-flag",
    'some parameters get no gradient in a training step while DDP runs with find_unused_parameters=False: the second step raises "Expected to have finished reduction in the prior iteration"',
    severity="blocking",
    tool="lint",
)


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    for w in f.ddp_wraps:
        _, kw = call_args(w.call)
        flag = kw.get("find_unused_parameters")
        if flag is not None and not m.matches(flag.value, m.Name("False")):
            continue
        if "static_graph" in kw and not m.matches(
            kw["static_graph"].value, m.Name("False")
        ):
            continue
        why: list[str] = []
        bind = f.wrapped_call(w)
        if bind is not None:
            why = [
                r
                for r in unused_parameters(a, bind, used=_read_outside(a, w))
                if "no_grad" not in r and not _not_a_module(a, r)
            ]
        if not why and w.target:
            thrown = discarded_outputs(a, w.target)
            if thrown:
                why = [
                    f"`{code(a.statement(thrown[0])).strip()}` throws away outputs of the training forward, so the parameters behind them get no gradient"
                ]
        if not why and w.target and bind is not None:
            why = _outputs_never_in_loss(ctx, w, bind)
        if why:
            ctx.report(
                w.call,
                "DDP260",
                f'{why[0]}, and DDP runs with find_unused_parameters=False: the second step raises "Expected to have finished reduction in the prior iteration"; pass find_unused_parameters=True (or make every parameter take part in the loss)',
            )


def _read_outside(a, w) -> set[str]:
    """Attributes of the wrapped model read by name outside its forward (`model.log_vars[i]`,
    `ddp.module.temperature` in the loss, in a function that calls backward()): such a
    parameter gets its gradient through the loss, so DDP's hook fires for it all the same."""
    args, _ = call_args(w.call)
    names = {n for n in ((dotted(args[0].value) if args else None),) if n}
    if w.target:
        names.add(f"{w.target}.module")
    out = set()
    for node in a.findall(a.module, m.Attribute()):
        d = dotted(node) or ""
        for n in names:
            if (
                d.startswith(n + ".")
                and not isinstance(a.parent.get(node), cst.Call)
                and ".backward(" in code(a.function_of(node) or a.module)
            ):
                out.add("self." + d[len(n) + 1 :].split(".")[0])
    return out


def _not_a_module(a, reason: str) -> bool:
    """The attribute a reason names holds no parameters: `self.init_rng = torch.Generator()`,
    a plain tensor, a number."""
    mo = re.match(r"^`?(self\.\w+)", reason)
    if not mo:
        return False
    values = [
        asg.value
        for asg in a.assigns
        if isinstance(asg, cst.Assign)
        and any(dotted(t.target) == mo.group(1) for t in asg.targets)
    ]
    return bool(values) and all(
        isinstance(v, cst.Call)
        and (
            a.qualified(v.func)
            & {
                "torch.Generator",
                "torch.tensor",
                "torch.zeros",
                "torch.ones",
                "torch.empty",
            }
        )
        for v in values
    )


def _outputs_never_in_loss(ctx, w, bind) -> list[str]:
    """`logits, aux = model(x)` before a backward, `aux` never read afterwards, where the
    class's forward returns that output straight from a submodule of its own (`return
    self.head(h), self.aux_head(h)`) that nothing else in forward calls: that submodule's
    parameters get no gradient."""
    a = ctx.a
    heads = _returned_heads(a, bind)
    if not heads:
        return []
    for step in a.steps:
        fn = a.function_of(step.stmt)
        body = list(step.block.body)  # type: ignore[attr-defined]
        for s in body[: body.index(step.stmt)]:
            for c in a.findall(s, m.Call()):
                par = a.parent.get(c)
                if dotted(c.func) != w.target or not isinstance(par, cst.Assign):
                    continue
                target = par.targets[0].target
                if not isinstance(target, (cst.Tuple, cst.List)):
                    continue
                for i, el in enumerate(target.elements):
                    head = heads.get(i)
                    if head is None or not isinstance(el.value, cst.Name):
                        continue
                    name = el.value.value
                    if name.strip("_") and _read_after(a, fn or a.module, name, par):
                        continue
                    return [
                        f"`{name}` (output {i + 1} of {w.target}'s forward, `{head}`) never reaches the loss, so {head.split('(')[0]}'s parameters get no gradient"
                    ]
    return []


def _returned_heads(a, bind) -> dict[int, str]:
    """{position: `self.x(...)`} for the tuple forward returns, where self.x is called nowhere
    else in forward."""
    cls = next(
        (
            a.classes[n]
            for c in a.findall(bind, m.Call())
            if (n := (dotted(c.func) or "").rsplit(".", 1)[-1]) in a.classes
        ),
        None,
    )
    if cls is None:
        return {}
    forward = next(
        (
            f
            for f in cls.body.body
            if isinstance(f, cst.FunctionDef) and f.name.value == "forward"
        ),
        None,
    )
    if forward is None:
        return {}
    out: dict[int, str] = {}
    text = code(forward)
    for ret in a.findall(forward, m.Return()):
        if not isinstance(ret.value, cst.Tuple):
            continue
        for i, el in enumerate(ret.value.elements):
            v = el.value
            if isinstance(v, cst.Call) and (dotted(v.func) or "").startswith("self."):
                attr = dotted(v.func)
                if len(re.findall(re.escape(attr) + r"\b", text)) == 1:
                    out[i] = code(v).strip()
    return out


def _read_after(a, scope, name: str, stmt) -> bool:
    """The name is read in scope after stmt."""
    end = a._subtree_end(stmt)
    return any(
        n.value == name and a._order.get(id(n), -1) > end
        for n in a.findall(scope, m.Name())
    )
