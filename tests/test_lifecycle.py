"""The model's lifecycle: where the wrap goes, changes it cannot be placed after (DDP036), and
the two names: the wrapper (`ddp_model`) for the training forward, the plain module for every
other use. Blocking cases have no fixture pair (their output
is the unchanged input once blocking findings leave the file untouched), so they are here."""

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
    assert "DDP030" not in codes(r) and "DDP(" not in r.source
    f = next(f for f in r.findings if f.code == "DDP036")
    assert (HEAD + textwrap.dedent(UNFREEZE)).splitlines()[
        f.line - 1
    ].strip() == "model[0].requires_grad_(True)"
    assert "changes which parameters need gradients" in f.message


def test_freeze_by_parameter_loop_in_later_function_is_blocking():
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
    assert "DDP036" in codes(r) and "DDP(" not in r.source


def test_trainer_method_that_moves_the_model_later_is_blocking():
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
    assert "DDP036" in codes(r) and "DDP(" not in r.source


def test_changes_before_training_move_the_wrap_after_them():
    r = convert("""
        def init(m):
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight)

        def load_pretrained(net, path=None):
            if path:
                net.load_state_dict(torch.load(path))
            for p in net[0].parameters():
                p.requires_grad = False

        model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1)).to(device)
        model.apply(init)
        load_pretrained(model)
        model[1].weight.data.normal_(0, 0.02)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fit(model, opt)
    """)
    assert "DDP036" not in codes(r)
    wrap = line_of(r, "model = DDP(model")
    assert wrap == line_of(r, "model[1].weight.data.normal_") + 1
    assert "model.module" not in r.source


def test_load_after_training_is_not_a_late_change():
    r = convert("""
        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fit(model, opt)
        model.load_state_dict(torch.load("best.pt"))
    """)
    assert "DDP036" not in codes(r) and "fit(ddp_model, opt)" in r.source
    assert (
        "\nmodel.load_state_dict(torch.load(" in r.source and ".module" not in r.source
    )


def test_model_in_a_dict_is_named_for_a_manual_wrap():
    r = convert("""
        nets = {"G": nn.Linear(4, 4).to(device), "D": nn.Linear(4, 1).to(device)}
        opt_g = torch.optim.Adam(nets["G"].parameters(), lr=1e-3)
        for x, y in loader:
            opt_g.zero_grad()
            loss = nets["D"](nets["G"](x)).mean()
            loss.backward()
            opt_g.step()
    """)
    f = next(f for f in r.findings if f.code == "DDP034")
    assert 'nets["G"]' in f.message and "DDP(" not in r.source


def test_reloaded_model_and_its_helper_stay_plain():
    r = convert("""
        def width(net):
            return net.out_features

        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fit(model, opt)
        print(width(model))
        model = nn.Linear(4, 1)
        model.load_state_dict(torch.load("m.pt"))
        print(width(model), model.out_features)
    """)
    # the helper reads an attribute: the plain model before and after the reload, no .module
    assert (
        r.source.count("print(width(model))") == 1
        and "print(width(model), model.out_features)" in r.source
    )
    assert "fit(ddp_model, opt)" in r.source and ".module" not in r.source


def test_trainer_instance_model_stays_plain_outside_the_class():
    r = convert("""
        class Trainer:
            def __init__(self):
                self.model = nn.Linear(4, 1).to(device)
                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

            def fit(self):
                fit(self.model, self.opt)

        trainer = Trainer()
        trainer.fit()
        torch.save(trainer.model.state_dict(), "last.pt")
        print(trainer.model.out_features)
    """)
    assert (
        "self.ddp_model = DDP(self.model" in r.source
        and "fit(self.ddp_model, self.opt)" in r.source
    )
    assert (
        "trainer.model.state_dict()" in r.source
        and "trainer.model.out_features" in r.source
    )
    assert ".module" not in r.source


def test_setup_method_called_in_init_moves_the_wrap_after_it():
    r = convert("""
        class Trainer:
            def __init__(self):
                self.model = nn.Linear(4, 1)
                self._place_model()
                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

            def _place_model(self):
                self.model.to(device)
                nn.init.normal_(self.model.weight)

            def fit(self):
                fit(self.model, self.opt)

        Trainer().fit()
    """)
    assert "DDP036" not in codes(r)
    assert (
        line_of(r, "self.ddp_model = DDP(self.model")
        == line_of(r, "self._place_model()") + 1
    )


def test_same_placement_again_in_the_loop_is_not_a_late_change():
    r = convert("""
        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            model.to(device)
            fit(model, opt, epochs=1)
    """)
    assert "DDP036" not in codes(r) and "model = DDP(model" in r.source


def test_model_run_through_a_list_that_holds_it_is_blocking():
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
    assert codes(r).count("DDP038") == 2 and "DDP(" not in r.source


def test_list_only_read_after_training_keeps_the_wrap():
    r = convert("""
        encoder, decoder = nn.Linear(4, 2).to(device), nn.Linear(2, 1).to(device)
        parts = {"enc": encoder, "dec": decoder}
        ae = nn.Sequential(encoder, decoder)
        opt = torch.optim.Adam(list(encoder.parameters()) + list(decoder.parameters()), lr=1e-3)
        for x, y in loader:
            opt.zero_grad()
            loss = (decoder(encoder(x)) - y).pow(2).mean()
            loss.backward()
            opt.step()
        for k, part in parts.items():
            torch.save(part.state_dict(), k + ".pt")
    """)
    assert (
        "DDP038" not in codes(r)
        and "encoder = DDP(encoder" in r.source
        and "decoder = DDP(decoder" in r.source
    )


def test_traces_and_graphs_take_the_plain_module():
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
    assert (
        "torch.jit.trace(model, torch.randn(1, 4))" in r.source
        and ".module" not in r.source
    )


def test_fully_frozen_backbone_is_not_wrapped_and_the_head_is():
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
    assert (
        "DDP039" in codes(r)
        and "backbone = DDP(" not in r.source
        and "head = DDP(head" in r.source
    )


def test_partly_frozen_model_is_wrapped():
    r = convert("""
        model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1)).to(device)
        for name, p in model.named_parameters():
            if name.startswith("0."):
                p.requires_grad = False
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fit(model, opt)
    """)
    assert "DDP039" not in codes(r) and "model = DDP(model" in r.source


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
    assert (
        "self.aux is used in forward only under an if" in f.message
        and "self.body" not in f.message
    )
    assert "find_unused_parameters=True)" in r.source


def test_helper_called_before_and_after_the_wrap_gets_the_plain_model():
    r = convert("""
        def width(net):
            return net.out_features

        model = nn.Linear(4, 1)
        print(width(model))
        model.to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fit(model, opt)
        print(width(model))
    """)
    assert (
        r.source.index("print(width(model))")
        < r.source.index("ddp_model = DDP(model")
        < r.source.index("fit(ddp_model, opt)")
    )
    assert r.source.count("print(width(model))") == 2 and ".module" not in r.source


def test_function_reading_the_global_model_before_and_after_a_reload():
    r = convert("""
        def evaluate():
            with torch.no_grad():
                return model(torch.randn(2, 4)).sum().item() + model.out_features

        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            fit(model, opt, epochs=1)
            print(evaluate())
        model = torch.load("whole_model.pt")
        print(evaluate())
    """)
    # evaluation under no_grad reads the plain model, wrapped or reloaded alike
    assert (
        "+ model.out_features" in r.source
        and "return model(torch.randn(2, 4))" in r.source
    )
    assert ".module" not in r.source and "fit(ddp_model, opt, epochs=1)" in r.source


def test_syncbn_conversion_before_training_moves_the_wrap_and_after_it_blocks():
    before = convert("""
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)).to(device)
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fit(model, opt)
    """)
    assert (
        line_of(before, "model = DDP(model")
        == line_of(before, "convert_sync_batchnorm(model)") + 1
    )
    after = convert("""
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fit(model, opt)
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        fit(model, opt)
    """)
    f = next(f for f in after.findings if f.code == "DDP036")
    assert "converts its BatchNorm layers" in f.message and "DDP(" not in after.source


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
    assert (
        "outputs of model(...) are discarded" in f.message
        and "find_unused_parameters=True)" in r.source
    )


def test_a_local_name_for_the_wrapped_attribute_routes_its_training_forward():
    """minGPT's run(): `model, config = self.model, self.config` after __init__ wrapped
    self.model: the local alias keeps the plain model for the model's own methods, and its
    training forward runs through self.ddp_model."""
    from ddpify import Options, convert_source

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
    out = convert_source(src, Options(line_length=0)).source  # the statements unwrapped
    assert "self.ddp_model = DDP(self.model" in out, out
    assert "        model.describe(config)\n" in out, out
    assert "loss = ((self.ddp_model(x.to(self.device" in out and ".module" not in out
