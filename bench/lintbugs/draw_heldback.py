"""Draw the held-back third of bugs.toml (seeded), before any lint rule is written from the
collection: python bench/lintbugs/draw_heldback.py 20240917 > bench/lintbugs/heldback.txt"""

import random
import sys
import tomllib
from pathlib import Path

seed = int(sys.argv[1])
bugs = sorted(
    b["id"]
    for b in tomllib.loads((Path(__file__).parent / "bugs.toml").read_text())["bug"]
)
held = sorted(random.Random(seed).sample(bugs, len(bugs) // 3))
print(
    f"# seed {seed}; drawn by: python bench/lintbugs/draw_heldback.py {seed} > bench/lintbugs/heldback.txt"
)
print(
    f"# {len(held)} of {len(bugs)} bugs; their lint output is not looked at until the final measurement"
)
print("\n".join(held))
