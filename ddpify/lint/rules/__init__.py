"""lint's rules, one module a concern; each declares its codes (ddpify/rules.py, tool="lint") and
implements `check(ctx)` over the shared analysis (ddpify/lint/engine.Context)."""

from ddpify.lint.rules import (
    bypass,
    checkpoints,
    devices,
    divergent_exit,
    iterable,
    loaders,
    metrics,
    notes,
    rank_collective,
    sampler_seed,
    scaler,
    set_epoch,
    uneven,
    unused_params,
    unwrapped,
    wrap_order,
    writes,
)

RULES = (
    loaders,
    iterable,
    set_epoch,
    sampler_seed,
    rank_collective,
    divergent_exit,
    uneven,
    writes,
    devices,
    unwrapped,
    wrap_order,
    bypass,
    checkpoints,
    unused_params,
    scaler,
    metrics,
    notes,
)
