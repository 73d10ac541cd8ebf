"""Training forwards found by value flow from each backward (ddpify/analysis/loss_flow.py), and
what a conversion makes of them: every call of a model made distributed in place runs DDP's
hooks, so forwards stay as written; a method that never calls the model becomes an entry."""

from __future__ import annotations

import textwrap

from ddpify import Options, convert_source
from ddpify.analysis import Analysis, code
from ddpify.analysis.loss_flow import loss_flow
from ddpify.pipeline import parse

HEAD = """\
import copy
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
"""


def flow(body: str):
    src = HEAD + textwrap.dedent(body)
    a = Analysis(parse(src), src)
    return a, loss_flow(a)


def forwards(body: str) -> list[str]:
    a, f = flow(body)
    return [code(tf.call) for tf in f.forwards]


def convert(body: str):
    return convert_source(
        HEAD + textwrap.dedent(body), Options(line_length=0), path="t.py"
    )  # unwrapped


def test_through_assignments_functions_and_loss_functions():
    got = forwards("""
        def compute_loss(net, x, y):
            out = net(x)
            return nn.functional.mse_loss(out, y)

        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = compute_loss(model, x, y)
            with torch.no_grad():
                check = model(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """)
    assert got == ["net(x)"]  # the no_grad forward reaches no backward


def test_through_list_appends_detach_and_result_attributes():
    got = forwards("""
        G, D = nn.Linear(4, 4).to(device), nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(list(G.parameters()) + list(D.parameters()), lr=0.1)
        for x, y in loader:
            fake = G(x).detach()
            losses = []
            losses.append(D(fake).mean())
            stats = D(x)
            losses.append(stats.mean())
            loss = sum(losses)
            opt.zero_grad()
            loss.backward()
            opt.step()
    """)
    # G's output is detached where it is made: not G's training forward here
    assert got == ["D(fake)", "D(x)"]


def test_attributes_set_in_another_method():
    got = forwards("""
        class Holder:
            def __init__(self):
                self.net = nn.Linear(4, 1).to(device)
                self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)

            def forward(self, x):
                self.pred = self.net(x)

            def backward(self, y):
                self.loss = (self.pred - y).pow(2).mean()
                self.loss.backward()

            def step(self, x, y):
                self.forward(x)
                self.opt.zero_grad()
                self.backward(y)
                self.opt.step()

        h = Holder()
        for x, y in loader:
            h.step(x, y)
    """)
    assert got == ["self.net(x)"]


def test_method_other_than_forward_and_parameters_outside_forward():
    a, f = flow("""
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 1)
                self.w = nn.Parameter(torch.ones(1))
                self.scale = 2.0

            def forward(self, x):
                return self.fc(x)

            def loss(self, x, y):
                return (self(x) - y).pow(2).mean()

            def describe(self):
                return "net"

        model = Net().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = model.loss(x, y) * model.w * model.scale + len(model.describe())
            opt.zero_grad()
            loss.backward()
            opt.step()
    """)
    assert [(code(tf.call), tf.method) for tf in f.forwards] == [
        ("model.loss(x, y)", "loss")
    ]  # describe() runs no parameter
    assert [what for _, _, what in f.outside] == [
        "model.w"
    ]  # a parameter; model.scale is a float


def test_a_training_loss_by_a_method_that_calls_the_model_needs_nothing_more():
    r = convert("""
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 1)

            def forward(self, x):
                return self.fc(x)

            def loss(self, x, y):
                return (self(x) - y).pow(2).mean()

        model = Net().to(device)
        ema = copy.deepcopy(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = model.loss(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        torch.save(model, "net.pt")
    """)
    # self(x) in the method runs DDP's hooks: no entry
    assert "ddp_in_place(model)\nopt = torch.optim.SGD(" in r.source
    assert "loss = model.loss(x, y)" in r.source
    assert (
        "ema = copy.deepcopy(model)" in r.source
        and 'torch.save(model, "net.pt")' in r.source
    )


def test_a_training_loss_by_a_method_that_never_calls_the_model_is_an_entry():
    r = convert("""
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 1)

            def forward(self, x):
                return self.fc(x)

            def loss(self, x, y):
                return (self.fc(x) - y).pow(2).mean()

        model = Net().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = model.loss(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    """)
    assert (
        'ddp_in_place(model, ("loss",))' in r.source
        and "loss = model.loss(x, y)" in r.source
    )
    f = next(f for f in r.findings if f.code == "DDP030")
    assert ".loss() run DDP's hooks too" in f.message


def test_a_model_handed_to_a_library_function_runs_its_hooks_there():
    r = convert("""
        from torch.utils.checkpoint import checkpoint

        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = (checkpoint(model, x, use_reentrant=False) - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """)
    assert not r.blocking and "ddp_in_place(model)" in r.source
    assert "checkpoint(model, x, use_reentrant=False)" in r.source


def test_a_training_forward_under_skip_is_left_as_it_is_and_still_synchronised():
    r = convert("""
        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = (model(x) - y).pow(2).mean()  # ddpify: skip
            opt.zero_grad()
            loss.backward()
            opt.step()
    """)
    assert not r.blocking and "ddp_in_place(model)" in r.source
    assert "loss = (model(x) - y).pow(2).mean()  # ddpify: skip" in r.source


def test_a_function_that_trains_and_saves_keeps_its_model():
    r = convert("""
        def fit(net, opt, epochs):
            for epoch in range(epochs):
                for x, y in loader:
                    loss = (net(x) - y).pow(2).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                torch.save(net.state_dict(), "net.pt")

        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fit(model, opt, 2)
    """)
    assert "ddp_in_place(model)\nopt = torch.optim.SGD(" in r.source
    assert (
        "(net(x) - y)" in r.source
        and 'torch.save(net.state_dict(), "net.pt")' in r.source
    )
    assert "fit(model, opt, 2)" in r.source and ".module" not in r.source


def test_a_per_batch_step_reads_the_model_as_it_is():
    r = convert("""
        def step(net, opt, x, y):
            loss = (net(x) - y).pow(2).mean() * net.out_features
            opt.zero_grad()
            loss.backward()
            opt.step()

        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            for x, y in loader:
                step(model, opt, x, y)
        print(model.out_features)
    """)
    assert "step(model, opt, x, y)" in r.source and "* net.out_features" in r.source
    assert ".module" not in r.source


def test_a_name_bound_to_another_model_gets_its_own_wrap():
    r = convert("""
        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = (model(x) - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = (model(x) - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """)
    assert not r.blocking and r.source.count("ddp_in_place(model)\nopt =") == 2
    # a model built again in each pass of a loop is made distributed in each pass
    r = convert("""
        for fold in range(2):
            model = nn.Linear(4, 1).to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = (model(x) - y).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    """)
    assert not r.blocking and "\n    ddp_in_place(model)\n" in r.source


MODULE_HOLDER = """
    class Pair(nn.Module):
        def __init__(self{arg}):
            super().__init__()
            self.net = nn.Linear(4, 1)
            {move}
            self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)

        def step(self, x, y):
            loss = (self.net(x) - y).pow(2).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()

    pair = {build}
    for x, y in loader:
        pair.step(x, y)
    torch.save(pair.state_dict(), "pair.pt")
"""


def test_a_part_of_an_nn_module_is_made_distributed_in_place():
    for arg, move, build in (
        (", device", "self.to(device)", "Pair(device)"),
        (
            "",
            "pass",
            "Pair().to(device)",
        ),  # moved after __init__: before training, taken
    ):
        r = convert(MODULE_HOLDER.format(arg=arg, move=move, build=build))
        assert not r.blocking, r.findings
        assert "ddp_in_place(self.net)\n" in r.source and "self.net(x)" in r.source
        assert 'torch.save(pair.state_dict(), "pair.pt")' in r.source


RUNNER = """
    class Runner:
        def __init__(self):
            self.net = nn.Linear(4, 1).to(device)
            self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)

    def make_runner():
        return Runner()

    runner = {build}
    for x, y in loader:
        loss = (runner.net(x) - y).pow(2).mean()
        runner.opt.zero_grad()
        loss.backward()
        runner.opt.step()
    torch.save(runner.net.state_dict(), "net.pt")
"""


def test_an_instance_attribute_trained_outside_its_class():
    for build in ("Runner()", "make_runner()", "{'a': Runner()}['a']"):
        r = convert(RUNNER.format(build=build))
        assert not r.blocking, (build, r.findings)
        assert "ddp_in_place(self.net)" in r.source, build
        assert "loss = (runner.net(x) - y)" in r.source
        assert 'torch.save(runner.net.state_dict(), "net.pt")' in r.source


def test_a_forward_in_the_step_the_walk_cannot_follow_still_counts():
    # setattr hides the value from the walk: the call in the step still runs through the wrapper
    got = forwards("""
        import types
        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        box = types.SimpleNamespace()
        for x, y in loader:
            setattr(box, "out", model(x))
            loss = (box.out - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """)
    assert got == ["model(x)"]


def test_a_model_whose_optimizer_never_steps_is_not_made_distributed():
    r = convert("""
        teacher = nn.Linear(4, 1).to(device)
        t_opt = torch.optim.SGD(teacher.parameters(), lr=0.1)  # built, never stepped here
        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            with torch.no_grad():
                target = teacher(x)
            loss = (model(x) - target).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """)
    assert "ddp_in_place(model)" in r.source and "ddp_in_place(teacher" not in r.source
    assert not r.blocking
    f = next(f for f in r.findings if f.code == "DDP030" and "`teacher`" in f.message)
    assert not f.fixed and "no optimizer over its parameters steps" in f.message
