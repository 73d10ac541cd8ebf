"""Checks on the data: the same number of batches on every rank (`even-batches`), disjoint shards
(`data-sharding`: sample indices, or the DDP model's inputs and local gradients without a
DataLoader), and a new order every epoch (`epoch-shuffle`)."""

from __future__ import annotations

from ddpify.verify.checks.common import (
    FAIL,
    NA,
    PASS,
    Check,
    Context,
    plural,
    training_epochs,
)
from ddpify.verify.checks.processes import batch_count, imbalance


def check_even_batches(ctx: Context) -> Check:
    recs = ctx.candidate.records
    if ctx.nproc < 2:
        return Check("even-batches", NA, "one process")
    counts = {r: batch_count(rec) for r, rec in sorted(recs.items())}
    known = {r: c for r, c in counts.items() if c is not None}
    if len(known) < 2:
        return Check(
            "even-batches", NA, "no training DataLoader with a length on two ranks"
        )
    if len(set(known.values())) == 1:
        c = next(iter(known.values()))
        return Check(
            "even-batches",
            PASS,
            f"{plural(c, 'batch', 'batches')} per epoch on each of {len(known)} ranks",
        )
    figure = "batches per epoch: " + imbalance(known)
    cause = (
        f"the ranks have different numbers of batches per epoch ({imbalance(known)}): the rank that runs out "
        "first goes on to other collectives while the others still all-reduce gradients. Shard with "
        "DistributedSampler (it pads every rank to the same count), or drop the remainder, or train under "
        "model.join() (torch.distributed.algorithms.Join)"
    )
    return Check("even-batches", FAIL, figure, cause, data={"batches": known})


# ------------------------------------------------------------------------ sharding


def _training_epochs(rec: dict) -> dict[tuple, list[dict]]:
    """Training epochs (a backward pass happened between their batches), grouped by loader signature."""
    groups: dict[tuple, list[dict]] = {}
    for e in training_epochs(rec):
        groups.setdefault((e["dataset"], e["dataset_len"], e["batch_size"]), []).append(
            e
        )
    return groups


def check_sharding(ctx: Context) -> Check:
    recs = ctx.candidate.records
    if ctx.nproc < 2:
        return Check("data-sharding", NA, "one process")
    if len(recs) < ctx.nproc:
        return Check("data-sharding", NA, "not every rank recorded its data")
    per_rank = {r: _training_epochs(recs[r]) for r in range(ctx.nproc)}
    keys = set.intersection(*(set(g) for g in per_rank.values())) if per_rank else set()
    if not keys:
        return _check_step_sharding(ctx)
    iterable = {k for k in keys if per_rank[0][k][0].get("iterable")}
    if iterable:
        return _check_iterable_sharding(ctx, per_rank, sorted(iterable, key=str)[0])
    figures, problems, data = [], [], []
    for key in sorted(keys, key=str):
        count = min(len(per_rank[r][key]) for r in range(ctx.nproc))
        for i in range(count):
            eps = [per_rank[r][key][i] for r in range(ctx.nproc)]
            if eps[0].get("replacement") or _repeats(eps, key[1], ctx.nproc):
                # draws with replacement (or episodes drawn anew, a sampler that repeats indices
                # within one rank's pass) repeat indices by design: only the same draws on every
                # rank is unsharded
                n = min(len(e["indices"]) for e in eps)
                same = sum(
                    1 for k in range(n) if len({e["indices"][k] for e in eps}) == 1
                )
                data.append(
                    {
                        "epoch": i,
                        "drawn": [len(e["indices"]) for e in eps],
                        "same_position": same,
                    }
                )
                if i == 0:
                    figures.append(
                        f"epoch 0: {ctx.nproc} ranks drew with replacement from {key[1]}, the same index at {same} of {n} positions"
                    )
                if n and same > max(4 * n / max(key[1] or 1, 1), n / 4):
                    problems.append((i, same, -1, eps))
                continue
            seen: dict = {}
            for r, e in enumerate(eps):
                for idx in set(e["indices"]):
                    seen[idx] = seen.get(idx, 0) + 1
            shared = sum(c - 1 for c in seen.values() if c > 1)
            length = key[1]
            allowed = (-length) % ctx.nproc if length else 0
            drawn = [len(e["indices"]) for e in eps]
            data.append(
                {"epoch": i, "drawn": drawn, "shared": shared, "allowed": allowed}
            )
            if i == 0:
                each = (
                    f"{drawn[0]} each"
                    if len(set(drawn)) == 1
                    else "/".join(map(str, drawn))
                )
                figures.append(
                    f"epoch 0: {ctx.nproc} ranks drew {each} of {length}, {shared} shared (padding allows {allowed})"
                )
            if shared > allowed:
                problems.append((i, shared, allowed, eps))
    if not problems:
        return Check("data-sharding", PASS, "; ".join(figures), data={"epochs": data})
    i, shared, allowed, eps = problems[0]
    e0 = eps[0]
    drawn = [len(e["indices"]) for e in eps]
    each = f"{drawn[0]} each" if len(set(drawn)) == 1 else "/".join(map(str, drawn))
    figure = (
        f"epoch {i}: {ctx.nproc} ranks drew {each} of {e0['dataset_len']}, "
        f"{shared} drawn by more than one rank (padding allows {allowed})"
    )
    if allowed == -1:  # drawn with repeats: the same draws at the same positions
        figure = f"epoch {i}: {ctx.nproc} ranks drew the same index at {plural(shared, 'position')} of {min(drawn)}"
        cause = (
            f"the training DataLoader ({e0['dataset']}) draws with {e0['sampler']}(replacement=True) from the same "
            "random state on every rank: give each rank a generator of its own (seeded with RANK added)"
            if e0.get("replacement")
            else f"the training DataLoader ({e0['dataset']}) draws the same sequence with {e0['sampler']} on every "
            "rank: give each rank every WORLD_SIZE-th of what the sampler yields"
        )
    elif e0["sampler"] != "DistributedSampler":
        cause = (
            f"the training DataLoader ({e0['dataset']}, {e0['dataset_len']} samples) draws with "
            f"{e0['sampler']}, not DistributedSampler: every rank reads the whole dataset"
        )
    elif (
        len({e.get("num_replicas") for e in eps}) == 1
        and eps[0].get("num_replicas") != ctx.nproc
    ):
        cause = f"DistributedSampler built with num_replicas={e0.get('num_replicas')}, not the world size {ctx.nproc}"
    elif len({e.get("sampler_rank") for e in eps}) == 1:
        cause = (
            f"DistributedSampler built with rank={e0.get('sampler_rank')} on every rank"
        )
    elif len({e.get("sampler_seed") for e in eps}) > 1:
        seeds = ", ".join(
            f"rank {r}: seed={e.get('sampler_seed')}" for r, e in enumerate(eps)
        )
        cause = (
            f"the DistributedSampler seeds differ per rank ({seeds}): each rank shuffles the dataset differently "
            "before taking its slice, so the shards overlap. Give every rank the same seed (set_epoch varies it per epoch)"
        )
    else:
        cause = "the ranks' samplers hand out overlapping indices"
    return Check("data-sharding", FAIL, figure, cause, data={"epochs": data})


def _repeats(eps: list[dict], length: int | None, nproc: int) -> bool:
    """A rank drew some index more than once in one pass, beyond what padding allows: its
    sampler repeats indices by design (episodes, draws with replacement)."""
    allowed = (-length) % nproc if length else 0
    return any(len(e["indices"]) - len(set(e["indices"])) > allowed for e in eps)


def _same(a: list[float], b: list[float]) -> bool:
    # the same batch gives bitwise-equal gradients on CPU; a GPU's reduction order may move the last bits
    return all(abs(x - y) <= 1e-6 * max(abs(x), abs(y), 1e-12) for x, y in zip(a, b))


def _check_step_sharding(ctx: Context) -> Check:
    """No DataLoader: compare, step by step, what the DDP model was fed on each rank and the
    gradients each rank computed before DDP averaged them. Equal on every rank at every step:
    the ranks trained on the same data."""
    recs = ctx.candidate.records
    grads = [recs[r].get("grad_prints") or [] for r in range(ctx.nproc)]
    inputs = [recs[r].get("input_prints") or [] for r in range(ctx.nproc)]
    n = min(len(g) for g in grads)
    if n == 0:
        return Check(
            "data-sharding",
            NA,
            "no training DataLoader seen, and no backward pass through a DDP model to compare",
        )
    same_grads = sum(
        1
        for i in range(n)
        if all(_same(grads[r][i], grads[0][i]) for r in range(1, ctx.nproc))
    )
    k = min(len(x) for x in inputs)
    same_inputs = sum(
        1
        for i in range(k)
        if all(inputs[r][i] == inputs[0][i] for r in range(1, ctx.nproc))
    )
    figure = (
        f"no DataLoader: the DDP model's training inputs were the same on every rank at {same_inputs} of {k} forwards, "
        f"its local gradients at {same_grads} of {n} backward passes"
    )
    data = {
        "backwards": n,
        "same_grads": same_grads,
        "forwards": k,
        "same_inputs": same_inputs,
    }
    if same_grads == n:
        cause = (
            "every rank computed the same gradients from the same batches: the training data is not sharded "
            "(draw per-rank batches: seed with RANK added, or slice the data by RANK/WORLD_SIZE)"
        )
        return Check("data-sharding", FAIL, figure, cause, data=data)
    if same_inputs == k and k:
        figure += " (the same inputs: the loss reads a per-rank part of the output, or per-rank randomness such as dropout differs)"
    return Check("data-sharding", PASS, figure, data=data)


def _check_iterable_sharding(ctx: Context, per_rank: dict, key: tuple) -> Check:
    """IterableDataset: no indices, so compare the ranks' batches (shape and sums) position by position."""
    eps = [per_rank[r][key][0] for r in range(ctx.nproc)]
    prints = [e.get("fingerprints") or [] for e in eps]
    n = min(len(p) for p in prints)
    if n == 0:
        return Check("data-sharding", NA, "IterableDataset: no batch to compare")
    same = sum(
        1
        for i in range(n)
        if any(prints[a][i] == prints[b][i] for a in range(ctx.nproc) for b in range(a))
    )
    figure = f"IterableDataset ({eps[0]['dataset']}): {same} of the first {n} batches identical on two or more ranks"
    if same == 0:
        return Check("data-sharding", PASS, figure)
    cause = (
        f"the IterableDataset {eps[0]['dataset']} yields the same items on every rank: "
        "yield only the items i with i % WORLD_SIZE == RANK (and split workers with get_worker_info())"
    )
    return Check("data-sharding", FAIL, figure, cause)


def check_epoch_order(ctx: Context) -> Check:
    recs = ctx.candidate.records
    if not recs:
        return Check("epoch-shuffle", NA, "no rank recorded its data")
    compared, same, no_shuffle, streams = [], [], [], False
    for r, rec in sorted(recs.items()):
        for key, eps in _training_epochs(rec).items():
            if eps[0].get("iterable"):
                streams = True  # no indices: the order of a stream is the dataset's own business
                continue
            for a, b in zip(eps, eps[1:]):
                n = min(len(a["indices"]), len(b["indices"]))
                if n == 0:
                    continue
                compared.append(r)
                if a["indices"][:n] == b["indices"][:n]:
                    if a.get("shuffle") is False:
                        no_shuffle.append(r)
                    else:
                        same.append((r, a, b, n))
    if not compared and streams:
        return Check(
            "epoch-shuffle",
            NA,
            "IterableDataset: the stream's order is the dataset's own",
        )
    if not compared:
        if ctx.epochs:
            return Check(
                "epoch-shuffle",
                NA,
                f"fewer than two training epochs (--epochs {ctx.epochs}; --epochs 2 compares two)",
            )
        if ctx.to_end:
            return Check("epoch-shuffle", NA, "the script trains fewer than two epochs")
        return Check(
            "epoch-shuffle",
            NA,
            f"fewer than two training epochs within {plural(ctx.steps, 'step')} (raise --steps, or --epochs 2)",
        )
    if not same:
        if no_shuffle and len(no_shuffle) == len(compared):
            return Check(
                "epoch-shuffle",
                PASS,
                "the script does not shuffle: the same order every epoch is expected",
            )
        ranks = sorted(set(compared))
        return Check(
            "epoch-shuffle",
            PASS,
            f"order changed between epochs on {len(ranks)}/{len(recs)} ranks",
        )
    r, a, b, n = same[0]
    who = sorted({s[0] for s in same})
    ranks = ("ranks " if len(who) > 1 else "rank ") + ", ".join(map(str, who))
    figure = (
        f"two consecutive epochs drew the same {n} indices in the same order on {ranks}"
    )
    rec = recs[r]
    if a["sampler"] == "DistributedSampler":
        if not rec.get("set_epoch_calls"):
            cause = "DistributedSampler.set_epoch(epoch) is never called: every epoch repeats the order of the first"
        else:
            cause = f"set_epoch is called with the same value every epoch ({a.get('sampler_epoch')})"
    else:
        cause = (
            f"{a['sampler']} yields the same order every epoch though shuffling is on"
        )
    return Check("epoch-shuffle", FAIL, figure, cause)
