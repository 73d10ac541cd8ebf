"""Names ddpify generates (RANK, LOCAL_DEVICE, ddp_setup, ...) never collide with the script's.

A script that uses one of them as a variable in any scope (its own `RANK = 6`, a parameter, a
class attribute) is converted in three steps: each such name of the script becomes a placeholder of
the same length (columns of findings stay right) that appears nowhere in the source, the
placeholder text is converted (every generated name in its output is then ddpify's own), and
in the output ddpify's names become free ones (DDP_RANK, DDP_RANK_1, ...) and the placeholders
the script's names again. Only Name nodes are renamed: strings such as
`os.environ.get("RANK")` and comments keep the text they had.
"""

from __future__ import annotations

import re
from itertools import count

import libcst as cst
import ddpify.match as m

from ddpify.analysis import codegen

# every module-level name a conversion may add (launch.py, precision.py, decisions.py, legacy.py)
GENERATED = (
    "LOCAL_RANK",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_DEVICE",
    "AMP_DTYPE",
    "SCALER",
    "ddp_setup",
    "rank0_decides",
    "exit_status",
    "scaler_state",
    "load_fused_adam_state",
    "in_float32",
    "rank0_seed",
    "amp_initialize",
    "ddp_local_batch",
    "ddp_in_place",
)
_ANY = re.compile(r"\b(" + "|".join(GENERATED) + r")\b")


# what ddpify's own definition of a name holds: a script (or ddpify's output) that defines it
# so means the same thing, and is no clash
OWN = {
    "LOCAL_RANK": r"LOCAL_RANK",
    "RANK": r"[\"']RANK[\"']",
    "WORLD_SIZE": r"[\"']WORLD_SIZE[\"']",
    "LOCAL_DEVICE": r"(?i)local_rank",
    "AMP_DTYPE": r"float16",
    "SCALER": r"GradScaler",
    "exit_status": r".",
    "ddp_setup": r"init_process_group",
    "rank0_decides": r"broadcast",
    "scaler_state": r"loss_scale",
    "load_fused_adam_state": r"state",
    "in_float32": r"autocast refuses it on GPUs",
    "rank0_seed": r"broadcast",
    "amp_initialize": r"amp\.initialize in torch\.amp",
    "ddp_local_batch": r"WORLD_SIZE",
    "ddp_in_place": r"replicate",
}
# set by ddpify's amp_initialize (legacy_apex.py) through `global`, starting from None / a disabled scaler
SWITCHED = {"AMP_DTYPE": r"^None$", "SCALER": r"enabled=False"}


DEFINED = {
    "ddp_setup",
    "rank0_decides",
    "scaler_state",
    "load_fused_adam_state",
    "in_float32",
    "rank0_seed",
    "amp_initialize",
    "ddp_local_batch",
}


class _Rename(cst.CSTTransformer):
    def __init__(self, mapping: dict[str, str]) -> None:
        super().__init__()
        self.mapping = mapping

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        new = self.mapping.get(updated.value)
        return updated if new is None else updated.with_changes(value=new)


def clashes(a, source: str) -> dict[str, cst.Name]:
    """Generated names the script itself uses as a variable (not in strings, comments, attributes
    or keywords), with their first use, except where the script defines them as ddpify does
    (ddpify's own output, a script that reads RANK from the environment itself)."""
    wanted = set(_ANY.findall(source))
    if not wanted:
        return {}
    first: dict[str, cst.Name] = {}
    for node in a.findall(a.module, m.Name()):  # the analysis' index, in source order
        if (
            node.value in wanted
            and node.value not in first
            and not _member_or_keyword(a, node)
        ):
            first[node.value] = node
    return {n: first[n] for n in GENERATED if n in first and not _own(a, n)}


def _member_or_keyword(a, node: cst.Name) -> bool:
    par = a.parent.get(node)
    return (isinstance(par, cst.Attribute) and par.attr is node) or (
        isinstance(par, cst.Arg) and par.keyword is node
    )


def _own(a, name: str) -> bool:
    """Every binding of name is a module-level definition like ddpify's."""
    scopes = [s for s, names in a.bindings.items() if name in names]
    switch = (
        [
            fn
            for fn in a.functions.get("amp_initialize", [])
            if a.function_of(fn) is None and _own(a, "amp_initialize")
        ]
        if name in SWITCHED
        else []
    )
    scopes = [s for s in scopes if s not in {id(fn) for fn in switch}]
    if scopes != [None]:
        return False
    binds = a.bindings[None][name]
    defs = [
        fn
        for fn in a.functions.get(name, [])
        if a.function_of(fn) is None and a.class_of(fn) is None
    ]
    values = a._local_values(None, name)
    if (
        len(binds) != len(defs) + len(values)
        or not binds
        or (values if name in DEFINED else defs)
    ):
        return False  # ddpify defines those in DEFINED as functions, the others as variables
    own = re.compile(OWN[name] + (f"|{SWITCHED[name]}" if switch else ""))
    return all(own.search(codegen(x)) for x in [*defs, *values])


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text))


def placeholders(names: list[str], source: str) -> dict[str, str]:
    """name -> an identifier of the same length that the source does not contain. It keeps the
    name's last word (LOCAL_DEVICE -> _0000_DEVICE): the analysis reads hints from names."""
    taken = _words(source)
    out: dict[str, str] = {}
    for name in names:
        tail = "_" + name.rsplit("_", 1)[1] if "_" in name else ""
        width = len(name) - len(tail) - 1
        for k in count():
            cand = f"_{k:0{width}x}{tail}"
            if len(cand) == len(name) and cand not in taken:
                break
        taken.add(cand)
        out[name] = cand
    return out


def free_names(names: list[str], source: str) -> dict[str, str]:
    """Generated name -> the name ddpify uses instead: DDP_RANK, then DDP_RANK_1, ..."""
    taken = _words(source)
    out: dict[str, str] = {}
    for name in names:
        base = f"DDP_{name}" if name.isupper() else f"ddpify_{name}"
        cand, k = base, 1
        while cand in taken:
            cand, k = f"{base}_{k}", k + 1
        taken.add(cand)
        out[name] = cand
    return out


def rename(module: cst.Module, mapping: dict[str, str]) -> cst.Module:
    return module.visit(_Rename(mapping))  # type: ignore[return-value]


def unplace(text: str, back: dict[str, str]) -> str:
    """A finding's message about the placeholder text, in the script's own names."""
    if not back:
        return text
    return re.sub(
        r"\b(" + "|".join(map(re.escape, back)) + r")\b",
        lambda mt: back[mt.group(1)],
        text,
    )
