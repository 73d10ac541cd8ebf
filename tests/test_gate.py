"""The invariant gate (ddpify/gate/): each invariant refuses a plan that breaks it, one the planners
would not produce today (a planner switched off or made to misplace its code), and lets the right
program through; the runtime half (the first-step gradient check) stops a run whose forward
bypasses the wrapper."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from conftest import free_port

from ddpify import Options, convert_source
from ddpify.gate import check_program
from ddpify.transforms import launch, rank0, sampler, wrapping

TRAIN = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
            self.classifier = nn.Linear(16, 2)

        def forward(self, x):
            return self.classifier(self.backbone(x))


    def main():
        data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
        loader = DataLoader(data, batch_size=8, shuffle=True)
        model = Net()
        optimizer = torch.optim.SGD([
            {"params": model.backbone.parameters(), "lr": 0.01},
            {"params": model.classifier.parameters(), "lr": 0.1},
        ], lr=0.1, momentum=0.9)
        for epoch in range(2):
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        torch.save(model.state_dict(), "model.pth")


    if __name__ == "__main__":
        main()
""")


def codes(result) -> set[str]:
    return {f.code for f in result.findings}


def test_the_right_program_goes_through():
    result = convert_source(TRAIN, Options(), path="train.py")
    assert result.status == "converted" and not result.blocking, [
        f.format("train.py") for f in result.blocking
    ]
    assert "    ddp_in_place(model)\n    optimizer = torch.optim.SGD(" in result.source
    assert not check_program(result.source)


def test_sync_refuses_a_plan_that_wraps_nothing(monkeypatch):
    monkeypatch.setattr(wrapping.WrappingTransform, "plan", lambda self, ctx: None)
    result = convert_source(TRAIN, Options(), path="train.py")
    assert result.status == "refused" and result.source == TRAIN
    assert codes(result) == {"DDP150"}
    assert "no DistributedDataParallel wrapper" in result.findings[0].message


def test_sync_refuses_a_wrapper_of_another_model():
    out = textwrap.dedent("""\
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        gen, disc = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        ddp_gen = DDP(gen)
        opt_d = torch.optim.Adam(disc.parameters())
        for _ in range(3):
            loss = disc(ddp_gen(torch.randn(2, 4))).mean()
            loss.backward()
            opt_d.step()
    """)
    found = [
        v for v in check_program(out) if v.code != "DDP153"
    ]  # no process group in this excerpt
    assert [v.code for v in found] == ["DDP150"] and "disc" in found[0].message


def test_sync_follows_a_factory_and_a_trainer_attribute():
    out = textwrap.dedent("""\
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.head = torch.nn.Linear(4, 1)

        def build():
            net = Net()
            return net, torch.optim.SGD([{"params": net.head.parameters()}], lr=0.1)

        class Trainer:
            def __init__(self):
                self.net, self.opt = build()
                self.ddp_net = DDP(self.net)

            def fit(self):
                loss = self.ddp_net(torch.randn(2, 4)).mean()
                loss.backward()
                self.opt.step()

        Trainer().fit()
    """)
    assert not [v for v in check_program(out) if v.code == "DDP150"]


def test_shards_refuses_a_plan_that_shards_nothing(monkeypatch):
    monkeypatch.setattr(sampler.SamplerTransform, "plan", lambda self, ctx: None)
    result = convert_source(TRAIN, Options(), path="train.py")
    assert result.status == "refused" and codes(result) == {"DDP151"}


def test_one_writer_refuses_a_plan_that_guards_nothing(monkeypatch):
    monkeypatch.setattr(rank0.Rank0Transform, "plan", lambda self, ctx: None)
    result = convert_source(TRAIN, Options(), path="train.py")
    assert result.status == "refused" and codes(result) == {"DDP152"}
    assert (
        result.findings[0].line
        == TRAIN.splitlines().index('    torch.save(model.state_dict(), "model.pth")')
        + 1
    )


def test_one_writer_knows_a_library_it_has_never_seen_by_what_it_is_handed():
    script = TRAIN.replace(
        '    torch.save(model.state_dict(), "model.pth")',
        '    gifmaker.write_frames([x], f"runs/epoch_{epoch}.gif")',
    ).replace("import torch\n", "import gifmaker\nimport torch\n", 1)
    result = convert_source(script, Options(), path="train.py")
    assert result.status == "converted", [f.format("t") for f in result.blocking]
    assert "if RANK == 0:\n        gifmaker.write_frames" in result.source
    # the same call left on every rank is what the gate refuses
    assert [
        v.code
        for v in check_program(
            result.source.replace(
                "if RANK == 0:\n        gifmaker", "if True:\n        gifmaker"
            )
        )
    ] == ["DDP152"]


def test_lifetime_refuses_teardown_before_training(monkeypatch):
    def entry(self, ctx, prelude):
        # set up and tear down at import time: the group is gone before main() trains
        ctx.edits.after[prelude].extend(
            [ctx.stmt("ddp_setup()\n"), ctx.stmt("dist.destroy_process_group()\n")]
        )

    monkeypatch.setattr(launch.LaunchTransform, "_entry", entry)
    result = convert_source(TRAIN, Options(), path="train.py")
    assert result.status == "refused" and codes(result) == {"DDP153"}
    assert "destroyed here, before training" in result.findings[0].message


def test_lifetime_reads_the_console_script_of_the_project(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "p"\n[project.scripts]\ntrain = "pkg.train:main"\n'
    )
    out = textwrap.dedent("""\
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")

        def main():
            model = torch.nn.Linear(4, 1)
            ddp_model = DDP(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            ddp_model(torch.randn(2, 4)).sum().backward()
            opt.step()
            dist.destroy_process_group()
    """)
    (pkg / "train.py").write_text(out)
    # run as a script, main() never runs: nothing to say; started by the console script, it
    # trains after the module-level set-up, and tears down after: right
    assert not [
        v for v in check_program(out, str(pkg / "train.py")) if v.code == "DDP153"
    ]
    broken = out.replace(
        'dist.init_process_group("gloo")\n',
        'dist.init_process_group("gloo")\ndist.destroy_process_group()\n',
        1,
    )
    found = [
        v for v in check_program(broken, str(pkg / "train.py")) if v.code == "DDP153"
    ]
    assert found and "console script's `main()`" in found[0].message


CYCLE = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    def cycle(loader):
        while True:
            for batch in loader:
                yield batch


    def main():
        train_set = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        val_set = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
        train_iter = cycle(DataLoader(train_set, batch_size=8, shuffle=True))
        val_iter = cycle(DataLoader(val_set, batch_size=8))
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(20):
            x, y = next(train_iter)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 5 == 0:
                with torch.no_grad():
                    vx, vy = next(val_iter)
                    print(step, nn.functional.mse_loss(model(vx), vy).item())


    if __name__ == "__main__":
        main()
""")


def test_every_caller_a_shared_helper_checks_the_sampler_when_it_runs():
    result = convert_source(CYCLE, Options(), path="train.py")
    assert result.status == "converted", [f.format("t") for f in result.blocking]
    assert 'if hasattr(loader.sampler, "set_epoch"):' in result.source


def test_every_caller_refuses_set_epoch_on_a_loader_without_a_distributed_sampler():
    result = convert_source(CYCLE, Options(), path="train.py")
    broken = result.source.replace(
        'if hasattr(loader.sampler, "set_epoch"):\n            loader',
        "if True:\n            loader",
    )
    assert broken != result.source
    assert [v.code for v in check_program(broken)] == ["DDP154"]


def test_every_module_refuses_a_project_module_the_conversion_did_not_read(
    tmp_path, monkeypatch
):
    from ddpify import project
    from ddpify.analysis import project as analysis_project

    (tmp_path / "helpers").mkdir()  # a folder without __init__.py
    (tmp_path / "helpers" / "records.py").write_text(
        "import pickle\n\n\ndef dump_history(history, path):\n    with open(path, 'wb') as f:\n        pickle.dump(history, f)\n"
    )
    (tmp_path / "train.py").write_text(
        TRAIN.replace(
            "import torch\n",
            "import torch\nfrom helpers.records import dump_history\n",
            1,
        ).replace(
            '    torch.save(model.state_dict(), "model.pth")',
            '    dump_history([1.0], "history.pkl")',
        )
    )
    result = project.convert_project(str(tmp_path / "train.py"))
    assert result.status == "converted", [
        f.format("x") for r in result.files for f in r.blocking
    ]
    assert len(result.files) == 2  # the folder without __init__.py is read
    real = analysis_project.local_modules

    def forgetful(entry, read=None):
        root, files = real(entry, read)
        return root, files[:1]  # a plan that never read helpers/records.py

    monkeypatch.setattr(project, "local_modules", forgetful)
    monkeypatch.setattr(project, "is_project", lambda entry: True)
    refused = project.convert_project(str(tmp_path / "train.py"))
    assert refused.status == "refused"
    assert {f.code for r in refused.files for f in r.findings} == {"DDP155"}


def test_a_folder_put_on_sys_path_is_read(tmp_path):
    from ddpify.project import convert_project

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "saver.py").write_text(
        "import torch\n\n\ndef keep(model):\n    torch.save(model.state_dict(), 'kept.pt')\n"
    )
    script = TRAIN.replace(
        "import torch\n",
        "import os\nimport sys\n\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), 'lib'))\nimport torch\nfrom saver import keep\n",
        1,
    )
    (tmp_path / "train.py").write_text(
        script.replace(
            '    torch.save(model.state_dict(), "model.pth")', "    keep(model)"
        )
    )
    result = convert_project(str(tmp_path / "train.py"))
    assert len(result.files) == 2 and result.status == "converted"
    saver = next(r for r in result.files if r.path.endswith("saver.py"))
    assert "if RANK == 0:" in saver.output


@pytest.mark.runs
def test_first_step_check_stops_a_model_that_is_not_made_distributed(tmp_path, forkrun):
    out = convert_source(TRAIN, Options(), path="train.py").source
    ok = tmp_path / "ok"
    bad = tmp_path / "bad"
    ok.mkdir()
    bad.mkdir()
    (ok / "train.py").write_text(out)
    assert "    ddp_in_place(model)\n" in out
    (bad / "train.py").write_text(out.replace("    ddp_in_place(model)\n", ""))
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    run = forkrun.run(ok / "train.py", [], ok, nproc=2, env=env)
    assert run.returncode == 0, run.stderr
    env["MASTER_PORT"] = str(free_port())
    run = forkrun.run(bad / "train.py", [], bad, nproc=2, env=env)
    assert run.returncode != 0
    assert "have different gradients on different ranks at its first step" in run.stderr
    assert not (
        bad / "model.pth"
    ).exists()  # stopped at step 1, before anything was saved


def test_gate_examples_are_the_rules_examples():
    root = Path(__file__).resolve().parent.parent / "fixtures" / "rules"
    from ddpify.gate import example_findings

    for code in ("DDP150", "DDP151", "DDP152", "DDP153", "DDP154", "DDP155"):
        assert (
            example_findings(root / code)
            == (root / code / "expected.txt").read_text().splitlines()
        )
