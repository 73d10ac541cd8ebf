"""Does the script handle devices at all? A script that never names one (no `.cuda()`, no
`torch.device`, no `device`/`gpu`/`cuda` name, no "cuda" string, no DataParallel) trains on
the CPU wherever it runs: its conversion keeps that (a CPU DDP program over gloo) instead of
guessing where its model and every tensor would have to go on a GPU. The test is lexical and
errs towards "handles devices": a script it passes names none of these anywhere.
"""

from __future__ import annotations

import re

import libcst as cst
import ddpify.match as m

# names that speak of a device or of GPU-only parallelism (use_cuda, ngpu, DataParallel, ...);
# the short ones only as a whole part of the name (xla_device, but not output)
DEVICE_NAME = re.compile(r"cuda|device|gpu|parallel|accelerat|(?:^|_)(?:mps|xla|tpu|npu)(?:_|\d|$)", re.IGNORECASE)
# strings that name a device ("cuda:0", "mps", "torch.cuda.FloatTensor", ...)
DEVICE_STRING = re.compile(r"cuda|^\s*(?:mps|xla|gpu|tpu|npu)(?::\d+)?\s*$", re.IGNORECASE)


def device_handling(a) -> cst.CSTNode | None:
    """The first node of the script that names a device, or None when there is none (the
    script trains on the CPU)."""
    found: list[cst.CSTNode] = []
    for node in a.findall(a.module, m.Name()):
        if DEVICE_NAME.search(node.value):
            found.append(node)
            break
    for node in a.findall(a.module, m.SimpleString()):
        try:
            text = node.evaluated_value
        except Exception:  # bytes with odd escapes: judge the literal as written
            text = node.value
        if isinstance(text, bytes):
            text = text.decode("latin-1")
        if DEVICE_STRING.search(text):
            found.append(node)
            break
    for node in a.findall(a.module, m.FormattedStringText()):
        if DEVICE_STRING.search(node.value):
            found.append(node)
            break
    if not found:
        return None
    return min(found, key=lambda n: a.pos[n].start.line)
