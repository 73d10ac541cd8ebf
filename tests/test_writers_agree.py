"""The planners guard what the gate's one-writer invariant names (both read the one path test of
analysis/effect_kinds.py): a writer the gate would refuse is guarded instead, whatever library
it comes from and however its path is spelled."""

from __future__ import annotations

import pytest

from ddpify import Options, convert_source

HEAD = """\
import os

import imageio
import matplotlib.animation as animation
import matplotlib.pyplot as plt
import torch
import torch.nn as nn
from PIL import Image

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
frames = []
for step in range(3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    frames.append(Image.new("RGB", (8, 8)))
fig = plt.figure()
anim = animation.FuncAnimation(fig, lambda i: None, frames=3)
out_dir = "runs"
out_prefix = "runs/train"
gif = "train.gif"
"""

WRITES = [
    'frames[0].save("train.gif", save_all=True, append_images=frames[1:], loop=0)',
    'frames[0].save(os.path.join(out_dir, "a.gif"), format="GIF", save_all=True)',
    'imageio.mimsave("{}/b.gif".format(out_dir), frames, duration=0.2)',
    'imageio.mimsave(out_prefix + ".gif", frames)',
    "imageio.mimwrite(gif, frames)",
    'imageio.mimsave(f"{out_dir}/c.gif", frames)',
    'anim.save("d.gif", writer="pillow")',
    'anim.save(filename="e.gif", writer=animation.PillowWriter(fps=2))',
    'plt.savefig(out_dir + "/loss.png")',
]


@pytest.mark.parametrize("write", WRITES)
def test_a_writer_the_gate_names_is_guarded(write):
    res = convert_source(HEAD + write + "\n", Options())
    assert not res.blocking, res.blocking  # the gate found nothing left on every rank
    lines = res.source.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith(write[:12]))
    assert lines[at - 1].strip() == "if RANK == 0:", "\n".join(lines[at - 3 : at + 2])


def test_an_optional_library_import_is_still_the_library():
    src = (
        "try:\n    import imageio.v2 as gifs\nexcept ImportError:  # optional\n"
        "    gifs = None\n" + HEAD + "if gifs is not None:\n"
        '    gifs.mimsave("samples/progress.gif", frames)\n'
    )
    res = convert_source(src, Options())
    assert not res.blocking, res.blocking
    assert '        gifs.mimsave("samples/progress.gif", frames)' in res.source
