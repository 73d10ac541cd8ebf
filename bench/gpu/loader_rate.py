"""The CNN benchmark's input pipeline alone (no model): batches per second that one process's
DataLoader (SyntheticImageNet, batch 256, pinned memory) delivers, with P such processes at once
on the host, as P ranks of a P-GPU run would have. Tells whether the host can feed P GPUs.

    python bench/gpu/loader_rate.py --procs 1 4 --workers 8 --batches 60
"""

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def one(rank: int, workers: int, batches: int, q) -> None:
    import torch
    from torch.utils.data import DataLoader
    from benchmodels import SyntheticImageNet

    torch.manual_seed(rank)
    loader = DataLoader(
        SyntheticImageNet(100_000),
        batch_size=256,
        shuffle=True,
        num_workers=workers,
        drop_last=True,
        pin_memory=torch.cuda.is_available(),
    )
    it = iter(loader)
    for _ in range(10):  # workers started, queues filled once
        next(it)
    t = time.perf_counter()
    for _ in range(batches):
        next(it)
    q.put(batches / (time.perf_counter() - t))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--workers", type=int, nargs="+", default=[8])
    ap.add_argument("--batches", type=int, default=60)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    for w in args.workers:
        for p in args.procs:
            q = ctx.Queue()
            ps = [
                ctx.Process(target=one, args=(r, w, args.batches, q)) for r in range(p)
            ]
            for x in ps:
                x.start()
            rates = [q.get() for _ in ps]
            for x in ps:
                x.join()
            print(
                f"procs {p} workers {w}: batches/s per process {min(rates):.1f}-{max(rates):.1f} "
                f"(images/s per process {256 * min(rates):.0f}-{256 * max(rates):.0f})",
                flush=True,
            )


if __name__ == "__main__":
    main()
