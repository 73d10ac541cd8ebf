"""Seeded draws from bugs.toml, made before any rule is written from the bugs they hold back.

python bench/lintbugs/draw_heldback.py 20240917 > bench/lintbugs/heldback.txt
    the first collection's held-back third (b01-b56)
python bench/lintbugs/draw_heldback.py 20261129 --round 2 > bench/lintbugs/heldback2.txt
    the second collection's held-back third (b57 on)
python bench/lintbugs/draw_heldback.py 4711 --verify-set 20 > bench/lintbugs/verify_set.txt
    20 of the second collection's bugs that a run on 2 CPU ranks shows, for verify
"""

import argparse
import random
import tomllib
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("seed", type=int)
ap.add_argument("--round", type=int, default=1)
ap.add_argument("--verify-set", type=int, default=0)
args = ap.parse_args()
rows = tomllib.loads((Path(__file__).parent / "bugs.toml").read_text())["bug"]
if args.verify_set:
    pool = sorted(
        b["id"] for b in rows if b.get("round", 1) == 2 and b.get("cpu") is True
    )
    held = sorted(random.Random(args.seed).sample(pool, args.verify_set))
    what = f"{len(held)} of the {len(pool)} second-collection bugs a run on 2 CPU ranks shows"
    cmd = f"--verify-set {args.verify_set} > bench/lintbugs/verify_set.txt"
else:
    pool = sorted(b["id"] for b in rows if b.get("round", 1) == args.round)
    held = sorted(random.Random(args.seed).sample(pool, len(pool) // 3))
    what = f"{len(held)} of {len(pool)} bugs; their lint output is not looked at until the final measurement"
    name = "heldback.txt" if args.round == 1 else f"heldback{args.round}.txt"
    cmd = (
        "" if args.round == 1 else f"--round {args.round} "
    ) + f"> bench/lintbugs/{name}"
print(
    f"# seed {args.seed}; drawn by: python bench/lintbugs/draw_heldback.py {args.seed} {cmd}"
)
print(f"# {what}")
print("\n".join(held))
