"""Training forwards found by value flow from each backward (ddpify/analysis/loss_flow.py), and how
each reaches the wrapper (ddpify/analysis/routes.py): the calls that change, and those that stay."""

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


def test_training_loss_by_method_routes_through_the_adapter_and_keeps_other_uses():
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
    assert (
        "ddp_model = DDP(ForwardTo(model))" in r.source
        and "class ForwardTo(torch.nn.Module):" in r.source
    )
    assert 'loss = ddp_model(x, y, method="loss")' in r.source
    assert (
        "ema = copy.deepcopy(model)" in r.source
        and 'torch.save(model, "net.pt")' in r.source
    )


def test_a_model_handed_to_a_library_function_is_refused():
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
    f = next(f for f in r.findings if f.code == "DDP139")
    assert f.blocking and "`checkpoint`" in f.message and "DDP(" not in r.source


def test_a_training_forward_under_skip_is_refused():
    r = convert("""
        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = (model(x) - y).pow(2).mean()  # ddpify: skip
            opt.zero_grad()
            loss.backward()
            opt.step()
    """)
    assert (
        any(f.code == "DDP139" and f.blocking for f in r.findings)
        and "DDP(" not in r.source
    )


def test_a_function_that_trains_and_saves_is_wrapped_inside():
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
    assert "    ddp_net = DDP(net)\n" in r.source and "(ddp_net(x) - y)" in r.source
    assert (
        'torch.save(net.state_dict(), "net.pt")' in r.source
        and "fit(model, opt, 2)" in r.source
    )
    assert ".module" not in r.source


def test_a_per_batch_step_gets_the_wrapper_and_module_only_where_it_reads_the_model():
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
    assert (
        "step(ddp_model, opt, x, y)" in r.source
        and "net.module.out_features" in r.source
    )
    assert "(net(x) - y)" in r.source and "print(model.out_features)" in r.source


def test_a_name_bound_to_another_model_before_its_training_forward_is_refused():
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
    f = next(f for f in r.findings if f.code == "DDP139")
    assert f.blocking and "bound to another model" in f.message
    # a model built again in each pass of a loop is wrapped again in each pass
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
    assert not r.blocking and "\n    ddp_model = DDP(model)\n" in r.source


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


def test_a_part_of_an_nn_module_gets_a_wrapper_outside_its_state_dict():
    r = convert(
        MODULE_HOLDER.format(
            arg=", device", move="self.to(device)", build="Pair(device)"
        )
    )
    assert (
        'object.__setattr__(self, "ddp_net", NotPickled(DDP(self.net)))' in r.source
        and "self.ddp_net(x)" in r.source
    )
    assert r.source.index("self.to(device)") < r.source.index(
        'object.__setattr__(self, "ddp_net"'
    )
    # moved from outside after __init__ wrapped its part: DDP could not follow
    r = convert(MODULE_HOLDER.format(arg="", move="pass", build="Pair().to(device)"))
    f = next(f for f in r.findings if f.code == "DDP036")
    assert f.blocking and "`self.net`" in f.message and "DDP(" not in r.source


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
    for build in ("Runner()", "make_runner()"):
        r = convert(RUNNER.format(build=build))
        assert (
            "self.ddp_net = DDP(self.net)" in r.source
            and "loss = (runner.ddp_net(x) - y)" in r.source
        ), build
        assert 'torch.save(runner.net.state_dict(), "net.pt")' in r.source
    # an object ddpify cannot tie to the class that wraps its model: refused, not left unsynchronised
    r = convert(RUNNER.format(build="{'a': Runner()}['a']"))
    f = next(f for f in r.findings if f.code == "DDP139")
    assert f.blocking and "`runner.net`" in f.message


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


def test_a_model_no_forward_of_which_reaches_a_backward_is_not_wrapped():
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
    assert (
        "ddp_model = DDP(model)" in r.source
        and "DDP(teacher" not in r.source
        and not r.blocking
    )
    f = next(f for f in r.findings if f.code == "DDP030" and "`teacher`" in f.message)
    assert not f.fixed and "no call of it reaches a backward()" in f.message
