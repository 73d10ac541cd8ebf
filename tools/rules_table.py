"""Write the README's finding-code tables from the rule registry (ddpify/rules.py): the
converter's codes between the rules markers, ddpify lint's between the lint-rules markers.

    python tools/rules_table.py          # rewrites the table between the rules markers
    python tools/rules_table.py --check  # exit 1 if the README's table is stale
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ddpify import rules

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"(<!-- rules:begin -->\n).*?(\n<!-- rules:end -->)", re.S)
LINT_BLOCK = re.compile(r"(<!-- lint-rules:begin -->\n).*?(\n<!-- lint-rules:end -->)", re.S)


def main() -> int:
    text = README.read_text()
    new = BLOCK.sub(lambda m: m.group(1) + rules.table("convert") + m.group(2), text)
    new = LINT_BLOCK.sub(lambda m: m.group(1) + rules.table("lint") + m.group(2), new)
    if "--check" in sys.argv:
        return int(new != text)
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
