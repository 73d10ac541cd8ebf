"""Checkpoints whose keys do not fit where they are loaded: a state dict saved from the DDP
wrapper (keys start with `module.`) loaded into the plain module, or the reverse; and the
wrapper itself pickled (loading the file needs an initialised process group)."""

from __future__ import annotations

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import call_args, code, dotted
from ddpify.rules import declare

declare(
    "DDP250",
    "checkpoint-prefix-mismatch",
    "a state dict saved from the DDP wrapper (keys `module.*`) is loaded into the plain module, or the reverse: load_state_dict raises on the missing and unexpected keys",
    severity="blocking",
    tool="lint",
)
declare(
    "DDP252",
    "loose-load-matches-nothing",
    "load_state_dict(..., strict=False) of a checkpoint saved from the DDP wrapper (keys `module.*`) into the plain module, or the reverse: no key matches, nothing is loaded and no error is raised; the run resumes (or fine-tunes) from random weights",
    severity="blocking",
    tool="lint",
)
declare(
    "DDP251",
    "checkpoint-pickles-wrapper",
    "the DDP wrapper itself is saved (pickled): loading the file needs an initialised process group, and every other consumer breaks; save model.module (or its state_dict())",
    severity="blocking",
    tool="lint",
)


def check(ctx) -> None:
    a, f = ctx.a, ctx.facts
    if not f.ddp_wraps:
        return
    saves: list[tuple[str | None, str, cst.CSTNode]] = []
    for c in a.calls:
        if not a.is_call(c, "torch.save"):
            continue
        pos, kw = call_args(c)
        obj = pos[0].value if pos else kw["obj"].value if "obj" in kw else None
        for key, kind, node in _saved(ctx, obj, None, 0):
            if kind == "wrapper-object":
                ctx.report(
                    node,
                    "DDP251",
                    f'torch.save pickles the DDP wrapper {code(node)}: loading the file needs an initialised process group ("Default process group has not been initialized"), so resuming and every other consumer break; save {code(node)}.module, or better {code(node)}.module.state_dict()',
                )
            else:
                saves.append((key, kind, node))
    if not saves or _handles_prefix(ctx):
        return
    for c in a.calls:
        if (
            not isinstance(c.func, cst.Attribute)
            or c.func.attr.value != "load_state_dict"
            or not c.args
        ):
            continue
        into = _kind(ctx, c.func.value)
        if into is None:
            continue
        key = _loaded_key(ctx, c.args[0].value)
        if key is False:
            continue  # not from torch.load
        for skey, skind, snode in saves:
            if key is not None and skey is not None and key != skey:
                continue
            if key is None and skey is not None and _whole_file(ctx, c.args[0].value):
                continue  # the file loaded is a state dict itself; that save wrote a dict around one
            if (skind == "wrapper-state") != (into == "wrapper") and _loose(c):
                saved = (
                    "the DDP wrapper (keys start with `module.`)"
                    if skind == "wrapper-state"
                    else "the plain module (no `module.` prefix)"
                )
                ctx.report(
                    c,
                    "DDP252",
                    f"{code(c.func.value)}.load_state_dict(..., strict=False) loads a state dict saved from {saved} (`{code(snode)}`) into {'the plain module' if into == 'plain' else 'the DDP wrapper'}: no key matches, so nothing is loaded and no error is raised, and training goes on from the initial weights; save model.module.state_dict() (or strip the prefix) and load with strict=True",
                )
                break
            if (skind == "wrapper-state") != (into == "wrapper"):
                saved = (
                    "the DDP wrapper (keys start with `module.`)"
                    if skind == "wrapper-state"
                    else "the plain module (no `module.` prefix)"
                )
                target = (
                    "the plain module"
                    if into == "plain"
                    else "the DDP wrapper, which expects `module.` keys"
                )
                ctx.report(
                    c,
                    "DDP250",
                    f"{code(c.func.value)}.load_state_dict(...) loads into {target}, but the checkpoint's state dict was saved from {saved} (`{code(snode)}`): the keys do not match and load_state_dict raises; save model.module.state_dict() and load into the plain module (or strip the prefix)",
                )
                break


def _whole_file(ctx, expr) -> bool:
    """The loaded value is torch.load(...)'s result itself (not an entry of it)."""
    return any(
        isinstance(v, cst.Call) and ctx.a.is_call(v, "torch.load")
        for v in ctx.facts.sources(expr)
    )


def _loose(call: cst.Call) -> bool:
    _, kw = call_args(call)
    return "strict" in kw and m.matches(kw["strict"].value, m.Name("False"))


def _kind(ctx, node: cst.BaseExpression) -> str | None:
    """ "wrapper", "plain" (a model, or model.module), or None (not a model seen here)."""
    f, a = ctx.facts, ctx.a
    if f.wrapper(node) is not None or _copy_of_wrapper(ctx, node):
        return "wrapper"
    d = dotted(node) or ""
    if (
        d.endswith(".module")
        and f.wrapper(node.value) is None
        and f.plain_of(node) is None
    ):  # type: ignore[attr-defined]
        return None  # the `.module` of an object of the script (an EMA holder): see _copy_of_wrapper
    if d.endswith(".module") or f.plain_of(node) is not None:
        return "plain"
    if d and (
        d in a.models or a.is_model_ref(node) or any(w.inner == d for w in f.ddp_wraps)
    ):
        return "plain"
    if isinstance(node, cst.Name) and _builds_module(ctx, node):
        return "plain"
    return None


def _builds_module(ctx, node: cst.Name) -> bool:
    """The name holds a module the script builds: `net = Net()`, `m = make_model()` (a function
    returning one), `m = nn.Sequential(...)`."""
    a = ctx.a
    fn = a.function_of(node)
    values = (
        a._local_values(fn, node.value)
        if fn is not None and a._is_local(fn, node.value)
        else a._local_values(None, node.value)
    )
    for v in values[:4]:
        if not isinstance(v, cst.Call):
            continue
        if any(
            q.startswith(("torch.nn.", "torchvision.models."))
            for q in a.qualified(v.func)
        ):
            return True
        name = (dotted(v.func) or "").rsplit(".", 1)[-1]
        cls = a.classes.get(name)
        if cls is not None and any(
            "Module" in (dotted(b.value) or "") for b in cls.bases
        ):
            return True
        for g in a.functions.get(name, [])[:2]:
            for r in a.findall(g, m.Return()):
                if isinstance(r.value, cst.Call) and any(
                    q.startswith("torch.nn.") for q in a.qualified(r.value.func)
                ):
                    return True
    return False


def _copy_of_wrapper(ctx, node, depth: int = 0) -> bool:
    """node holds a copy of the DDP wrapper: `copy.deepcopy(ddp)`, or the attribute of an object of
    the script (an EMA, a teacher) that its constructor set to a copy of the wrapper it was given."""
    a, f = ctx.a, ctx.facts
    if node is None or depth > 4:
        return False
    if isinstance(node, cst.Call) and a.is_call(node, "copy.deepcopy") and node.args:
        arg = node.args[0].value
        return f.wrapper(arg) is not None or _copy_of_wrapper(ctx, arg, depth + 1)
    if isinstance(node, cst.Name):
        fn = a.function_of(node)
        values = (
            a._local_values(fn, node.value)
            if fn is not None and a._is_local(fn, node.value)
            else a._local_values(None, node.value)
        )
        return any(_copy_of_wrapper(ctx, v, depth + 1) for v in values[:4])
    if isinstance(node, cst.Attribute) and isinstance(
        node.value, (cst.Name, cst.Attribute)
    ):
        holder = node.value
        fn = a.function_of(node)
        name = dotted(holder)
        values = (
            a._local_values(fn, name)
            if fn is not None and name and "." not in name and a._is_local(fn, name)
            else a._local_values(None, name or "")
        )
        for v in values[:4]:
            if not isinstance(v, cst.Call):
                continue
            cls = a.classes.get((dotted(v.func) or "").rsplit(".", 1)[-1])
            init = (
                next(
                    (
                        g
                        for g in a.functions.get("__init__", [])
                        if a.class_of(g) is cls
                    ),
                    None,
                )
                if cls is not None
                else None
            )
            if init is None:
                continue
            for asg in a.findall(init, m.Assign()):
                if any(
                    dotted(t.target) == f"self.{node.attr.value}" for t in asg.targets
                ):
                    val = asg.value
                    if (
                        isinstance(val, cst.Call)
                        and a.is_call(val, "copy.deepcopy")
                        and val.args
                    ):
                        arg = dotted(val.args[0].value)
                        try:
                            given = a.argument_for(v, init, arg) if arg else None
                        except ValueError:
                            given = None
                        if given is not None and (
                            f.wrapper(given) is not None
                            or _copy_of_wrapper(ctx, given, depth + 1)
                        ):
                            return True
    return False


def _saved(ctx, obj, key, depth):
    """(dict key, kind, node) for each model state the saved object holds."""
    a, f = ctx.a, ctx.facts
    if obj is None or depth > 4:
        return []
    out = []
    if isinstance(
        obj, cst.IfExp
    ):  # `model.module.state_dict() if ddp else model.state_dict()`
        arms = _saved(ctx, obj.body, key, depth + 1) + _saved(
            ctx, obj.orelse, key, depth + 1
        )
        plain = [x for x in arms if x[1] == "plain-state"]
        return plain or arms
    if isinstance(obj, cst.Dict):
        for el in obj.elements:
            if isinstance(el, cst.DictElement):
                k = (
                    el.key.evaluated_value
                    if isinstance(el.key, cst.SimpleString)
                    else None
                )
                out += _saved(ctx, el.value, k, depth + 1)
        return out
    if (
        isinstance(obj, cst.Call)
        and isinstance(obj.func, cst.Attribute)
        and obj.func.attr.value == "state_dict"
    ):
        kind = _kind(ctx, obj.func.value)
        if kind is not None:
            out.append((key, f"{kind}-state", obj))
        return out
    if isinstance(obj, cst.Call) and dotted(obj.func) == "dict":
        for x in obj.args:
            if x.keyword is not None:
                out += _saved(ctx, x.value, x.keyword.value, depth + 1)
        return out
    if f.wrapper(obj) is not None:
        return [(key, "wrapper-object", obj)]
    if isinstance(obj, cst.Name):
        fn = a.function_of(obj)
        values = (
            a._local_values(fn, obj.value)
            if fn is not None and a._is_local(fn, obj.value)
            else a._local_values(None, obj.value)
        )
        for v in values:
            out += _saved(ctx, v, key, depth + 1)
        # ckpt["model"] = model.state_dict()
        for asg in a.assigns:
            if (
                isinstance(asg, cst.Assign)
                and a.function_of(asg) is fn
                and len(asg.targets) == 1
            ):
                t = asg.targets[0].target
                if (
                    isinstance(t, cst.Subscript)
                    and dotted(t.value) == obj.value
                    and len(t.slice) == 1
                    and isinstance(t.slice[0].slice, cst.Index)
                ):
                    k = t.slice[0].slice.value
                    out += _saved(
                        ctx,
                        asg.value,
                        k.evaluated_value if isinstance(k, cst.SimpleString) else None,
                        depth + 1,
                    )
    return out


def _loaded_key(ctx, expr, depth: int = 0):
    """The checkpoint key a loaded value comes from (None: the whole file or unknown key);
    False when it does not come from torch.load."""
    a, f = ctx.a, ctx.facts
    if depth > 4:
        return False
    for v in f.sources(expr):
        if isinstance(v, cst.Call) and a.is_call(v, "torch.load"):
            return None
        if (
            isinstance(v, cst.Subscript)
            and len(v.slice) == 1
            and isinstance(v.slice[0].slice, cst.Index)
        ):
            inner = _loaded_key(ctx, v.value, depth + 1)
            if inner is not False:
                k = v.slice[0].slice.value
                return k.evaluated_value if isinstance(k, cst.SimpleString) else None
        if (
            isinstance(v, cst.Call)
            and isinstance(v.func, cst.Attribute)
            and v.func.attr.value == "get"
            and v.args
        ):
            inner = _loaded_key(ctx, v.func.value, depth + 1)
            if inner is not False:
                k = v.args[0].value
                return k.evaluated_value if isinstance(k, cst.SimpleString) else None
    return False


def _handles_prefix(ctx) -> bool:
    """The script strips or adds the prefix itself (a "module." string, consume_prefix_in_state_dict_if_present)."""
    a = ctx.a
    if any(
        a.is_call(c, "torch.nn.modules.utils.consume_prefix_in_state_dict_if_present")
        for c in a.calls
    ):
        return True
    return any(
        "module." in (s.evaluated_value or "")
        for s in a.findall(a.module, m.SimpleString())
        if isinstance(s.evaluated_value, str)
        and not isinstance(a.parent.get(s), cst.Expr)
    )
