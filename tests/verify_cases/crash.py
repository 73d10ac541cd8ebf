"""Broken before any training: verify cannot run it at all and exits 2 with this traceback."""

import torch


def build():
    raise RuntimeError("dataset directory /nonexistent/data not found")


if __name__ == "__main__":
    torch.manual_seed(0)
    build()
