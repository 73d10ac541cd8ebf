"""The last check of every conversion (ddpify/undefined.py): no name read where it is not defined."""

from ddpify import convert_source
from ddpify.undefined import new_unbound_reads, unbound_reads

TRAINER = """
def main():
    loader = make()
    Trainer(loader).train()

class Trainer:
    def __init__(self, loader):
        self.loader = loader

    def train(self):
        for epoch in range(3):
            pass
"""


def test_a_name_placed_out_of_its_scope_is_found():
    after = TRAINER.replace(
        "            pass", "            loader.sampler.set_epoch(epoch)"
    )
    assert new_unbound_reads(TRAINER, after) == [("Trainer.train", "loader", 10)]


def test_names_the_module_binds_anywhere_are_not_reported():
    after = (
        TRAINER
        + "\nRANK = 0\n\ndef f():\n    global SCALER\n    SCALER = 1\n\ndef g():\n    return RANK, SCALER, print\n"
    )
    assert new_unbound_reads(TRAINER, after) == []


def test_a_name_the_input_already_reads_unbound_is_the_scripts_own_business():
    before = TRAINER.replace("            pass", "            log(epoch)")
    after = before + "\ndef h():\n    log(1)\n"
    assert new_unbound_reads(before, after) == []


def test_star_imports_make_it_unknowable():
    assert unbound_reads("from helpers import *\nprint(x)\n") is None
    assert new_unbound_reads("from m import *\n", "from m import *\ny = zz\n") == []


def test_the_converter_refuses_such_an_output():
    # the loader is rebuilt in each call of run_epoch(); its set_epoch would go into main()'s
    # epoch loop, where that loader does not exist
    src = open("fixtures/200_loader_rebuilt_per_call_refused/input.py").read()
    res = convert_source(src, path="train.py")
    assert res.status == "refused" and not res.changed
    assert [f.code for f in res.findings] == ["DDP005"]
    assert "loader in main" in res.findings[0].message
