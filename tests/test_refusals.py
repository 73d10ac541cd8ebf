"""Refuse only what an engineer would have to restructure (issue 27): each kind of refusal seen on
code from outside the corpus, by a general rule. Optimizers chosen by name, loaders built by
factories and DataLoader subclasses, demo blocks of library modules, trackers ddpify itself made
rank-0-only, scripts that only import a model class."""

from __future__ import annotations

import pytest

from ddpify import Options, convert_source
from ddpify.analysis.core import Analysis

import libcst as cst

MODEL = """\
import functools
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
x = torch.randn(64, 3)
loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)
net = nn.Linear(3, 1).to(device)
"""
LOOP = """
for epoch in range(2):
    for xb, yb in loader:
        loss = nn.functional.mse_loss(net(xb.to(device)), yb.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


@pytest.mark.parametrize(
    "build",
    [
        "opt = getattr(torch.optim, 'SGD')(net.parameters(), lr=0.1)",
        "cls = getattr(torch.optim, NAME)\nopt = cls(net.parameters(), lr=0.1)",
        "OPTS = {'sgd': torch.optim.SGD, 'adam': torch.optim.Adam}\nopt = OPTS[NAME](net.parameters(), lr=0.1)",
        "OPTS = {'sgd': lambda p: torch.optim.SGD(p, lr=0.1)}\nopt = OPTS[NAME](net.parameters())",
        "OPTS = [functools.partial(torch.optim.SGD, lr=0.1)]\nopt = OPTS[0](net.parameters())",
        "def make(params):\n    o = torch.optim.SGD(params, lr=0.1)\n    return o\n\n\nopt = make(net.parameters())",
        "def init_obj(name, module, *args):\n    return getattr(module, name)(*args)\n\n\nopt = init_obj(NAME, torch.optim, net.parameters())",
    ],
)
def test_an_optimizer_chosen_by_name_still_names_its_model(build):
    src = MODEL + "NAME = 'SGD'\n" + build + "\n" + LOOP
    a = Analysis(cst.parse_module(src))
    assert a.models == ["net"], a.models
    res = convert_source(src, Options())
    assert not res.blocking, [f.message for f in res.blocking]
    assert "ddp_in_place(net)" in res.source


@pytest.mark.parametrize(
    "other",
    [
        "count = sum(p.numel() for p in net.parameters())",
        "ema = torch.optim.swa_utils.AveragedModel(net)",
        "stats = describe(net.parameters())",
    ],
)
def test_other_uses_of_the_parameters_are_not_optimizers(other):
    src = (
        MODEL
        + "def describe(ps):\n    return len(list(ps))\n\n\n"
        + other
        + "\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        + LOOP
    )
    a = Analysis(cst.parse_module(src))
    assert a.models == ["net"] and list(a.optimizers) == ["opt"], (
        a.models,
        a.optimizers,
    )


TRAIN_PY = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


class Trainer:
    def __init__(self, net):
        self.net = net
        self.opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def fit(self, loader):
        for epoch in range(2):
            for xb, yb in loader:
                loss = nn.functional.cross_entropy(self.net(xb), yb)
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
            print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    x = torch.randn(64, 4)
    loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=8, shuffle=True)
    net = Net()
    Trainer(net).fit(loader)
"""
INFER_PY = """\
import torch

from train import Net

if __name__ == "__main__":
    net = Net()
    net.load_state_dict(torch.load("net.pt"))
    with torch.no_grad():
        print(net(torch.randn(3, 4)).argmax(1))
"""


def test_a_script_that_only_imports_the_model_class_is_not_a_training_program(tmp_path):
    from ddpify.project import convert_project

    (tmp_path / "train.py").write_text(TRAIN_PY)
    (tmp_path / "infer.py").write_text(INFER_PY)
    res = convert_project(str(tmp_path / "infer.py"))
    assert res.status == "not-training"
    assert all(not r.changed for r in res.files)
    assert [f.code for r in res.files for f in r.findings] == [
        "DDP099"
    ]  # nothing said about train.py
    # an entry that runs the training script's Trainer is a training program
    (tmp_path / "run.py").write_text(
        INFER_PY.replace(
            "from train import Net", "from train import Net, Trainer"
        ).replace(
            "    net.load_state_dict",
            "    Trainer(net).fit([(torch.randn(8, 4), torch.zeros(8, dtype=torch.long))])\n    net.load_state_dict",
        )
    )
    assert convert_project(str(tmp_path / "run.py")).status != "not-training"


def test_the_directory_converts_the_training_script_and_leaves_the_inference_script(
    tmp_path,
):
    import subprocess
    import sys

    (tmp_path / "train.py").write_text(TRAIN_PY)
    (tmp_path / "infer.py").write_text(INFER_PY)
    run = subprocess.run(
        [sys.executable, "-m", "ddpify", "--check", "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1, run.stderr  # train.py would change; nothing blocks
    assert (
        "infer.py:1:1: DDP099" in run.stderr and "would convert train.py" in run.stderr
    ), run.stderr
    assert "[blocking]" not in run.stderr


TRACKED = """\
import os
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.tensorboard import SummaryWriter

x = torch.randn(64, 3)
loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)
model = nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
writer = SummaryWriter("runs/a")
"""


@pytest.mark.parametrize(
    "use, where",
    [
        ("out = writer.log_dir\n", "top"),
        ("out = os.path.join(writer.get_logdir(), 'x.pt')\n", "top"),
        ("        out = writer.log_dir + str(epoch)\n", "loop"),
    ],
)
def test_a_value_read_from_a_tracker_ddpify_made_rank0_only_is_sent_from_rank0(
    use, where
):
    loop = "for epoch in range(2):\n    for xb, yb in loader:\n        loss = nn.functional.mse_loss(model(xb), yb)\n        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
    src = (
        TRACKED
        + (use + loop if where == "top" else loop + use)
        + "torch.save(model.state_dict(), out)\n"
    )
    res = convert_source(src, Options())
    assert not res.blocking, [f.message for f in res.blocking]
    assert (
        "rank0_value(lambda: writer." in res.source
        and "def rank0_value(read):" in res.source
    )
    assert [f.fixed for f in res.findings if f.code == "DDP063"] == [True]


def test_a_tracker_read_in_a_lambda_is_still_refused_with_its_reason():
    src = (
        TRACKED
        + "names = []\ncb = lambda e: names.append(writer.log_dir)\nfor epoch in range(2):\n    for xb, yb in loader:\n        loss = nn.functional.mse_loss(model(xb), yb)\n        opt.zero_grad()\n        loss.backward()\n        opt.step()\n    cb(epoch)\n"
    )
    res = convert_source(src, Options())
    assert [f.code for f in res.blocking] == ["DDP063"] and "a lambda" in res.blocking[
        0
    ].message


def test_a_tracker_used_only_where_rank0_runs_needs_nothing():
    src = (
        TRACKED
        + "def report(path):\n    torch.save({'dir': writer.log_dir}, path)\n\n\nfor epoch in range(2):\n    for xb, yb in loader:\n        loss = nn.functional.mse_loss(model(xb), yb)\n        opt.zero_grad()\n        loss.backward()\n        opt.step()\nreport('r.pt')\n"
    )
    res = convert_source(src, Options())
    assert not res.blocking and "rank0_value" not in res.source, [
        f.message for f in res.findings if f.code == "DDP063"
    ]


def test_loader_factories_and_subclasses_are_followed():
    src = (
        MODEL.replace(
            "loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)\n",
            """
class Shuffled(DataLoader):
    def __init__(self, ds, **kw):
        super().__init__(ds, shuffle=True, **kw)


def make(kind):
    return Shuffled(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8) if kind else None


loader = make(1)
""",
        )
        + "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        + LOOP
    )
    res = convert_source(src, Options())
    assert not res.blocking, [f.message for f in res.blocking]
    assert "super().__init__(ds, sampler=DistributedSampler(ds), **" in res.source
    assert "loader.sampler.set_epoch(epoch)" in res.source


def test_a_loader_built_from_keywords_alone_is_sharded():
    src = MODEL.replace(
        "loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)",
        "cfg = dict(dataset=TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)\nloader = DataLoader(**cfg)",
    )
    res = convert_source(
        src + "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n" + LOOP, Options()
    )
    assert (
        'DataLoader(**{**cfg, "shuffle": False}, sampler=DistributedSampler(cfg["dataset"], shuffle=cfg.get("shuffle", False))'
        in res.source
        or 'sampler=DistributedSampler(cfg["dataset"], shuffle=cfg.get("shuffle", False))'
        in res.source
    ), res.source


def test_loaders_from_a_module_picked_by_eval(tmp_path):
    from ddpify.project import convert_project

    (tmp_path / "datasets.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n\n"
        "def blobs(bs):\n    x = torch.randn(40, 2)\n    return DataLoader(TensorDataset(x, x[:, :1]), batch_size=bs, shuffle=True)\n"
    )
    (tmp_path / "train.py").write_text(
        "import datasets\n"
        + MODEL.replace(
            "loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)\n",
            "NAME = 'blobs'\nloader = eval('datasets.' + NAME)(8)\n",
        ).replace("nn.Linear(3, 1)", "nn.Linear(2, 1)")
        + "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        + LOOP
    )
    res = convert_project(str(tmp_path / "train.py"))
    assert res.status == "converted", [f.message for f in res.blocking]
    out = {r.path.rsplit("/", 1)[-1]: r.output for r in res.files}
    assert (
        "sampler=DistributedSampler(" in out["datasets.py"]
        and "loader.sampler.set_epoch(epoch)" in out["train.py"]
    )


def test_set_epoch_where_the_pass_is_one_call_away():
    """The epoch loop calls a method of a built object (trainer.train_epoch()), a loader built
    inline as an argument (fit(model, DataLoader(...))), a comprehension over the loader."""
    base = MODEL.replace(
        "loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)\n",
        "",
    )
    step = "        loss = nn.functional.mse_loss(net(xb), yb)\n        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
    cases = {
        "trainer.loader.sampler.set_epoch(epoch)": "class T:\n    def __init__(self, loader):\n        self.loader = loader\n\n    def one(self):\n        for xb, yb in self.loader:\n"
        + step.replace("        ", "            ")
        + "\n\ntrainer = T(DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True))\n"
        "for epoch in range(2):\n    trainer.one()\n",
        "    loader.sampler.set_epoch(epoch)": "def fit(loader):\n    for epoch in range(2):\n        for xb, yb in loader:\n"
        + step.replace("        ", "            ")
        + "\n\nfit(DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True))\n",
        "    train_loader.sampler.set_epoch(epoch)": "def step_on(xb, yb):\n"
        + step.replace("        ", "    ")
        + "    return loss.item()\n\n\n"
        "train_loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)\n"
        "for epoch in range(2):\n    losses = [step_on(xb, yb) for xb, yb in train_loader]\n",
    }
    for expected, body in cases.items():
        src = base + "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n" + body
        res = convert_source(src, Options())
        assert not res.blocking, (body, [f.message for f in res.blocking])
        assert expected in res.source, res.source


def test_loaders_returned_as_one_tuple_and_picked_by_index():
    """dloader = get_loaders(); Trainer(dloader) keeps self.train_loader = data_loader[0]."""
    src = (
        MODEL.replace(
            "loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)\n",
            """
def get_loaders():
    train = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)
    valid = DataLoader(TensorDataset(x[:8], x[:8].sum(1, keepdim=True)), batch_size=8)
    return train, valid


class T:
    def __init__(self, data_loader):
        self.train_loader = data_loader[0]
        self.valid_loader = data_loader[1]

    def fit(self):
        for epoch in range(2):
            for xb, yb in self.train_loader:
                loss = nn.functional.mse_loss(net(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()


dloader = get_loaders()
""",
        )
        + "opt = torch.optim.SGD(net.parameters(), lr=0.1)\nT(dloader).fit()\n"
    )
    res = convert_source(src, Options())
    assert not res.blocking, [f.message for f in res.blocking]
    assert "self.train_loader.sampler.set_epoch(epoch)" in res.source
