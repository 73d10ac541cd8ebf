"""Refuse only what an engineer would have to restructure (issue 27): each kind of refusal seen on
code from outside the corpus, by a general rule. Optimizers chosen by name, loaders built by
factories and DataLoader subclasses, demo blocks of library modules, trackers ddpify itself made
rank-0-only, scripts that only import a model class."""

from __future__ import annotations

import pytest

from ddpify import Options, convert_source
from ddpify.analysis.core import Analysis

import libcst as cst

MODEL = '''\
import functools
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
x = torch.randn(64, 3)
loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)
net = nn.Linear(3, 1).to(device)
'''
LOOP = '''
for epoch in range(2):
    for xb, yb in loader:
        loss = nn.functional.mse_loss(net(xb.to(device)), yb.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


@pytest.mark.parametrize("build", [
    "opt = getattr(torch.optim, 'SGD')(net.parameters(), lr=0.1)",
    "cls = getattr(torch.optim, NAME)\nopt = cls(net.parameters(), lr=0.1)",
    "OPTS = {'sgd': torch.optim.SGD, 'adam': torch.optim.Adam}\nopt = OPTS[NAME](net.parameters(), lr=0.1)",
    "OPTS = {'sgd': lambda p: torch.optim.SGD(p, lr=0.1)}\nopt = OPTS[NAME](net.parameters())",
    "OPTS = [functools.partial(torch.optim.SGD, lr=0.1)]\nopt = OPTS[0](net.parameters())",
    "def make(params):\n    o = torch.optim.SGD(params, lr=0.1)\n    return o\n\n\nopt = make(net.parameters())",
    "def init_obj(name, module, *args):\n    return getattr(module, name)(*args)\n\n\nopt = init_obj(NAME, torch.optim, net.parameters())",
])
def test_an_optimizer_chosen_by_name_still_names_its_model(build):
    src = MODEL + "NAME = 'SGD'\n" + build + "\n" + LOOP
    a = Analysis(cst.parse_module(src))
    assert a.models == ["net"], a.models
    res = convert_source(src, Options())
    assert not res.blocking, [f.message for f in res.blocking]
    assert "net = DDP(net)" in res.source


@pytest.mark.parametrize("other", [
    "count = sum(p.numel() for p in net.parameters())",
    "ema = torch.optim.swa_utils.AveragedModel(net)",
    "stats = describe(net.parameters())",
])
def test_other_uses_of_the_parameters_are_not_optimizers(other):
    src = MODEL + "def describe(ps):\n    return len(list(ps))\n\n\n" + other + "\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n" + LOOP
    a = Analysis(cst.parse_module(src))
    assert a.models == ["net"] and list(a.optimizers) == ["opt"], (a.models, a.optimizers)
