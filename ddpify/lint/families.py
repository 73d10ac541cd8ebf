"""The bug families lint's rules are grouped by: what goes wrong, in the words of the reports it
was drawn from, and which codes find it. `ddpify lint --explain CODE` shows a code's family."""

from __future__ import annotations

FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "rank-collective": (
        "a collective (barrier, all_reduce, a DDP forward) reached by some ranks only: a rank-0 branch, "
        "a helper that returns early on the other ranks; the others never join and the job hangs",
        ("DDP210",),
    ),
    "rank-exit": (
        "a rank leaves a loop that runs collectives (break, return, an exception) on a condition of its own "
        "data: the other ranks wait for it",
        ("DDP211",),
    ),
    "uneven-batches": (
        "the ranks iterate different numbers of batches (data split by hand, a file per rank, a subset "
        "drawn per rank): the rank with more waits in a collective the others never join",
        ("DDP212",),
    ),
    "collective-shape": (
        "a tensor gathered across ranks whose size is the rank's own (a mask, a length read from the "
        "batch): the shapes differ and the collective hangs or fails",
        ("DDP213",),
    ),
    "unused-params": (
        "parameters that get no gradient in a step under find_unused_parameters=False: the second step "
        'raises "Expected to have finished reduction"',
        ("DDP260",),
    ),
    "checkpoint-keys": (
        "a checkpoint whose keys do not fit where it is loaded (the wrapper's `module.` prefix, a copy of "
        "the wrapper), loud with strict loading and silent (nothing loaded) with strict=False",
        ("DDP250", "DDP251", "DDP252"),
    ),
    "checkpoint-device": (
        "a checkpoint loaded onto the device it was saved from (GPU 0) by every rank: a hard-coded "
        "map_location, or none",
        ("DDP230", "DDP234"),
    ),
    "file-race": (
        "a file, download or log written by every rank at once, or read by the other ranks before rank 0 "
        "has written it",
        ("DDP220", "DDP222", "DDP223"),
    ),
    "writer-local-rank": (
        "the writer chosen by the local rank: once a node on a multi-node run",
        ("DDP221",),
    ),
    "rank-device": (
        "launch and rank plumbing: the device from the global rank, a hard-coded GPU, no set_device, a "
        "--local_rank flag torchrun never passes",
        ("DDP230", "DDP231", "DDP232", "DDP233", "DDP282", "DDP283", "DDP284"),
    ),
    "replica-drift": (
        "the replicas train different models: never wrapped, changed after the wrap (on every rank, or "
        "on some ranks only), or a training forward that bypasses the wrapper (`.module`, an alias, a "
        "submodule)",
        ("DDP240", "DDP241", "DDP242", "DDP245"),
    ),
    "data-sharding": (
        "the data is not split as intended: no DistributedSampler, shuffle beside a sampler, no "
        "set_epoch, a shuffle seeded per rank, a stream every rank reads whole",
        ("DDP200", "DDP201", "DDP202", "DDP203", "DDP204"),
    ),
    "metric-one-shard": (
        "a figure computed on one rank's shard and reported as the whole (not all-reduced), or "
        "counted with DistributedSampler's padding duplicates",
        ("DDP225", "DDP226", "DDP227"),
    ),
    "double-reduce": (
        "a value reduced across ranks twice: gradients DDP has averaged already, all-reduced again by "
        "hand (or their norm, summed once a rank)",
        ("DDP244",),
    ),
    "mixed-precision": ("the GradScaler used out of order", ("DDP270", "DDP271")),
    "performance": ("what works but costs speed or memory", ("DDP280", "DDP281")),
}


def family_of(code: str) -> str | None:
    return next((name for name, (_, codes) in FAMILIES.items() if code in codes), None)
