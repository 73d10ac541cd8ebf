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
