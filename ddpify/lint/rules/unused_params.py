"""find_unused_parameters=False (the default) while some parameters get no gradient in a step:
a submodule forward never reaches, one used only under an `if`, or outputs of the training
forward thrown away. DDP then fails at the second step ("Expected to have finished reduction in
the prior iteration")."""

from __future__ import annotations

import ddpify.match as m
from ddpify.analysis.gradients import discarded_outputs, unused_parameters
from ddpify.analysis.tree import call_args, code
from ddpify.rules import declare

declare("DDP260", "unused-parameters-without-flag", "some parameters get no gradient in a training step while DDP runs with find_unused_parameters=False: the second step raises \"Expected to have finished reduction in the prior iteration\"", severity="blocking", tool="lint")


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    for w in f.ddp_wraps:
        _, kw = call_args(w.call)
        flag = kw.get("find_unused_parameters")
        if flag is not None and not m.matches(flag.value, m.Name("False")):
            continue
        if "static_graph" in kw and not m.matches(kw["static_graph"].value, m.Name("False")):
            continue
        why: list[str] = []
        bind = f.wrapped_call(w)
        if bind is not None:
            why = [r for r in unused_parameters(a, bind) if "no_grad" not in r]
        if not why and w.target:
            thrown = discarded_outputs(a, w.target)
            if thrown:
                why = [f"`{code(a.statement(thrown[0])).strip()}` throws away outputs of the training forward, so the parameters behind them get no gradient"]
        if why:
            ctx.report(w.call, "DDP260", f"{why[0]}, and DDP runs with find_unused_parameters=False: the second step raises \"Expected to have finished reduction in the prior iteration\"; pass find_unused_parameters=True (or make every parameter take part in the loss)")
