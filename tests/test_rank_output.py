"""Output from every rank, by one rule: the generated set-up sends stdout of ranks other than 0 to
os.devnull at the file-descriptor level, whatever writes it (print, sys.stdout.write, a logging
handler on sys.stdout made before the set-up, a library writing to fd 1); stderr stays on every
rank so errors show. The explicit `if RANK == 0:` guards on the script's own prints stay."""

from __future__ import annotations

import pytest
from conftest import free_port

from ddpify import Options, convert_source

torch = pytest.importorskip("torch")

SCRIPT = """\
import logging
import os
import sys
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

console = logging.getLogger("console")
console.addHandler(logging.StreamHandler(sys.stdout))  # made before the set-up runs
console.setLevel(logging.INFO)


def say(line):
    sys.stdout.write(line + "\\n")


x = torch.randn(64, 3)
loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)
model = nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for xb, yb in loader:
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
    say(f"write: epoch {epoch}")
    console.info("handler: epoch %d", epoch)
    os.write(1, b"fd: epoch\\n")
    sys.stderr.write(f"stderr from every rank: epoch {epoch}\\n")
"""


def test_the_set_up_silences_stdout_of_other_ranks_only():
    out = convert_source(SCRIPT, Options()).source
    assert (
        out.count("if RANK == 0:") >= 1
    )  # the script's own print keeps its explicit guard
    assert (
        'console.info("handler' in out and "    say(f" in out
    )  # no guard per call: one rule at run time
    assert "os.dup2(os.open(os.devnull, os.O_WRONLY), 1)" in out


def test_rank1_writes_nothing_to_stdout_but_keeps_stderr(tmp_path, forkrun):
    script = tmp_path / "train.py"
    script.write_text(convert_source(SCRIPT, Options()).source)
    run = forkrun.run(
        script,
        [],
        tmp_path,
        nproc=2,
        env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())},
    )
    assert not run.timed_out and run.returncode == 0, run.stderr[-3000:]
    rank0, rank1 = run.ranks
    for what in ("epoch 1 loss", "write: epoch 1", "handler: epoch 1", "fd: epoch"):
        assert what in rank0.stdout, rank0.stdout
    assert rank1.stdout == "", rank1.stdout
    assert (
        "stderr from every rank: epoch 1" in rank1.stderr
        and "stderr from every rank: epoch 1" in rank0.stderr
    )


def test_a_plain_run_keeps_its_stdout(tmp_path, forkrun):
    script = tmp_path / "train.py"
    script.write_text(convert_source(SCRIPT, Options()).source)
    run = forkrun.run(script, [], tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "write: epoch 1" in run.stdout and "handler: epoch 1" in run.stdout
