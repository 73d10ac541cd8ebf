"""Data preparation, by one rule (ddpify/transforms/dataprep.py): a call of a function of the
script whose body writes files, made once before training, is data preparation whatever the
function looks like inside. Rank 0 alone makes the call where nothing of it is needed on the
other ranks, and the barrier after it runs on every rank, outside the guard; otherwise every rank
makes it, rank 0 first. No collective ever sits in code that rank 0 alone runs."""

from __future__ import annotations

import ast

from ddpify import Options, convert_source

HEAD = """\
import json
import os
import random
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
"""

PREPARE = """
def prepare_data(root):
    index = os.path.join(root, "index.json")
    if os.path.exists(index):
        return
    os.makedirs(root, exist_ok=True)
    names = []
    for i in range(4):
        np.save(os.path.join(root, f"p{i}.npy"), np.ones((8, 3), dtype="float32") * i)
        names.append(f"p{i}.npy")
    with open(index, "w") as f:
        json.dump(names, f)


def load(root):
    with open(os.path.join(root, "index.json")) as f:
        x = torch.cat([torch.from_numpy(np.load(os.path.join(root, n))) for n in json.load(f)])
    return TensorDataset(x, x.sum(1, keepdim=True))
"""

TRAIN = """
loader = DataLoader(load("parts"), batch_size=8, shuffle=True)
model = nn.Linear(3, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(2):
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def convert(src: str):
    return convert_source(src, Options(amp="none"))


def rank0_only_code(source: str) -> list[ast.AST]:
    """Bodies of `if RANK == 0:` blocks and of the functions only such blocks call."""
    tree = ast.parse(source)
    funcs = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}
    blocks = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.If) and ast.unparse(n.test) == "RANK == 0"
    ]
    out: list[ast.AST] = [s for b in blocks for s in b.body]
    calls = {
        c.func.id
        for s in out
        for c in ast.walk(s)
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
    }
    out += [funcs[n] for n in calls if n in funcs]
    return out


def collectives_in(nodes: list[ast.AST]) -> list[str]:
    names = ("barrier", "all_reduce", "broadcast", "all_gather")
    return [
        ast.unparse(c)
        for n in nodes
        for c in ast.walk(n)
        if isinstance(c, ast.Call)
        and isinstance(c.func, ast.Attribute)
        and c.func.attr in names
    ]


def test_a_prepare_call_is_made_by_rank0_and_every_rank_waits_after_it():
    out = convert(HEAD + PREPARE + '\nprepare_data("parts")\n' + TRAIN).source
    assert 'if RANK == 0:\n    prepare_data("parts")\ndist.barrier()' in out
    # whatever the function does inside (an early return, many files, then the index) stays as written
    assert (
        'np.save(os.path.join(root, f"p{i}.npy")' in out
        and "if RANK == 0:\n            np.save" not in out
    )
    assert "else os.devnull" not in out
    assert not collectives_in(rank0_only_code(out))


def test_a_write_that_cannot_be_guarded_is_fine_inside_a_preparation():
    src = (
        HEAD
        + """
def cache_features(path):
    if os.path.exists(path):
        return
    mm = np.memmap(path, dtype="float32", mode="w+", shape=(32, 3))
    mm[:] = 1.0
    mm.flush()


cache_features("x.dat")
x = torch.from_numpy(np.array(np.memmap("x.dat", dtype="float32", mode="r", shape=(32, 3))))
"""
        + TRAIN.replace('load("parts")', "TensorDataset(x, x.sum(1, keepdim=True))")
    )
    res = convert(src)
    assert not any(f.code == "DDP064" for f in res.findings), [
        f.message for f in res.findings
    ]
    assert 'if RANK == 0:\n    cache_features("x.dat")\ndist.barrier()' in res.source


def test_a_value_every_rank_needs_is_prepared_by_every_rank_rank0_first():
    src = (
        HEAD
        + PREPARE
        + """
def prepare_and_count(root):
    prepare_data(root)
    return len(os.listdir(root))


n_files = prepare_and_count("parts")
print(n_files)
"""
        + TRAIN
    )
    out = convert(src).source
    assert (
        "if RANK != 0:\n    dist.barrier()  # rank 0 prepares the data first\nn_files = prepare_and_count"
        in out
    )
    assert (
        'n_files = prepare_and_count("parts")\nif RANK == 0:\n    dist.barrier()' in out
    )


def test_state_changes_and_global_draws_keep_the_call_on_every_rank():
    for body in (
        "    cfg.n_parts = 4\n",
        "    random.shuffle(NAMES)\n",
        "    global N\n    N = 4\n",
        "    NAMES.append('x')\n",
    ):
        src = (
            HEAD
            + "cfg = type('C', (), {})()\nNAMES = ['a']\nN = 0\n"
            + PREPARE.replace("    names = []\n", "    names = []\n" + body, 1)
        )
        src += '\nprepare_data("parts")\n' + TRAIN
        out = convert(src).source
        assert 'if RANK == 0:\n    prepare_data("parts")' not in out, body
        assert (
            'if RANK != 0:\n    dist.barrier()  # rank 0 prepares the data first\nprepare_data("parts")'
            in out
        ), body


def test_writes_in_the_loop_or_after_training_are_not_data_preparation():
    src = (
        HEAD
        + PREPARE
        + """
def save_report(path, value):
    with open(path, "w") as f:
        f.write(str(value))


prepare_data("parts")
"""
        + TRAIN.replace(
            "        opt.step()\n",
            "        opt.step()\n    save_report(f'epoch{epoch}.txt', loss.item())\n",
        )
        + 'save_report("final.txt", 1)\n'
    )
    res = convert(src)
    preps = [f for f in res.findings if f.code == "DDP073"]
    assert (
        len(preps) == 1
        and preps[0].line == src.splitlines().index('prepare_data("parts")') + 1
    )
    assert (
        "    with open(path if RANK == 0 else os.devnull" in res.source
    )  # its writes guarded one by one


def test_a_function_that_synchronises_itself_is_not_guarded_whole():
    # it writes a file and reads it back: a barrier goes inside it (checkpoints.py), which rank 0
    # alone could never pass
    src = (
        HEAD
        + """
def write_config(path):
    with open(path, "w") as f:
        json.dump({"lr": 0.01}, f)
    with open(path) as f:
        print(json.load(f))


write_config("cfg.json")
"""
        + PREPARE
        + TRAIN.replace("loader = ", 'prepare_data("parts")\nloader = ')
    )
    out = convert(src).source
    assert 'if RANK == 0:\n    write_config("cfg.json")' not in out
    assert not collectives_in(rank0_only_code(out))


def test_preparation_in_a_trainer_method_before_fit():
    src = (
        HEAD
        + PREPARE
        + """

class Trainer:
    def __init__(self, root):
        self.device = device
        self.prepare(root)
        self.loader = DataLoader(load(root), batch_size=8, shuffle=True)
        self.model = nn.Linear(3, 1).to(self.device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def prepare(self, root):
        prepare_data(root)

    def fit(self):
        for epoch in range(2):
            for xb, yb in self.loader:
                loss = nn.functional.mse_loss(self.model(xb.to(self.device)), yb.to(self.device))
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()


if __name__ == "__main__":
    Trainer("parts").fit()
"""
    )
    out = convert(src).source
    assert (
        "        if RANK == 0:\n            self.prepare(root)\n        dist.barrier()"
        in out
    )
    assert not collectives_in(rank0_only_code(out))
