"""Literals of every type in every argument of the calls the analysis reads (the writers, readers,
openers and file handlers of analysis/writes.py, open() and Path.open, a library call): the
conversion never crashes on them. `txn.put(b"key", ...)` once stopped a whole project (a bytes
literal where a path test expected a str)."""

from __future__ import annotations

import pytest

from ddpify import Options, convert_source
from ddpify.analysis import writes

ODD = [
    'b"key"',
    'rb"a/b.pt"',
    'b"a" b"/b.pt"',
    'b"w"',
    "1",
    "3j",
    "None",
    "...",
    'f"{epoch}"',
    '[b"x"]',
    '{b"k": 1}',
    '"\\x00\\N{BULLET}"',
]

TRAIN = """\
import torch
import torch.nn as nn

model = nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    loss = model(torch.randn(4, 2)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _calls(lit: str, where: int) -> list[str]:
    """One call of each kind the tables name, `lit` at argument `where` (0, 1, or a keyword)."""
    funcs = sorted(
        set(writes.WRITERS)
        | set(writes.READERS)
        | set(writes.FILE_HANDLERS)
        | set(writes.FILE_OPENERS)
        | set(writes.DOWNLOADERS)
        | {"open", "io.open", "somelib.dump"}
    )
    methods = sorted(
        set(writes.WRITE_METHODS)
        | set(writes.PATH_METHODS)
        | writes.READ_METHODS
        | {"open", "put", "write"}
    )
    out = []
    for f in funcs:
        out.append(f"{f}({_args(lit, where)})")
    for meth in methods:
        out.append(f"obj.{meth}({_args(lit, where)})")
        out.append(f"({lit}).{meth}({_args('x', where)})")
    return out


def _args(lit: str, where: int) -> str:
    if where == 0:
        return f"{lit}, x"
    if where == 1:
        return f"x, {lit}, {lit}"
    return f"x, mode={lit}, f={lit}, fp={lit}, path={lit}, filename={lit}"


@pytest.mark.parametrize("lit", ODD)
def test_odd_literals_never_crash_the_conversion(lit):
    imports = {
        f.split(".")[0]
        for f in list(writes.WRITERS)
        + list(writes.READERS)
        + list(writes.DOWNLOADERS)
        + list(writes.FILE_OPENERS)
        + ["somelib", "logging"]
    }
    head = "".join(f"import {m}\n" for m in sorted(imports))
    body = "".join(f"    {c}\n" for where in (0, 1, 2) for c in _calls(lit, where))
    src = head + TRAIN + "    x = obj = None\n" + body
    # the converter reads every call; a crash raises here (a refusal is a result, not a crash)
    result = convert_source(src, Options())
    assert result.status in ("converted", "refused")
