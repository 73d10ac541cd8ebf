"""Side effects on every rank (issue 15): generated names never clash with the script's,
CUDA_VISIBLE_DEVICES, the one table of file writers, data preparation, rank-0-only trackers."""

from __future__ import annotations

import textwrap

import pytest

from ddpify import Options, convert_source
from ddpify.config import ConfigError, _parse_table

HEAD = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)  # seeded draws: the bodies below may add imports after them (DDP146 otherwise)
model = nn.Linear(4, 1)  # a device named (below): the GPU set-up, not a CPU program
device = "cpu"
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8, shuffle=True)
"""
LOOP = """
for epoch in range(2):
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def convert(body: str, head: str = HEAD, **options):
    # HEAD's model stays on the CPU (DDP035 would refuse): these tests are about side effects
    options.setdefault("ignore", ("DDP035",))
    return convert_source(head + textwrap.dedent(body), Options(**options))


def codes(result) -> list[str]:
    return [f.code for f in result.findings]


def fixed_point(result) -> None:
    again = convert_source(result.source, Options())
    assert not again.changed and again.status == "already-distributed"


# -- 1. generated names ------------------------------------------------------------------
def test_parameter_named_rank_in_a_function_renames_ddpifys_rank():
    res = convert(
        LOOP
        + """
def report(RANK):
    print("factor rank", RANK)

report(6)
"""
    )
    assert "DDP_RANK = int(" in res.source and "if DDP_RANK == 0:" in res.source
    assert (
        "def report(RANK):" in res.source and 'print("factor rank", RANK)' in res.source
    )
    assert (
        'os.environ.get("RANK", 0)' in res.source
    )  # the environment variable keeps its name
    assert "DDP004" in codes(res)
    fixed_point(res)


def test_taken_free_name_gets_a_suffix():
    res = convert("RANK = 6\nDDP_RANK = 7\n" + LOOP + "print(RANK, DDP_RANK)\n")
    assert "DDP_RANK_1 = int(" in res.source and "if DDP_RANK_1 == 0:" in res.source
    assert "RANK = 6\nDDP_RANK = 7\n" in res.source
    fixed_point(res)


def test_attribute_and_keyword_of_that_name_are_no_clash():
    res = convert(
        LOOP
        + "cfg = dict(RANK=6)\nprint(cfg, torch.Tensor.RANK if hasattr(torch.Tensor, 'RANK') else 0)\n"
    )
    assert "DDP004" not in codes(res)
    assert "\nRANK = int(" in res.source


def test_script_reading_rank_from_the_environment_is_no_clash():
    res = convert('import os\nRANK = int(os.environ.get("RANK", 0))\n' + LOOP)
    assert "DDP004" not in codes(res)


def test_helper_function_names_are_renamed():
    res = convert(LOOP + "def ddp_setup():\n    return 'mine'\n\nprint(ddp_setup())\n")
    assert (
        "def ddpify_ddp_setup():" in res.source
        and "\nddpify_ddp_setup()\n" in res.source
    )
    assert "def ddp_setup():\n    return 'mine'" in res.source
    fixed_point(res)


# -- 2. CUDA_VISIBLE_DEVICES -------------------------------------------------------------
@pytest.mark.parametrize(
    "line",
    [
        'os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"',
        'os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")',
        'os.environ.update({"CUDA_VISIBLE_DEVICES": "0"})',
        'os.environ.update(CUDA_VISIBLE_DEVICES="0")',
        'os.putenv("CUDA_VISIBLE_DEVICES", "0")',
    ],
)
def test_visible_devices_kept_for_plain_runs_only(line):
    res = convert("", head="import os\n" + line + "\n" + HEAD + LOOP)
    assert f'if "LOCAL_RANK" not in os.environ:\n    {line}\n' in res.source
    assert any(f.code == "DDP012" and f.fixed for f in res.findings)


def test_visible_devices_set_with_other_variables_is_reported():
    res = convert(
        "",
        head='import os\nos.environ.update({"CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "4"})\n'
        + HEAD
        + LOOP,
    )
    assert any(f.code == "DDP012" and not f.fixed for f in res.findings)
    assert 'if "LOCAL_RANK" not in os.environ' not in res.source


# -- 3. one table of file writers --------------------------------------------------------
@pytest.mark.parametrize(
    "imports,line",
    [
        ("import numpy as np", 'np.save("emb.npy", emb)'),
        ("import numpy as np", "np.savetxt(out_path, [1.0])"),
        ("import pandas as pd", 'pd.DataFrame({"a": [1]}).to_csv("m.csv")'),
        ("import matplotlib.pyplot as plt", 'plt.savefig("curve.png")'),
        ("import matplotlib.pyplot as plt", 'fig.savefig(f"curve{epoch}.png")'),
        (
            "from torchvision.utils import save_image",
            'save_image(torch.zeros(1, 3, 4, 4), "grid.png")',
        ),
        ("import cv2", 'cv2.imwrite("x.png", img)'),
        ("import imageio", 'imageio.imwrite("x.png", img)'),
        ("from PIL import Image", 'Image.fromarray(img).save("sample.png")'),
        ("import shutil", 'shutil.rmtree("old_runs")'),
        ("import shutil", 'shutil.copytree("ckpt", "backup")'),
        ("import os", 'os.remove("stale.pt")'),
        ("import tarfile", 'tarfile.open("a.tar").extractall("data")'),
        ("import zipfile", 'zipfile.ZipFile("a.zip").extractall("data")'),
    ],
)
def test_library_writer_runs_on_rank_0_only(imports, line):
    res = convert(LOOP + line + "\n", head=imports + "\n" + HEAD)
    assert f"if RANK == 0:\n    {line}\n" in res.source, res.source
    assert "DDP060" in codes(res) or "DDP073" in codes(
        res
    )  # an extraction is data preparation


@pytest.mark.parametrize(
    "line",
    [
        'names = df["path"].str.extract(r"(\\d+)")',
        "other.save_state = None",
        "text.save()",
        'torch.save({"w": 1}, buffer)',
        "text = df.to_csv()",
    ],
)
def test_non_writers_are_left_alone(line):
    res = convert(LOOP + "import io\nbuffer = io.BytesIO()\n" + line + "\n")
    assert f"\n{line}\n" in res.source
    assert not {"DDP060", "DDP064"} & {f.code for f in res.findings if f.line > 15}


def test_user_declared_writer_from_options_and_config():
    res = convert(
        LOOP + 'dump_results(model, "results.bin")\n',
        head="from mylib import dump_results\n" + HEAD,
        writers=("mylib.dump_results",),
    )
    assert 'if RANK == 0:\n    dump_results(model, "results.bin")\n' in res.source
    plain = convert(
        LOOP + 'dump_results(model, "results.bin")\n',
        head="from mylib import dump_results\n" + HEAD,
    )
    assert '\ndump_results(model, "results.bin")\n' in plain.source
    assert _parse_table("pyproject.toml", {"writers": ["mylib.dump_results"]}).values[
        "writers"
    ] == ("mylib.dump_results",)
    with pytest.raises(ConfigError):
        _parse_table("pyproject.toml", {"writers": "mylib.dump_results"})


def test_file_handler_writes_to_devnull_elsewhere():
    res = convert(
        LOOP
        + 'import logging\nlogging.getLogger().addHandler(logging.FileHandler("train.log"))\n'
    )
    assert 'logging.FileHandler("train.log" if RANK == 0 else os.devnull)' in res.source


def test_one_line_if_writer_is_guarded_whole():
    res = convert(
        LOOP + 'if loss.item() < 1: torch.save(model.state_dict(), "best.pt")\n'
    )
    assert (
        'if RANK == 0:\n    if loss.item() < 1: torch.save(model.state_dict(), "best.pt")\n'
        in res.source
    )


def test_writer_that_cannot_be_guarded_is_reported():
    res = convert(
        LOOP
        + 'saved = [torch.save(p, f"p{i}.pt") for i, p in enumerate(model.parameters())]\n'
    )
    assert "DDP064" in codes(res)


# -- 4. data preparation -----------------------------------------------------------------
def test_dataset_download_is_done_by_rank_0_first():
    res = convert(
        'from torchvision import datasets\ntrain_set = datasets.MNIST("data", train=True, download=True)\nn = len(train_set)\n'
        + LOOP
    )
    assert (
        "if RANK != 0:\n    dist.barrier()  # rank 0 prepares the data first\n"
        'train_set = datasets.MNIST("data", train=True, download=True)\n'
        "if RANK == 0:\n    dist.barrier()"
    ) in res.source
    assert "DDP073" in codes(res)
    # a data set no later statement reads: rank 0 alone downloads it, every rank waits after it
    res = convert(
        'from torchvision import datasets\ntrain_set = datasets.MNIST("data", train=True, download=True)\n'
        + LOOP
    )
    assert (
        'if RANK == 0:\n    train_set = datasets.MNIST("data", train=True, download=True)\n'
        "dist.barrier()  # rank 0 prepares the data"
    ) in res.source


def test_prepare_block_in_a_loop_gets_no_barrier():
    res = convert(
        LOOP
        + textwrap.dedent("""
        import os
        for name in ["a", "b"]:
            if not os.path.exists(name):
                open(name, "w").write("x")
    """)
    )
    assert "DDP073" not in codes(res)


def test_module_level_preparation_sets_up_the_group_first():
    prep = 'import os, urllib.request\nif not os.path.exists("data.bin"):\n    urllib.request.urlretrieve("https://example.com/data.bin", "data.bin")\n'
    res = convert(
        prep
        + "\ndef main():"
        + textwrap.indent(LOOP, "    ")
        + '\nif __name__ == "__main__":\n    main()\n'
    )
    assert res.source.index("\nddp_setup()\n") < res.source.index("dist.barrier()")


# -- 5. objects that exist on rank 0 only ------------------------------------------------
TRACKED = """\
from torch.utils.tensorboard import SummaryWriter


def train_epoch(tb, step):
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        tb.add_scalar("loss", loss.item(), step)
        step += 1
    return step


def main():
    writer = SummaryWriter("runs/x")
    step = 0
    for epoch in range(2):
        step = train_epoch(writer, step)
    {use}
    writer.close()


main()
"""


def test_tracker_passed_to_a_helper_is_guarded_there():
    res = convert(TRACKED.format(use="pass"))
    assert (
        'if RANK == 0:\n            tb.add_scalar("loss", loss.item(), step)'
        in res.source
    )
    assert "DDP063" not in codes(res)


def test_tracker_used_unguarded_is_reported():
    res = convert(TRACKED.format(use="logdir = writer.log_dir"))
    assert "DDP063" in codes(res)
    ok = convert(
        TRACKED.format(use="logdir = writer.log_dir if writer is not None else None")
    )
    assert "DDP063" not in codes(ok)


def test_local_variable_named_dist_does_not_hide_torch_distributed():
    res = convert(
        LOOP
        + textwrap.dedent("""
        def nearest(a, b):
            dist = ((a - b) ** 2).sum()
            state = torch.load("centroids.pt")
            return dist, state
    """)
    )
    assert "torch.distributed.barrier()" in res.source and "\ndist." not in res.source
    assert "import torch.distributed as dist" not in res.source


def test_path_open_for_writing_goes_to_devnull_elsewhere():
    res = convert(
        LOOP
        + 'from pathlib import Path\nout = Path("runs")\nwith (out / "log.txt").open("w") as f:\n    f.write("done")\n',
        line_length=0,
    )  # the statement unwrapped
    assert (
        'with ((out / "log.txt") if RANK == 0 else type((out / "log.txt"))(os.devnull)).open("w") as f:'
        in res.source
    )
    made = convert(
        LOOP
        + 'from pathlib import Path\nwith Path("runs").joinpath("x").open("a") as f:\n    f.write("done")\n'
    )
    assert "DDP064" in codes(made)


@pytest.mark.parametrize(
    "line,path",
    [
        (
            'with tarfile.open("ckpt.tar.gz", "w:gz") as tar:\n    tar.add("ckpt")\n',
            '"ckpt.tar.gz"',
        ),
        (
            'with zipfile.ZipFile("preds.zip", mode="w") as z:\n    z.writestr("a.txt", "x")\n',
            '"preds.zip"',
        ),
        ('with gzip.open(out_path, "wt") as g:\n    g.write("x")\n', "out_path"),
    ],
)
def test_archive_opened_for_writing_goes_to_devnull_elsewhere(line, path):
    res = convert(LOOP + "import tarfile, zipfile, gzip\n" + line)
    assert f"{path} if RANK == 0 else os.devnull" in res.source
    read = convert(
        LOOP
        + 'import tarfile\nwith tarfile.open("data.tar.gz", "r:gz") as tar:\n    names = tar.getnames()\n'
    )
    assert "else os.devnull" not in read.source


def test_io_open_for_writing_goes_to_devnull_elsewhere():
    res = convert(
        LOOP + 'import io\nwith io.open("notes.txt", "w") as f:\n    f.write("x")\n'
    )
    assert 'io.open("notes.txt" if RANK == 0 else os.devnull, "w")' in res.source


@pytest.mark.parametrize(
    "use",
    [
        "writer.file_writer.flush()",
        'writer.file_writer.add_text("note", str(step))',
        'writer.meta["steps"] = step',
    ],
)
def test_statement_that_only_feeds_a_tracker_runs_on_rank_0(use):
    # seen on a real script: `experiment.config.update(...)` on every rank with experiment None there
    res = convert(TRACKED.format(use=use))
    assert "DDP063" not in codes(res) and res.status == "converted"
    assert f"    if RANK == 0:\n        {use}\n" in res.source


def test_tracker_value_kept_is_sent_from_rank0():
    res = convert(
        TRACKED.format(use="logdir = writer.log_dir")
    )  # the value is kept: other ranks need it
    assert (
        "logdir = rank0_value(lambda: writer.log_dir)" in res.source
        and res.status == "converted"
    )


@pytest.mark.parametrize(
    "use",
    [
        'writer.file_writer.add_text("n", str(train_epoch(writer, step)))',  # runs the model
        'writer.file_writer.add_text("n", str(next(iter(loader))))',  # moves an iterator
    ],
)
def test_tracker_use_that_a_guard_cannot_hold_is_refused(use):
    res = convert(TRACKED.format(use=use))
    assert "DDP063" in codes(res) and res.status == "refused"


@pytest.mark.parametrize(
    "line",
    [
        'with h5py.File("weights.h5", "w") as f:\n    f.create_dataset("w", data=[1.0])\n',
        'f = h5py.File(out_path, mode="a")\nf.close()\n',
        'arr = np.memmap("cache.dat", dtype="float32", mode="w+", shape=(4,))\n',
    ],
)
def test_any_other_call_opening_a_path_for_writing_refuses(line):
    """One rule, not a list of libraries: a path and a file mode that writes, on every rank, where
    ddpify does not know whether os.devnull would do: refused (DDP064), never written wrong."""
    res = convert(
        "import h5py\nimport numpy as np\nout_path = 'runs/log.h5'\n" + LOOP + line
    )
    assert res.status == "refused" and "DDP064" in codes(res), res.findings


@pytest.mark.parametrize(
    "line",
    [
        'import zipfile\nwith zipfile.ZipFile("preds.zip", "w") as z:\n    z.writestr("a.txt", "x")\n',
        'f = h5py.File("data/train.h5", "r")\n',
        'print(format_row("result.txt", "a"))\n',
    ],
)
def test_reading_a_file_or_a_second_string_that_is_data_is_no_opener(line):
    res = convert("import h5py\n" + LOOP + line)
    assert res.status == "converted" and "DDP064" not in codes(res), res.findings
