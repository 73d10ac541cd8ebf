"""The shared analysis' own name resolution: import aliases through scopes, and locals."""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import Analysis

SOURCE = """\
import torch.nn.functional as F
import torch.distributed
from torch.utils.data import DataLoader as DL
from . import helpers

model = None


def train():
    from apex import amp
    model = make()
    for x in DL(ds):
        F.relu(x)
        amp.scale_loss(x, opt)
        torch.distributed.barrier()
    return [y for y in helpers.items()]


class Net:
    from torch import nn
    layer = nn.Linear

    def forward(self):
        global model
        model = 1
        return nn.Linear
"""


def _calls(a: Analysis) -> dict[str, set[str]]:
    return {
        cst.Module(body=[]).code_for_node(c.func): a.qualified(c.func) for c in a.calls
    }


def test_qualified_names_follow_imports_and_scopes():
    a = Analysis(cst.parse_module(SOURCE))
    q = _calls(a)
    assert q["F.relu"] == {"torch.nn.functional.relu"}
    assert q["DL"] == {"torch.utils.data.DataLoader"}
    assert q["amp.scale_loss"] == {
        "apex.amp.scale_loss"
    }  # imported inside the function
    assert q["torch.distributed.barrier"] == {
        "torch.distributed.barrier"
    }  # `import torch.distributed` binds torch
    assert q["helpers.items"] == {".helpers.items"}
    assert q["make"] == {"make"}  # unbound names stay as written
    # a class body's import is not visible from its methods, as in Python
    layer = next(
        x for x in a.attributes if cst.Module(body=[]).code_for_node(x) == "nn.Linear"
    )
    assert a.qualified(layer) == {"torch.nn.Linear"}
    ret = [
        x for x in a.attributes if cst.Module(body=[]).code_for_node(x) == "nn.Linear"
    ][-1]
    assert a.qualified(ret) == {"nn.Linear"}


def test_locals_of_a_function():
    a = Analysis(cst.parse_module(SOURCE))
    train = a.functions["train"][0]
    forward = a.functions["forward"][0]
    assert (
        a._is_local(train, "model")
        and a._is_local(train, "x")
        and a._is_local(train, "amp")
    )
    assert not a._is_local(train, "y")  # the comprehension's own
    assert not a._is_local(forward, "model")  # declared global
    assert a._is_local(forward, "self")


def test_loader_built_in_an_evaluation_function_is_not_training():
    # makemore: evaluate() shuffles to sample a few batches; the training loader is another one
    src = """\
import torch
from torch.utils.data import DataLoader

@torch.inference_mode()
def evaluate(model, dataset):
    loader = DataLoader(dataset, shuffle=True, batch_size=50)
    return sum(model(x).sum().item() for x, in loader)

def check(model, dataset):
    batches = DataLoader(dataset, shuffle=True, batch_size=50)
    return [model(x) for x, in batches]

def fit(model, opt, data):
    feed = DataLoader(data, shuffle=True, batch_size=8)
    for x, y in feed:
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
"""
    a = Analysis(cst.parse_module(src), src)
    roles = {ld.target: ld.role for ld in a.loaders}
    assert roles == {"loader": "eval", "batches": "train", "feed": "train"}
