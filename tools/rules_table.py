"""Write the finding-code tables of docs/rules.md from the rule registry (ddpify/rules.py): the
converter's codes between the rules markers, ddpify lint's between the lint-rules markers.

    python tools/rules_table.py          # rewrites both tables
    python tools/rules_table.py --check  # exit 1 if a table is stale
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ddpify import rules

RULES = Path(__file__).resolve().parent.parent / "docs" / "rules.md"
BLOCK = re.compile(r"(<!-- rules:begin -->\n).*?(\n<!-- rules:end -->)", re.S)
LINT_BLOCK = re.compile(
    r"(<!-- lint-rules:begin -->\n).*?(\n<!-- lint-rules:end -->)", re.S
)


def main() -> int:
    text = RULES.read_text()
    if not (BLOCK.search(text) and LINT_BLOCK.search(text)):
        print(f"{RULES}: the rules or lint-rules markers are missing", file=sys.stderr)
        return 1
    new = BLOCK.sub(lambda m: m.group(1) + rules.table("convert") + m.group(2), text)
    new = LINT_BLOCK.sub(lambda m: m.group(1) + rules.table("lint") + m.group(2), new)
    if "--check" in sys.argv:
        return int(new != text)
    RULES.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
