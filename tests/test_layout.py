"""Arguments ddpify adds to a call keep the call's own layout (one line, hanging, one per line)."""

import libcst as cst
import pytest

from ddpify.transforms.base import append_kwarg

CASES = [
    ("f()", "f(k=1)"),
    ("f(a)", "f(a, k=1)"),
    ("f(a, b)", "f(a, b, k=1)"),
    ("f(a, b,)", "f(a, b, k=1,)"),
    ("f(\n    a, b\n)", "f(\n    a, b, k=1\n)"),
    ("f(\n    a,\n    b,\n)", "f(\n    a,\n    b,\n    k=1,\n)"),
    ("f(\n    a,\n)", "f(\n    a,\n    k=1,\n)"),
    ("f(\n    a,\n    b\n)", "f(\n    a,\n    b,\n    k=1\n)"),
    ("f(a,\n  b)", "f(a,\n  b,\n  k=1)"),
]


@pytest.mark.parametrize("src,want", CASES)
def test_append_kwarg_keeps_layout(src, want):
    call = cst.parse_expression(src)
    got = cst.Module([]).code_for_node(
        append_kwarg(call, "k", cst.parse_expression("1"))
    )
    assert got == want
    cst.parse_expression(got)  # still valid Python
