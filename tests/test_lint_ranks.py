"""lint's rank evaluator (ddpify/lint/ranks.py) and where a line runs (reach.py): tests that do and
do not depend on the rank, global and local ranks, values followed through names, functions,
`self` attributes, parameters and mp.spawn."""

from __future__ import annotations

import libcst as cst
import pytest

from ddpify.analysis import Analysis
from ddpify.lint.engine import Context
from ddpify.lint.values import UNK
from ddpify.options import Options

HEADER = """import os
import torch.distributed as dist
RANK = int(os.environ["RANK"])
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))
"""


def facts(src: str):
    text = HEADER + src
    return Context(Analysis(cst.parse_module(text), text), text, Options()).facts


def truth_of(src: str):
    """The truth of the test of the last `if` in src, for global ranks 0, 1 and 4 (local 0, 1, 0)."""
    f = facts(src)
    return f.ranks.test(f.a.ifs[-1].test)


@pytest.mark.parametrize(
    "test, expected",
    [
        ("RANK == 0", (True, False, False)),
        ("dist.get_rank() == 0", (True, False, False)),
        ("LOCAL_RANK == 0", (True, False, True)),
        ("LOCAL_RANK in [-1, 0]", (True, False, True)),
        ("RANK != 0", (False, True, True)),
        ("not RANK", (True, False, False)),
        (
            'int(os.environ.get("RANK", -1)) != -1',
            (True, True, True),
        ),  # "is this a DDP run?": every rank
        ('"LOCAL_RANK" in os.environ', (True, True, True)),
        ("dist.get_world_size() > 1", (True, True, True)),
        ("flag and RANK == 0", (UNK, False, False)),
        ("RANK % 4 == 0", (True, False, True)),  # one process a node
    ],
)
def test_rank_tests(test, expected):
    assert truth_of(f"flag = input()\nif {test}:\n    pass\n") == expected


def test_values_followed_through_names_functions_and_attributes():
    src = """
def get_rank():
    if not dist.is_initialized():
        return 0
    return dist.get_rank()

def is_main_process():
    return get_rank() == 0

master_process = RANK == 0

class Trainer:
    def __init__(self):
        self.gpu_id = int(os.environ["LOCAL_RANK"])

    def save(self):
        if self.gpu_id == 0:
            pass
        if is_main_process():
            pass
        if master_process:
            pass
"""
    f = facts(src)
    local, main, master = (f.ranks.test(i.test) for i in f.a.ifs[-3:])
    assert local == (True, False, True)
    assert main == master == (True, False, False)


def test_spawned_process_index_and_parameters():
    src = """
import torch.multiprocessing as mp

def worker(gpu, ngpus_per_node, args):
    if gpu == 0:
        pass
    if RANK % ngpus_per_node == 0:
        pass

mp.spawn(worker, nprocs=4, args=(4, None))
"""
    f = facts(src)
    first, second = (f.ranks.test(i.test) for i in f.a.ifs[-2:])
    assert first == (True, False, True)  # mp.spawn's index is the local rank
    assert second == (True, False, True)  # ngpus_per_node: GPUs a node, by its name


def test_names_judged_by_their_spelling_when_no_value_is_seen():
    f = facts(
        "def f(args):\n    if args.local_rank == 0:\n        pass\n    if args.rank == 0:\n        pass\n    if args.epochs == 0:\n        pass\n"
    )
    local, glob, other = (f.ranks.test(i.test) for i in f.a.ifs[-3:])
    assert local == (True, False, True) and glob == (True, False, False)
    assert not f.ranks.depends(f.a.ifs[-1].test)


def test_a_value_computed_from_the_rank_differs_per_rank():
    f = facts("seed = 42\nx = seed + RANK\ny = seed * 2\n")
    x, y = (a.value for a in f.a.assigns[-2:])
    assert f.ranks.depends(x) and not f.ranks.depends(y)


def test_reach_through_early_returns_and_callers():
    src = """
def save():
    torch.save(1, "x.pt")

def log():
    if RANK != 0:
        return
    open("log.txt", "w")

if RANK == 0:
    save()
log()
"""
    f = facts(src)
    save_call = next(
        c
        for c in f.a.calls
        if (c.func.attr.value if isinstance(c.func, cst.Attribute) else "") == "save"
    )
    open_call = next(
        c for c in f.a.calls if isinstance(c.func, cst.Name) and c.func.value == "open"
    )
    assert f.reach.guard_kind(save_call) == "global"
    assert f.reach.guard_kind(open_call) == "global"
    assert f.reach.every_rank(open_call) is False
