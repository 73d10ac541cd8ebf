"""The script's own rank tests (analysis/rank_tests.py), which the rank-0 planner and the gate
both read: a value is a rank by where it comes from, never by its name."""

from __future__ import annotations

import ast

import pytest

from ddpify.analysis.rank_tests import RankTests

PRELUDE = """\
import argparse
import os
import torch.distributed as dist
from accelerate import Accelerator

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--rank", type=int, default=0)
parser.add_argument("--node_rank", type=int, default=int(os.environ.get("RANK", 0)))
args = parser.parse_args()
rank = int(os.environ["RANK"])
lora_rank = 8


def get_rank():
    if not dist.is_initialized():
        return 0
    return dist.get_rank()


def is_main_process():
    return get_rank() == 0


def is_master():
    return lora_rank == 0


is_chief = rank == 0
"""

CASES = [
    ("dist.get_rank() == 0", True),
    ("0 == dist.get_rank()", True),
    ("dist.get_rank() != 0", False),
    ("rank == 0", True),
    ("not rank", True),
    ("rank > 0", False),
    ("args.local_rank in [-1, 0]", True),
    ("args.local_rank not in (-1, 0)", False),
    ("args.node_rank == 0", True),
    ("is_main_process()", True),
    ("not is_main_process()", False),
    ("not dist.is_initialized() or dist.get_rank() == 0", True),
    ("get_rank() == 0 and epoch % 5 == 0", True),
    ("is_chief", True),
    ("int(os.environ.get('LOCAL_RANK', 0)) == 0", True),
    # not ranks: a flag every rank shares, a LoRA rank, a function of one
    ("args.rank == 0", None),
    ("lora_rank == 0", None),
    ("is_master()", None),
    ("epoch == 0", None),
    ("get_rank() == 0 or epoch == 0", None),
]


@pytest.mark.parametrize("test,verdict", CASES)
def test_rank_test_verdict(test, verdict):
    text = PRELUDE + f"\nif {test}:\n    print('x')\n"
    found = RankTests(text)
    node = ast.parse(text).body[-1]
    assert found.tests.get((node.test.lineno, node.test.col_offset)) is verdict
    last = text.count("\n")
    assert (last in found.lines) is (verdict is True)
