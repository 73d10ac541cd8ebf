"""The training step under the generated autocast: the cases the fixtures 70-76 do not spell out
(options other than the default, the refusals)."""

from __future__ import annotations

from ddpify import Options, convert_source

HEAD = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

model = nn.Linear(4, 1)
loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.rand(8, 1)), batch_size=4, shuffle=True)
"""

MANUAL = HEAD + """
for epoch in range(2):
    for x, y in loader:
        out = model(x)
        loss = F.mse_loss(out, y)
        model.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.1)
"""


def _codes(result, fixed=None):
    return [f.code for f in result.findings if fixed is None or f.fixed == fixed]


def test_manual_update_with_fp16_leaves_precision_off():
    result = convert_source(MANUAL, Options(amp="fp16"))
    assert "autocast" not in result.source and "SCALER" not in result.source
    assert "DDP045" in _codes(result, fixed=False)
    assert "model = DDP(model" in result.source  # found by its update loop, wrapped all the same


def test_manual_update_gets_bf16_autocast_and_no_scaler():
    result = convert_source(MANUAL, Options(amp="auto"))
    assert "dtype=torch.bfloat16, enabled=AMP_DTYPE == torch.bfloat16" in result.source
    assert "SCALER" not in result.source and "no_sync" not in result.source
    assert "DDP045" in _codes(result, fixed=True)


def test_unsafe_op_in_the_forward_statement_leaves_precision_off():
    src = HEAD + """
criterion = nn.BCELoss()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        loss = criterion(torch.sigmoid(model(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
    result = convert_source(src, Options())
    assert "torch.autocast" not in result.source
    assert "DDP043" in _codes(result, fixed=False)


def test_inplace_change_of_the_first_forward_output_leaves_precision_off():
    src = HEAD + """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        out = model(x); out.clamp_(-1, 1)
        loss = F.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
    result = convert_source(src, Options())
    assert "DDP046" in _codes(result, fixed=False)
    assert "torch.autocast" not in result.source


def test_augmented_assignment_to_a_number_is_no_inplace_op():
    src = HEAD + """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        n = x.size(0)
        out = model(x)
        n += 1
        loss = F.mse_loss(out, y) * n
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
    result = convert_source(src, Options())
    assert "DDP046" not in _codes(result)
    assert "torch.autocast(LOCAL_DEVICE.type, dtype=AMP_DTYPE" in result.source


def test_bce_outside_the_training_step_is_left_alone():
    src = HEAD + """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        out = torch.sigmoid(model(x))
        loss = F.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        val = F.binary_cross_entropy(torch.sigmoid(model(x)), y)
"""
    result = convert_source(src, Options())
    assert "DDP044" not in _codes(result)
    assert "enabled=False" not in result.source
