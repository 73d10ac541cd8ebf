"""The converted benchmark scripts' step path has no collective and no host sync that the same
script made distributed by hand (bench/gpu/*_ddp_handwritten.py) does not have.

The step path is the training loop (the outermost loop around the backward in main()) and the
functions of the program it calls, followed through calls by name and through methods of the
objects the loop's function builds (`timer = StepTimer(...)`: `timer.step()`), plus the hook
the output registers on every optimizer step (ddp_check_sync), whose work after its
first-step guard does not count. What is counted: torch.distributed collectives, `.item()`,
`.tolist()`, `.cpu()`, `.numpy()`, `float(...)` of a non-literal, and synchronize calls.
"""

from __future__ import annotations

import ast
import collections
import shutil
from pathlib import Path

import pytest

from ddpify import Options
from ddpify.project import convert_projects

ROOT = Path(__file__).resolve().parent.parent
GPU = ROOT / "bench" / "gpu"
COLLECTIVES = {
    "all_reduce",
    "broadcast",
    "barrier",
    "all_gather",
    "all_gather_into_tensor",
    "reduce",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "broadcast_object_list",
    "all_gather_object",
    "monitored_barrier",
}
HOST_READS = {"item", "tolist", "cpu", "numpy", "synchronize"}


class StepPath:
    """Events on the step path of a program given as {file name: text}."""

    def __init__(self, files: dict[str, str], entry: str) -> None:
        self.trees = {name: ast.parse(text) for name, text in files.items()}
        self.functions: dict[str, list[ast.FunctionDef]] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        for tree in self.trees.values():
            for node in tree.body:
                if isinstance(node, ast.FunctionDef):
                    self.functions.setdefault(node.name, []).append(node)
                elif isinstance(node, ast.ClassDef):
                    self.classes[node.name] = node
        self.entry = self.trees[entry]

    def loop(self) -> ast.AST:
        """The outermost loop of main() that holds a backward."""
        main = next(f for f in self.functions["main"] if f in self.entry.body)
        for node in ast.walk(main):
            if isinstance(node, (ast.For, ast.While)) and any(
                isinstance(c, ast.Call)
                and isinstance(c.func, ast.Attribute)
                and c.func.attr == "backward"
                for c in ast.walk(node)
            ):
                return node
        raise AssertionError("no training loop in main()")

    def events(self) -> collections.Counter:
        main = next(f for f in self.functions["main"] if f in self.entry.body)
        instances = {  # timer = StepTimer(...): the class of the objects main() builds
            t.id: v.func.id
            for n in ast.walk(main)
            if isinstance(n, ast.Assign)
            and isinstance(v := n.value, ast.Call)
            and isinstance(v.func, ast.Name)
            and v.func.id in self.classes
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        found: collections.Counter = collections.Counter()
        hook = [f for fs in self.functions.values() for f in fs if self._hooked(f)]

        def count(stmts: list[ast.stmt], cls: str | None, stack: tuple) -> None:
            # a helper counts once for each place that calls it
            for stmt in stmts:
                for node in ast.walk(stmt):
                    if isinstance(node, ast.Call):
                        found.update(self._kind(node))
                        for fn, owner in self._callees(node, cls, instances):
                            if fn not in stack:
                                count(fn.body, owner, stack + (fn,))

        count([self.loop()], None, ())
        for f in hook:
            count(self._after_first_step(f), None, (f,))
        return found

    def _kind(self, call: ast.Call) -> list[str]:
        f = call.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name in COLLECTIVES and isinstance(f, ast.Attribute):
            return [f"collective {name}"]
        if name in HOST_READS and isinstance(f, ast.Attribute):
            return [f"host read .{name}()"]
        if (
            name == "float"
            and isinstance(f, ast.Name)
            and call.args
            and not isinstance(call.args[0], ast.Constant)
        ):
            return ["host read float()"]
        return []

    def _callees(self, call: ast.Call, cls: str | None, instances: dict[str, str]):
        f = call.func
        if isinstance(f, ast.Name):
            return [(fn, None) for fn in self.functions.get(f.id, [])]
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            owner = cls if f.value.id == "self" else instances.get(f.value.id)
            if owner in self.classes:
                return [
                    (m, owner)
                    for m in self.classes[owner].body
                    if isinstance(m, ast.FunctionDef) and m.name == f.attr
                ]
        return []

    def _hooked(self, fn: ast.FunctionDef) -> bool:
        """fn is registered to run at every optimizer step."""
        return any(
            isinstance(c, ast.Call)
            and getattr(c.func, "id", getattr(c.func, "attr", "")).startswith(
                "register_optimizer_step"
            )
            and any(isinstance(a, ast.Name) and a.id == fn.name for a in c.args)
            for tree in self.trees.values()
            for c in ast.walk(tree)
        )

    @staticmethod
    def _after_first_step(fn: ast.FunctionDef) -> list[ast.stmt]:
        """What fn runs at every step: the body up to a guard `if <checked>: return` that the
        next statement makes true for good (`optimizer.ddp_checked = True`); all of it if no
        such guard opens it."""
        body = [s for s in fn.body if not isinstance(s, ast.Expr)]  # the docstring
        for i, s in enumerate(body[:-1]):
            if (
                isinstance(s, ast.If)
                and len(s.body) == 1
                and isinstance(s.body[0], ast.Return)
                and isinstance(nxt := body[i + 1], ast.Assign)
                and isinstance(nxt.value, ast.Constant)
                and nxt.value.value is True
                and ast.unparse(nxt.targets[0]).split(".")[-1] in ast.unparse(s.test)
            ):
                return body[: i + 1]
        return fn.body


def convert(tmp: Path, model: str, timer_done: str | None = None) -> dict[str, str]:
    """The converted <model>_single.py and benchmodels.py (its `done` rewritten to
    timer_done where given), as the GPU benchmark converts them."""
    work = tmp / model
    work.mkdir()
    shutil.copy(GPU / f"{model}_single.py", work / f"{model}_single.py")
    models = (GPU / "benchmodels.py").read_text()
    if timer_done is not None:
        old = "return self.count >= self.warmup + self.steps"
        assert old in models
        models = models.replace(old, timer_done)
    (work / "benchmodels.py").write_text(models)
    (result,) = convert_projects([(str(work / f"{model}_single.py"), Options())])
    assert result.status == "converted", result.status
    return {Path(r.path).name: r.output for r in result.files}


def handwritten(model: str) -> dict[str, str]:
    return {
        f"{model}_ddp_handwritten.py": (
            GPU / f"{model}_ddp_handwritten.py"
        ).read_text(),
        "benchmodels.py": (GPU / "benchmodels.py").read_text(),
    }


@pytest.mark.parametrize("model", ["cnn", "gpt", "text"])
def test_step_path_has_nothing_hand_written_ddp_lacks(tmp_path, model):
    out = convert(tmp_path, model)
    ours = StepPath(out, f"{model}_single.py").events()
    theirs = StepPath(handwritten(model), f"{model}_ddp_handwritten.py").events()
    extra = ours - theirs
    assert not extra, f"{model}: the output's step path adds {dict(extra)}"
    # the decision to stop reads a step count: the same on every rank, so nothing is shared
    assert "rank0_decides(" not in out[f"{model}_single.py"]
    # the first-step gradient check is the one hook on the step path
    assert "register_optimizer_step_pre_hook(ddp_check_sync)" in "".join(out.values())


def test_step_path_sees_a_shared_decision(tmp_path):
    """The check can fail: a timer whose `done` reads the clock differs per rank, so the
    output shares its decision every step (a collective hand-written DDP does not have)."""
    out = convert(tmp_path, "gpt", "return time.time() - self.created_at > 60")
    ours = StepPath(out, "gpt_single.py").events()
    theirs = StepPath(handwritten("gpt"), "gpt_ddp_handwritten.py").events()
    assert (ours - theirs)["collective broadcast"] == 2
    # shared on the CPU, over gloo: no CUDA tensor read back every step
    assert "DECISION = torch.zeros(1, dtype=torch.long)\n" in out["gpt_single.py"]


def test_first_step_guard_is_recognised():
    text = (
        "def ddp_check_sync(optimizer, args, kwargs):\n"
        '    """doc"""\n'
        '    if getattr(optimizer, "ddp_checked", False):\n'
        "        return\n"
        "    optimizer.ddp_checked = True\n"
        "    x = float(g.sum())\n"
    )
    fn = ast.parse(text).body[0]
    assert [ast.unparse(s) for s in StepPath._after_first_step(fn)] == [
        "if getattr(optimizer, 'ddp_checked', False):\n    return"
    ]
    # without the guard, every statement runs at every step
    unguarded = ast.parse(text.replace("ddp_checked = True", "seen = 1")).body[0]
    assert StepPath._after_first_step(unguarded) == unguarded.body
