"""The dimensions of a generated training script, their variants and what may combine.

Each dimension lists its variants simplest first: the shrinker replaces a variant by an earlier
one. `legal(dims)` encodes the combinations that would not make a correct single-process
program (or that the generator does not write)."""

from __future__ import annotations

import random

DIMENSIONS: dict[str, list[str]] = {
    # how the program starts
    "entry": ["main_guard", "toplevel", "module", "console", "clilib"],
    # where its settings come from
    "config": ["constants", "argparse", "dataclass", "json_file", "settings_module"],
    # where the trained model is built
    "model_site": [
        "in_main",
        "toplevel",
        "factory",
        "factory_tuple",
        "factory_dict",
        "trainer",
        "table",
        "two_models",
        "teacher",
        "ema",
    ],
    "device": ["cpu_only", "cuda_guarded", "to_device", "dataparallel", "set_device"],
    "optimizer": [
        "params",
        "groups",
        "frozen_filter",
        "chained",
        "helper",
        "table",
        "holder_class",
    ],
    # how the training step reaches the model
    "forward": ["call", "loss_in_forward", "method", "step_helper", "partial"],
    "step": [
        "plain",
        "accum",
        "clip",
        "sched_iter",
        "sched_epoch",
        "early_stop",
        "two_opts",
    ],
    "data": [
        "loader",
        "helper_tuple",
        "helper_dict",
        "cycle_shared",
        "iter_count",
        "own_iter",
        "full_batch",
        "random_split",
        "subset",
        "iterable",
        # a sampler of the script's own, a batch sampler of its own, a sampler that is None
        "own_sampler",
        "batch_sampler",
        "sampler_none",
    ],
    "checkpoint": [
        "none",
        "state_dict",
        "dict_with_object",
        "whole_model",
        "per_epoch",
    ],
    "artifacts": [
        "print_only",
        "logging_file",
        "numpy",
        "pickle",
        "json",
        "csv",
        "fake_lib",
        "nopkg_helper",
    ],
    "out_dir": ["cwd", "makedirs", "time_dir", "pathlib"],
    "evaluation": ["none", "no_grad", "best_copy", "periodic", "end_only"],
    "randomness": ["once", "none", "all_libs", "data_generator"],
    "resume": ["none", "if_present", "flag", "init_roundtrip"],
    "precision": ["none", "amp_scaler", "bf16_autocast", "legacy_cuda_amp"],
    "layout": ["single", "sibling", "package", "namespace"],
    # added here, not in the survey
    "arch": ["mlp", "batchnorm", "dropout", "residual", "buffer"],
    "loss": ["mse", "cross_entropy", "bce_logits", "bce_prob", "smooth_l1"],
    "loop_form": ["for_range", "while_counter", "epoch_fn"],
}

ITERATION_DATA = {"cycle_shared", "iter_count"}
MULTI_MODEL = {"two_models", "teacher"}


def loop_kind(dims: dict[str, str]) -> str:
    """'iterations' when the loop runs a fixed count of steps, else 'epochs'."""
    return "iterations" if dims["data"] in ITERATION_DATA else "epochs"


def expected_steps(dims: dict[str, str]) -> str:
    """What a correct conversion does to the optimizer steps of each rank, from the shape alone:
    'halved' (an epoch over sharded data), 'equal' (a fixed count of steps, or one full batch
    an epoch, sharded by rows), or 'any' (early stopping on a loss: the stop epoch may move)."""
    if dims["step"] == "early_stop":
        return "any"
    if loop_kind(dims) == "iterations" or dims["data"] == "full_batch":
        return "equal"
    return "halved"


def violations(d: dict[str, str]) -> list[str]:
    """Why this combination is not generated (empty: legal)."""
    bad = []

    def need(cond: bool, why: str) -> None:
        if not cond:
            bad.append(why)

    need(
        d["entry"] not in ("module", "console") or d["layout"] == "package",
        "module/console entry needs a package",
    )
    need(
        d["optimizer"] != "chained"
        or (d["model_site"] == "two_models" and d["step"] != "two_opts"),
        "chained parameters need two models and one optimizer",
    )
    need(
        d["model_site"] != "two_models"
        or d["optimizer"] == "chained"
        or (d["step"] == "two_opts" and d["optimizer"] == "params"),
        "two models are trained by a chained optimizer or by one optimizer each",
    )
    need(
        d["step"] != "two_opts"
        or (
            d["optimizer"] == "params"
            and d["model_site"]
            not in ("factory_tuple", "factory_dict", "trainer", "teacher", "ema")
        ),
        "two optimizers are built from plain parameter lists, outside factories and classes",
    )
    need(
        d["model_site"] != "teacher"
        or d["forward"] in ("call", "step_helper", "partial"),
        "distillation needs the student's output",
    )
    need(
        d["model_site"] != "trainer" or d["loop_form"] != "epoch_fn",
        "a trainer's loop is its own method",
    )
    need(
        d["device"] != "dataparallel"
        or (
            d["model_site"] in ("in_main", "factory", "table", "ema")
            and d["forward"] != "method"
        ),
        "DataParallel only around a single plain model called through forward",
    )
    need(
        d["data"] not in ITERATION_DATA or d["loop_form"] != "epoch_fn",
        "an iteration loop has no epoch function",
    )
    need(
        d["step"] != "sched_epoch" or d["data"] not in ITERATION_DATA,
        "a per-epoch scheduler needs epochs",
    )
    need(
        d["step"] != "accum" or d["data"] != "full_batch",
        "accumulation needs several batches",
    )
    need(
        d["optimizer"] != "holder_class" or d["precision"] == "none",
        "the optimizer holder steps without a scaler",
    )
    need(
        d["resume"] not in ("if_present", "flag")
        or (
            d["checkpoint"] in ("state_dict", "dict_with_object", "whole_model")
            and d["model_site"] != "two_models"
        ),
        "resuming reads the final checkpoint of one model",
    )
    need(
        d["optimizer"] not in ("groups", "frozen_filter")
        or d["model_site"] != "two_models",
        "param groups are over one model's parts",
    )
    need(
        d["optimizer"] != "holder_class" or d["model_site"] not in ("trainer",),
        "a trainer builds its own optimizer",
    )
    need(
        d["checkpoint"] != "whole_model" or d["model_site"] != "two_models",
        "whole-model save of one model",
    )
    return bad


def legal(d: dict[str, str]) -> bool:
    return not violations(d)


def sample(rng: random.Random) -> dict[str, str]:
    """A legal combination: each dimension uniform, redrawn until the constraints hold. A
    dimension that keeps breaking them is fixed one at a time, so rare variants still come."""
    pin = None
    if (
        rng.random() < 0.5
    ):  # pin one variant, so those the constraints make rare still come
        dim = rng.choice(sorted(DIMENSIONS))
        pin = (dim, rng.choice(DIMENSIONS[dim]))
    for _ in range(100000):
        d = {k: rng.choice(v) for k, v in DIMENSIONS.items()}
        if pin:
            d[pin[0]] = pin[1]
        if legal(d):
            return d
    raise RuntimeError("no legal combination found")


def simpler(d: dict[str, str], dim: str) -> list[dict[str, str]]:
    """Legal combinations with `dim` replaced by an earlier (simpler) variant, simplest first; where
    that alone breaks a constraint, the dimensions it depends on also go to their simplest."""
    out = []
    order = DIMENSIONS[dim]
    for v in order[: order.index(d[dim])]:
        cand = dict(d, **{dim: v})
        if not legal(cand):
            cand = _repair(cand, keep=dim)
        if cand is not None and legal(cand) and cand not in out:
            out.append(cand)
    return out


def _repair(d: dict[str, str], keep: str) -> dict[str, str] | None:
    """Send other dimensions to their simplest variants, one at a time, until legal."""
    d = dict(d)
    for k in DIMENSIONS:
        if legal(d):
            return d
        if k == keep:
            continue
        trial = dict(d, **{k: DIMENSIONS[k][0]})
        if len(violations(trial)) < len(violations(d)):
            d = trial
    return d if legal(d) else None


def simplest() -> dict[str, str]:
    return {k: v[0] for k, v in DIMENSIONS.items()}
