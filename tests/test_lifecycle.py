"""The model's lifecycle under DDP applied in place: DDP starts at the model's first forward, so
every change before training is taken as it is, and a change while it trains is refused
(DDP036); the model keeps its one name everywhere. Blocking cases have no fixture pair (their
output is the unchanged input once blocking findings leave the file untouched), so they are
here."""

from __future__ import annotations

import textwrap

from ddpify import Options, convert_source

HEAD = """\
import copy
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)


def fit(net, opt, epochs=2):
    for epoch in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            loss = (net(x) - y).pow(2).mean()
            loss.backward()
            opt.step()
"""


def convert(body: str):
    src = HEAD + textwrap.dedent(body)
    return convert_source(src, Options(), path="t.py")


def codes(result) -> list[str]:
    return [f.code for f in result.findings]


def line_of(result, text: str) -> int:
    return next(i for i, ln in enumerate(result.source.splitlines(), 1) if text in ln)


UNFREEZE = """
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1)).to(device)
    model[0].requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        if epoch == 1:
            model[0].requires_grad_(True)
        for x, y in loader:
            opt.zero_grad()
            loss = (model(x) - y).pow(2).mean()
            loss.backward()
            opt.step()
"""


def test_unfreeze_in_training_loop_is_blocking():
    r = convert(UNFREEZE)
    assert "DDP036" in codes(r)
    assert "DDP030" not in codes(r) and "ddp_in_place(" not in r.source
    f = next(f for f in r.findings if f.code == "DDP036")
    assert (HEAD + textwrap.dedent(UNFREEZE)).splitlines()[
        f.line - 1
    ].strip() == "model[0].requires_grad_(True)"
    assert "changes which parameters need gradients" in f.message
    assert "while it trains" in f.message


def test_unfreeze_between_two_trainings_is_blocking():
    r = convert("""
        def unfreeze(net):
            for p in net.parameters():
                p.requires_grad = True

        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fit(model, opt)
        unfreeze(model)
        fit(model, opt)
    """)
    assert "DDP036" in codes(r) and "ddp_in_place(" not in r.source


def test_trainer_method_that_moves_the_model_between_trainings_is_blocking():
    r = convert("""
        class Trainer:
            def __init__(self):
                self.model = nn.Linear(4, 1).to(device)
                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

            def to_half(self):
                self.model.half()

            def fit(self):
                for x, y in loader:
                    self.opt.zero_grad()
                    loss = (self.model(x) - y).pow(2).mean()
                    loss.backward()
                    self.opt.step()

        trainer = Trainer()
        trainer.fit()
        trainer.to_half()
        trainer.fit()
    """)
    assert "DDP036" in codes(r) and "ddp_in_place(" not in r.source


def test_a_method_never_called_is_no_change():
    r = convert("""
        class Trainer:
            def __init__(self):
                self.model = nn.Linear(4, 1).to(device)
                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

            def to_half(self):
                self.model.half()

            def fit(self):
                for x, y in loader:
                    self.opt.zero_grad()
                    loss = (self.model(x) - y).pow(2).mean()
                    loss.backward()
                    self.opt.step()

        Trainer().fit()
    """)
    assert "DDP036" not in codes(r) and "ddp_in_place(self.model)" in r.source


def test_changes_before_training_are_taken_as_they_are():
    r = convert("""
        def init(m):
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight)

        def load_pretrained(net, path=None):
            if path:
                net.load_state_dict(torch.load(path))
            for p in net[0].parameters():
                p.requires_grad = False

        model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model.to(device)
        model.apply(init)
        load_pretrained(model)
        model[1].weight.data.normal_(0, 0.02)
        fit(model, opt)
    """)
    assert "DDP036" not in codes(r)
    # DDP starts at the first forward: the changes after its optimizer are taken too
    assert line_of(r, "ddp_in_place(model)") + 1 == line_of(r, "opt = torch.optim.SGD(")
    assert ".module" not in r.source and "fit(model, opt)" in r.source


def test_a_device_move_at_the_start_of_the_training_method_is_no_change():
    r = convert("""
        class Trainer:
            def __init__(self, model):
                self.model = model
                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

            def train(self):
                self.model.to(device)
                for epoch in range(2):
                    for x, y in loader:
                        self.opt.zero_grad()
                        loss = (self.model(x) - y).pow(2).mean()
                        loss.backward()
                        self.opt.step()

        Trainer(nn.Linear(4, 1)).train()
    """)
    assert "DDP036" not in codes(r) and "ddp_in_place(self.model)" in r.source


def test_copies_and_second_instances_are_not_the_trained_model():
    r = convert("""
        model = nn.Linear(4, 1).to(device)
        ema = copy.deepcopy(model)
        for p in ema.parameters():
            p.requires_grad_(False)
        teacher = nn.Linear(4, 1).to(device)
        teacher.requires_grad_(False)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            opt.zero_grad()
            loss = (model(x) - y).pow(2).mean() + (model(x) - teacher(x)).pow(2).mean()
            loss.backward()
            opt.step()
            with torch.no_grad():
                for e, p in zip(ema.parameters(), model.parameters()):
                    e.mul_(0.99).add_(p, alpha=0.01)
                    teacher.weight.data.mul_(0.5)
    """)
    assert not any(f.blocking for f in r.findings), r.findings
    assert "ddp_in_place(model)" in r.source and "ddp_in_place(ema" not in r.source
    assert "ddp_in_place(teacher" not in r.source


def test_an_auxiliary_model_whose_optimizer_never_steps_is_left_alone():
    r = convert("""
        model = nn.Linear(4, 1).to(device)
        probe = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        probe_opt = torch.optim.SGD(probe.parameters(), lr=0.1)
        fit(model, opt)
    """)
    assert not any(f.blocking for f in r.findings)
    assert "ddp_in_place(model)" in r.source and "ddp_in_place(probe)" not in r.source
    note = next(f for f in r.findings if f.code == "DDP030" and "probe" in f.message)
    assert "no optimizer over its parameters steps" in note.message


def test_load_after_training_is_not_a_late_change():
    r = convert("""
        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fit(model, opt)
        model.load_state_dict(torch.load("best.pt"))
    """)
    assert "DDP036" not in codes(r) and "fit(model, opt)" in r.source
    assert (
        "\nmodel.load_state_dict(torch.load(" in r.source and ".module" not in r.source
    )


def test_models_in_a_dict_are_each_made_distributed():
    r = convert("""
        nets = {"G": nn.Linear(4, 4).to(device), "D": nn.Linear(4, 1).to(device)}
        opt = torch.optim.Adam(
            [p for net in nets.values() for p in net.parameters()], lr=1e-3
        )
        for x, y in loader:
            opt.zero_grad()
            loss = nets["D"](nets["G"](x)).mean()
            loss.backward()
            opt.step()
    """)
    assert not any(f.blocking for f in r.findings), r.findings
    assert "for net in nets.values():\n    ddp_in_place(net)" in r.source


def test_models_run_through_a_list_that_holds_them():
    r = convert("""
        encoder, decoder = nn.Linear(4, 2).to(device), nn.Linear(2, 1).to(device)
        nets = [encoder, decoder]
        opt = torch.optim.Adam(list(encoder.parameters()) + list(decoder.parameters()), lr=1e-3)
        for x, y in loader:
            opt.zero_grad()
            loss = (nets[1](nets[0](x)) - y).pow(2).mean()
            loss.backward()
            opt.step()
    """)
    assert not any(f.blocking for f in r.findings), r.findings
    assert "ddp_in_place(encoder)\nddp_in_place(decoder)\nopt =" in r.source


def test_the_same_placement_again_in_the_loop_is_no_change():
    r = convert("""
        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            model.to(device)
            fit(model, opt, epochs=1)
    """)
    assert "DDP036" not in codes(r) and "ddp_in_place(model)" in r.source


def test_traces_and_graphs_keep_the_model():
    r = convert("""
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter()
        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fit(model, opt)
        writer.add_graph(model, torch.randn(1, 4))
        traced = torch.jit.trace(model, torch.randn(1, 4))
    """)
    assert "writer.add_graph(model, torch.randn(1, 4))" in r.source
    assert "torch.jit.trace(model, torch.randn(1, 4))" in r.source
    assert ".module" not in r.source


def test_fully_frozen_backbone_is_not_made_distributed_and_the_head_is():
    r = convert("""
        torch.manual_seed(0)
        backbone = nn.Linear(4, 8).to(device)
        for p in backbone.parameters():
            p.requires_grad = False
        head = nn.Linear(8, 1).to(device)
        opt = torch.optim.SGD(list(backbone.parameters()) + list(head.parameters()), lr=0.1)
        for x, y in loader:
            opt.zero_grad()
            loss = (head(backbone(x)) - y).pow(2).mean()
            loss.backward()
            opt.step()
    """)
    assert "DDP039" in codes(r)
    assert "ddp_in_place(backbone)" not in r.source and "ddp_in_place(head)" in r.source


def test_partly_frozen_model_is_made_distributed():
    r = convert("""
        model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1)).to(device)
        for name, p in model.named_parameters():
            if name.startswith("0."):
                p.requires_grad = False
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fit(model, opt)
    """)
    assert "DDP039" not in codes(r) and "ddp_in_place(model)" in r.source


def test_head_used_on_some_steps_sets_find_unused_parameters():
    r = convert("""
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Linear(4, 8)
                self.head = nn.Linear(8, 1)
                self.aux = nn.Linear(8, 1)

            def forward(self, x, use_aux=False):
                h = self.body(x)
                if self.training:
                    h = h * 1.0
                if use_aux:
                    return self.aux(h)
                return self.head(h)

        model = Net().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fit(model, opt)
    """)
    f = next(f for f in r.findings if f.code == "DDP037")
    assert "self.aux is used in forward only under an if" in f.message
    assert "self.body" not in f.message
    assert "ddp_in_place(model, find_unused_parameters=True)" in r.source


def test_syncbn_conversion_before_training_is_taken_and_during_it_blocks():
    before = convert("""
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)).to(device)
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fit(model, opt)
    """)
    assert line_of(before, "ddp_in_place(model)") == line_of(before, "opt = torch") - 1
    after = convert("""
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fit(model, opt)
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        fit(model, opt)
    """)
    f = next(f for f in after.findings if f.code == "DDP036")
    assert "converts its BatchNorm layers" in f.message
    assert "ddp_in_place(" not in after.source


def test_discarded_training_outputs_set_find_unused_parameters():
    r = convert("""
        class TwoOut(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(4, 1)
                self.b = nn.Linear(4, 1)

            def forward(self, x):
                return self.a(x), self.b(x)

        model = TwoOut().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            opt.zero_grad()
            out, _ = model(x)
            loss = (out - y).pow(2).mean()
            loss.backward()
            opt.step()
    """)
    f = next(f for f in r.findings if f.code == "DDP037")
    assert "outputs of model(...) are discarded" in f.message
    assert "find_unused_parameters=True)" in r.source


def test_a_local_name_for_the_model_attribute_needs_nothing():
    """minGPT's run(): `model, config = self.model, self.config`: one object under both names,
    its own methods and its training forward stay as they are."""
    src = """import torch
import torch.nn as nn
from torch.utils.data import DataLoader


class Trainer:
    def __init__(self, model, data, config):
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = model.to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.data, self.config = data, config

    def run(self):
        model, config = self.model, self.config
        model.describe(config)
        loader = DataLoader(self.data, batch_size=8, shuffle=True)
        for epoch in range(2):
            for x, y in loader:
                loss = ((model(x.to(self.device)) - y.to(self.device)) ** 2).mean()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()


if __name__ == "__main__":
    Trainer(nn.Linear(4, 1), [], None).run()
"""
    out = convert_source(src, Options(line_length=0)).source
    assert "        ddp_in_place(self.model)\n        self.optimizer =" in out, out
    assert "        model.describe(config)\n" in out, out
    assert "loss = ((model(x.to(self.device" in out and ".module" not in out
