"""Predicts with a trained Net; --dry-run checks the whole path on a model saved just now."""

import argparse
import os
import tempfile

import torch

from model import Net, load, save


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint", nargs="?")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    if args.dry_run:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "net.pt")
            save(Net(), path)
            model = load(path)
    else:
        model = load(args.checkpoint)
    with torch.no_grad():
        print(model(torch.randn(4, 8)).argmax(1).tolist())


if __name__ == "__main__":
    main()
