"""The checks: each turns what the probe recorded into PASS / FAIL / N/A / INFO, a figure and a cause.

One module per thing they look at: the processes (ranks, devices, imports; a hang in hang.py),
the training (parameters, loss, throughput), the data (batches, shards, epoch order), the files
written, the output printed, and what the run covered. CHECKS is the one ordered list.
"""

from __future__ import annotations

from ddpify.verify.checks.common import FAIL, INFO, NA, PASS, STOPPED, Check, Context
from ddpify.verify.checks.coverage import check_reached, verdict
from ddpify.verify.checks.elsewhere import (
    check_gpu_paths,
    check_one_process,
    check_other_scripts,
)
from ddpify.verify.checks.data import (
    check_epoch_order,
    check_even_batches,
    check_sharding,
)
from ddpify.verify.checks.files import check_saved, check_writes, written_alike
from ddpify.verify.checks.hang import (
    check_collectives,
    check_hang,
    parse_stack,
    waiting_in,
)
from ddpify.verify.checks.output import check_metrics, check_rank0_output
from ddpify.verify.checks.processes import check_devices, check_imports, check_ranks
from ddpify.verify.checks.source import Sources
from ddpify.verify.checks.state import check_model_state
from ddpify.verify.checks.training import (
    check_loss,
    check_optimized,
    check_params,
    check_throughput,
)

# (name, check, whether it still runs on a run stopped by a hang: killed ranks never wrote their
# final records, so only what they saved before the stall is known). A check that returns None
# does not apply to this run (imports: project mode only; one-process: a converted script;
# other-scripts: a project whose shared modules changed; gpu-paths: a CPU run that skipped some).
CHECKS = [
    ("ranks", check_ranks, True),
    ("imports", check_imports, True),
    ("one-process", check_one_process, True),
    ("devices", check_devices, True),
    ("params-in-sync", check_params, True),
    ("model-state", check_model_state, False),
    ("even-batches", check_even_batches, True),
    ("data-sharding", check_sharding, False),
    ("epoch-shuffle", check_epoch_order, False),
    ("rank0-writes", check_writes, False),
    ("rank0-output", check_rank0_output, False),
    ("metrics", check_metrics, False),
    ("saved", check_saved, False),
    ("other-scripts", check_other_scripts, True),
    ("gpu-paths", check_gpu_paths, True),
    ("loss", check_loss, False),
    ("throughput", check_throughput, False),
    ("reached", check_reached, False),
    ("collectives", check_collectives, False),
    ("no-hang", check_hang, True),
]

# Every check's name, in report order (finding codes name the check that proves their fix).
CHECK_NAMES = tuple(name for name, _check, _after_hang in CHECKS)


def run_checks(ctx: Context) -> list[Check]:
    out = []
    for name, check, after_hang in CHECKS:
        result = (
            check(ctx)
            if after_hang or not ctx.candidate.hang
            else Check(name, NA, STOPPED)
        )
        if result is not None:
            out.append(result)
    return out


__all__ = [
    "CHECKS", "CHECK_NAMES", "FAIL", "INFO", "NA", "PASS", "Check", "Context", "Sources", "check_hang", "check_optimized",
    "parse_stack", "run_checks", "verdict", "waiting_in", "written_alike",
]  # fmt: skip
