"""A rank that meets a bad job raises, the other ranks wait for it at the barrier.

Source: https://github.com/tier4/Diffusion-Planner/pull/336
Cause, as stated there: if one rank raises inside its job loop, the other ranks wait at the
barrier until the job's time limit; catch, still reach the barrier, all-reduce a failure flag,
then raise on every rank.
Kind: hang. Family: rank-exit.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist


def run_job(job):
    if job["length"] <= 0:
        raise ValueError(f"job {job['id']} has no frames")
    return float(torch.randn(job["length"]).abs().mean())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    jobs = [{"id": i, "length": 0 if i == 5 else 20 + i} for i in range(8)]
    results = {}
    for job in jobs[rank::world]:
        results[job["id"]] = run_job(job)  # expect: rank-exit
    with open(os.path.join(args.out, f"shard{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    if rank == 0:
        merged = {}
        for r in range(world):
            with open(os.path.join(args.out, f"shard{r}.json")) as f:
                merged.update(json.load(f))
        print("jobs done:", len(merged))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
