"""Training steps: each backward pass with its loss, the statement that first runs the model,
the optimizer steps that follow (also after a micro-batch loop), an accumulation test, and the
models forwarded in the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import ddpify.match as m
from ddpify.analysis.tree import _flatten_targets, _in_orelse, code, dotted


@dataclass
class Step:
    """One backward pass and what surrounds it in its block."""

    backward: cst.Call
    stmt: cst.BaseStatement  # statement holding the backward
    block: cst.CSTNode  # IndentedBlock/Module holding stmt
    loss_expr: cst.BaseExpression
    forward_first: cst.BaseStatement | None = None  # first statement running the model
    loss_stmt: cst.BaseStatement | None = None  # statement computing the loss
    step_calls: list[cst.Call] = field(
        default_factory=list
    )  # optimizer.step() calls in the block
    step_stmts: list[cst.BaseStatement] = field(
        default_factory=list
    )  # top-level stmts holding them
    accumulation_test: cst.BaseExpression | None = None  # `if C: optimizer.step()` -> C
    models: list[str] = field(default_factory=list)  # model names forwarded in the step
    tail: list[cst.BaseStatement] = field(
        default_factory=list
    )  # backward and what follows, up to the step


class StepsMixin:
    def _find_steps(self) -> list[Step]:
        steps: list[Step] = []
        for call in self.calls:
            if not (
                isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "backward"
            ):
                continue
            if self.is_call(call, "torch.autograd.backward"):
                continue
            stmt, loss_expr = self._step_unit(call)
            block = self.block(stmt)
            if not isinstance(block, (cst.IndentedBlock, cst.Module)) or any(
                s.stmt is stmt for s in steps
            ):
                continue
            step = Step(backward=call, stmt=stmt, block=block, loss_expr=loss_expr)
            body = list(block.body)
            idx = body.index(stmt)
            loss_name = dotted(loss_expr)
            for s in reversed(body[:idx]):
                if loss_name and self._assigns(s, loss_name):
                    step.loss_stmt = s
                    break
            # the forward pass of this step starts after the previous backward in the block
            start = 0
            for k in range(idx - 1, -1, -1):
                if self.findall(
                    body[k], m.Call(func=m.Attribute(attr=m.Name("backward")))
                ):
                    start = k + 1
                    break
            for s in body[start:idx]:
                if self.runs_model(s):
                    step.forward_first = s
                    break
            if step.forward_first is None and self.runs_model(stmt):
                step.forward_first = stmt
            later = body[idx + 1 :]
            stop = next(
                (
                    k
                    for k, s in enumerate(later)
                    if self.findall(
                        s, m.Call(func=m.Attribute(attr=m.Name("backward")))
                    )
                ),
                len(later),
            )
            step.tail = [stmt, *later[:stop]]
            self._collect_step_calls(step, step.tail)
            if not step.step_calls:
                self._micro_loop_step(step)
            region = (
                body[body.index(step.forward_first) : idx + 1]
                if step.forward_first in body
                else [stmt]
            )
            for s in region:
                for c in self.findall(s, m.Call()):
                    if self._is_forward_call(c):
                        n = dotted(c.func)
                        if n and n not in step.models:
                            step.models.append(n)
            steps.append(step)
        return steps

    def _step_unit(
        self, call: cst.Call
    ) -> tuple[cst.BaseStatement, cst.BaseExpression]:
        """The statement that stands for a backward in its block, and the loss it computes the
        gradients of. apex: `with amp.scale_loss(loss, opt) as scaled: scaled.backward()` is the
        backward of `loss`, also as one branch of `if fp16: <that> else: loss.backward()`."""
        stmt = self.statement(call)
        loss = call.func.value
        scaled = self._scale_loss_with(stmt)
        if scaled is not None:
            stmt, loss = scaled
        owner = self.parent.get(self.parent.get(stmt))
        if isinstance(owner, cst.Else):
            owner = self.parent.get(owner)
        if (
            isinstance(owner, cst.If)
            and isinstance(owner.orelse, cst.Else)
            and _single(owner.body)
            and _single(owner.orelse.body)
        ):
            branches = [owner.body.body[0], owner.orelse.body.body[0]]
            withs = [self._scale_loss_with_of(b) for b in branches]
            plain = [_plain_backward(b) for b in branches]
            for w, p in ((withs[0], plain[1]), (withs[1], plain[0])):
                if w is not None and p is not None and code(p) == code(w[1]):
                    return owner, w[1]
        return stmt, loss

    def _scale_loss_with(
        self, stmt: cst.BaseStatement
    ) -> tuple[cst.With, cst.BaseExpression] | None:
        """(the with, the loss) when stmt is in the body of `with X.scale_loss(loss, ...) as s:`."""
        block = self.block(stmt)
        w = self.parent.get(block) if isinstance(block, cst.IndentedBlock) else None
        return self._scale_loss_with_of(w) if isinstance(w, cst.With) else None

    @staticmethod
    def _scale_loss_with_of(
        w: cst.CSTNode,
    ) -> tuple[cst.With, cst.BaseExpression] | None:
        if not isinstance(w, cst.With) or len(w.items) != 1:
            return None
        item = w.items[0].item
        if (
            isinstance(item, cst.Call)
            and isinstance(item.func, cst.Attribute)
            and item.func.attr.value == "scale_loss"
            and item.args
            and item.args[0].keyword is None
        ):
            return w, item.args[0].value
        return None

    def _collect_step_calls(self, step: Step, stmts: list[cst.BaseStatement]) -> None:
        for s in stmts:
            for c in self.findall(s, m.Call(func=m.Attribute(attr=m.Name("step")))):
                if self.is_optimizer_ref(c.func.value):  # type: ignore[attr-defined]
                    step.step_calls.append(c)
                    if s not in step.step_stmts:
                        step.step_stmts.append(s)
                    if (
                        isinstance(s, cst.If)
                        and step.accumulation_test is None
                        and self.ancestor(c, cst.If) is s
                    ):
                        step.accumulation_test = s.test

    def _micro_loop_step(self, step: Step) -> None:
        """for micro in range(N): ...; loss.backward()  then optimizer.step() after the loop."""
        loop = self.parent.get(step.block)
        if not isinstance(loop, cst.For) or _in_orelse(self, step.stmt, loop):
            return
        outer = self.block(loop)
        if not isinstance(outer, (cst.IndentedBlock, cst.Module)):
            return
        body = list(outer.body)
        later = body[body.index(loop) + 1 :]
        stop = next(
            (
                k
                for k, s in enumerate(later)
                if self.findall(s, m.Call(func=m.Attribute(attr=m.Name("backward"))))
            ),
            len(later),
        )
        self._collect_step_calls(step, later[:stop])
        if not step.step_calls:
            return
        step.tail = [*step.tail, *later[:stop]]
        step.accumulation_test = None
        it = loop.iter
        if (
            isinstance(loop.target, cst.Name)
            and m.matches(it, m.Call(func=m.Name("range")))
            and len(it.args) == 1  # type: ignore[attr-defined]
            and it.args[0].keyword is None  # type: ignore[attr-defined]
        ):
            # the last micro-step is the one whose gradients the optimizer uses
            n = it.args[0].value  # type: ignore[attr-defined]
            step.accumulation_test = cst.parse_expression(
                f"{loop.target.value} == {code(n)} - 1"
            )

    def _assigns(self, stmt: cst.BaseStatement, name: str) -> bool:
        for node in self.findall(stmt, m.Assign() | m.AugAssign() | m.AnnAssign()):
            targets = (
                [t.target for t in node.targets]
                if isinstance(node, cst.Assign)
                else [node.target]
            )
            for t in targets:
                if any(dotted(el) == name for el in _flatten_targets(t)):
                    return True
        return False


def _single(block: cst.BaseSuite) -> bool:
    return isinstance(block, cst.IndentedBlock) and len(block.body) == 1


def _plain_backward(stmt: cst.BaseStatement) -> cst.BaseExpression | None:
    """loss in a statement that is only `loss.backward()`."""
    if (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
    ):
        v = stmt.body[0].value
        if (
            isinstance(v, cst.Call)
            and isinstance(v.func, cst.Attribute)
            and v.func.attr.value == "backward"
            and not v.args
        ):
            return v.func.value
    return None
