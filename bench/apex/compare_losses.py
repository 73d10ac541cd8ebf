"""Compare the losses two runs of the same fixture printed (the --amp apex output against the
default torch.amp output), epoch by epoch: PASS where every pair agrees within fp16 noise.

    python3 bench/apex/compare_losses.py NAME APEX_LOG TORCH_LOG [--rtol 0.05 --atol 0.02]

Both logs are torchrun's output of one run (rank 0 prints, the others are silent). Losses are the
numbers right after a word starting with "loss" (`loss 0.1234`, `Loss_D: 1.2`), in print order.
Exit status 0 on PASS, 1 on FAIL (different counts, a non-finite loss, or a pair out of tolerance).
"""

from __future__ import annotations

import argparse
import math
import re
import sys

LOSS = re.compile(
    r"loss\w*\W{0,3}?\s*([-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|nan|inf)", re.I
)


def losses(path: str) -> list[float]:
    with open(path, errors="replace") as f:
        return [
            float(m.group(1))
            for line in f
            if "epoch" in line.lower()
            for m in LOSS.finditer(line)
        ]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("name")
    ap.add_argument("apex_log")
    ap.add_argument("torch_log")
    ap.add_argument("--rtol", type=float, default=0.05)
    ap.add_argument("--atol", type=float, default=0.02)
    a = ap.parse_args()
    x, y = losses(a.apex_log), losses(a.torch_log)
    why = ""
    if not x or len(x) != len(y):
        why = f"{len(x)} losses from --amp apex, {len(y)} from torch.amp"
    elif not all(math.isfinite(v) for v in x + y):
        why = "a loss is not finite"
    worst = max(
        (abs(p - q) / max(abs(p), abs(q), 1e-12) for p, q in zip(x, y)), default=0.0
    )
    out = [
        (p, q)
        for p, q in zip(x, y)
        if abs(p - q) > a.atol + a.rtol * max(abs(p), abs(q))
    ]
    if not why and out:
        why = f"{len(out)} of {len(x)} pairs apart by more than {a.atol} + {a.rtol:.0%}: {out[:3]}"
    figures = f"apex {[round(v, 4) for v in x]} | torch.amp {[round(v, 4) for v in y]} | largest relative difference {worst:.2%}"
    print(f"{'FAIL' if why else 'PASS'} {a.name}: {why + '; ' if why else ''}{figures}")
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main())
