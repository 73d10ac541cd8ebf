"""Run a script as several torchrun "nodes" on one host and judge the per-process evidence.

Each node is one torchrun agent with its own working directory (its own disk); all agents meet
through a c10d rendezvous on 127.0.0.1. sitecustomize.py (this directory, on PYTHONPATH)
records what every worker did.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CASES = Path(__file__).resolve().parent
LOSS = re.compile(r"loss\w*\W{0,3}?\s*[-+]?(?:\d|\.\d|nan|inf)", re.IGNORECASE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_shim(bin_dir: Path) -> Path:
    """A `torchrun` on PATH that is this interpreter's torch.distributed.run."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "torchrun"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m torch.distributed.run "$@"\n', encoding="utf-8")
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    return shim


def worker_env(evidence: Path, extra_path: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for key in [k for k in env if k.startswith(("SLURM_", "TORCHELASTIC_")) or k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")]:
        del env[key]
    env.update(
        CUDA_VISIBLE_DEVICES="",
        PYTHONHASHSEED="0",
        PYTHONDONTWRITEBYTECODE="1",
        OMP_NUM_THREADS="1",
        DDPIFY_EVIDENCE_DIR=str(evidence),
        PYTHONPATH=os.pathsep.join(filter(None, [str(CASES), env.get("PYTHONPATH")])),
    )
    if extra_path is not None:
        env["PATH"] = f"{extra_path}{os.pathsep}{env.get('PATH', '')}"
    return env


@dataclass
class AgentRun:
    node: int
    returncode: int
    output: str


def run_agents(
    commands: list[list[str]], node_dirs: list[Path], env: dict[str, str], timeout: float = 150
) -> list[AgentRun]:
    """Start one command per node at once, each in its own directory, and wait for all."""
    procs = []
    for node, (cmd, cwd) in enumerate(zip(commands, node_dirs)):
        cwd.mkdir(parents=True, exist_ok=True)
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=cwd,
                env=dict(env, DDPIFY_NODE=str(node)),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    deadline = time.monotonic() + timeout
    runs = []
    for node, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            out, _ = proc.communicate()
            out += "\n[harness] timed out"
        runs.append(AgentRun(node, proc.returncode, out))
    return runs


def two_node_torchrun(script: Path, args: list[str], port: int, nproc: int = 2) -> list[list[str]]:
    """The issue's recipe: two agents, --node-rank 0/1 (c10d ignores it and numbers nodes itself)."""
    return [
        [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes=2", f"--nproc_per_node={nproc}", f"--node-rank={i}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=ddpify-test",
            str(script), *args,
        ]
        for i in range(2)
    ]  # fmt: skip


def load_evidence(evidence: Path) -> list[dict]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(evidence.glob("proc-*.json"))]


def check_evidence(
    records: list[dict], world_size: int, nodes: int, backend: str = "gloo", expect_loss: bool = True
) -> list[str]:
    """Everything a correct multi-node run must show; returns the problems found (empty: correct)."""
    problems: list[str] = []
    ranks = sorted(int(r["env"]["RANK"]) for r in records)
    if ranks != list(range(world_size)):
        return [f"expected one evidence file per global rank 0..{world_size - 1}, got ranks {ranks}"]
    by_rank = {int(r["env"]["RANK"]): r for r in records}

    # The setup itself: several nodes, each with its own local rank 0.
    node_ids = {r["node"] for r in records}
    if len(node_ids) != nodes:
        problems.append(f"expected processes on {nodes} nodes, got nodes {sorted(map(str, node_ids))}")
    local_zero = [rk for rk, r in by_rank.items() if r["env"]["LOCAL_RANK"] == "0"]
    if len(local_zero) != nodes:
        problems.append(f"expected a local rank 0 on each node, got global ranks {local_zero}")
    seen = {(r["node"], r["env"]["LOCAL_RANK"]) for r in records}
    if len(seen) != world_size:
        problems.append("two processes share a (node, local rank)")

    for rk, r in sorted(by_rank.items()):
        inits = r["init"]
        if not inits:
            problems.append(f"rank {rk}: init_process_group was never called")
            continue
        got = inits[-1]
        if (got["rank"], got["world_size"]) != (rk, world_size):
            problems.append(f"rank {rk}: process group says rank {got['rank']} of {got['world_size']}")
        if got["group_backend"] != backend:
            problems.append(f"rank {rk}: backend {got['group_backend']}, expected {backend}")
        # On GPUs, the device must follow the local rank, never the global rank.
        for dev in r["set_device"]:
            if re.sub(r"\D", "", dev.split(",")[-1]) not in (r["env"]["LOCAL_RANK"], ""):
                problems.append(f"rank {rk}: set_device({dev}) with LOCAL_RANK={r['env']['LOCAL_RANK']}")
        if "cuda_current_device" in r and str(r["cuda_current_device"]) != r["env"]["LOCAL_RANK"]:
            problems.append(f"rank {rk}: ran on cuda:{r['cuda_current_device']}, LOCAL_RANK={r['env']['LOCAL_RANK']}")

    writers = sorted(rk for rk, r in by_rank.items() if r["writes"] or r["saves"])
    if writers and writers != [0]:
        problems.append(f"files written by global ranks {writers}, not by rank 0 alone: " + "; ".join(
            f"rank {rk}: {sorted(set(by_rank[rk]['writes'] + by_rank[rk]['saves']))}" for rk in writers
        ))  # fmt: skip
    printers = sorted(rk for rk, r in by_rank.items() if LOSS.search(r["stdout"] + r["stderr"]))
    if expect_loss and printers != [0]:
        problems.append(f"loss printed by global ranks {printers}, expected [0]")

    problems += _check_samplers(by_rank, world_size)
    return problems


def _check_samplers(by_rank: dict[int, dict], world_size: int) -> list[str]:
    problems = []
    shards: dict[tuple[int, int], dict[int, dict]] = {}
    for rk, r in by_rank.items():
        for s in r["samplers"]:
            if (s["rank"], s["num_replicas"]) != (rk, world_size):
                problems.append(
                    f"rank {rk}: DistributedSampler shards as rank {s['rank']} of {s['num_replicas']}"
                    f" instead of {rk} of {world_size}"
                )
            shards.setdefault((s["seq"], s["iteration"]), {})[rk] = s
    for key, per_rank in sorted(shards.items()):
        if len(per_rank) != world_size:
            problems.append(f"sampler {key}: iterated on ranks {sorted(per_rank)} only")
            continue
        n = next(iter(per_rank.values()))["dataset_len"]
        sets = {rk: set(s["indices"]) for rk, s in per_rank.items()}
        union = set().union(*sets.values())
        if union != set(range(n)):
            problems.append(f"sampler {key}: shards cover {len(union)} of {n} samples")
        # DistributedSampler pads by repeating samples only when n is not divisible.
        padding = -n % world_size
        overlap = sum(len(s) for s in sets.values()) - len(union)
        if overlap > padding:
            problems.append(f"sampler {key}: shards overlap by {overlap} samples (padding allows {padding})")
    return problems


def describe(runs: list[AgentRun], records: list[dict]) -> str:
    text = [f"--- agent {r.node} exit {r.returncode}\n{r.output[-3000:]}" for r in runs]
    text += [f"--- rank {r['env']['RANK']} node {r['node']} stdout:\n{r['stdout'][-800:]}" for r in records]
    return "\n".join(text)


def summary(records: list[dict]) -> str:
    """One line per process: where it ran and what it did (for the logs kept under bench/)."""
    lines = []
    for r in sorted(records, key=lambda r: int(r["env"]["RANK"])):
        env = r["env"]
        wrote = sorted({os.path.basename(p) for p in r["writes"] + r["saves"]})
        printed = len([ln for ln in r["stdout"].splitlines() if LOSS.search(ln)])
        shards = [f"{s['rank']}/{s['num_replicas']}" for s in r["samplers"][:1]]
        init = r["init"][-1] if r["init"] else {}
        lines.append(
            f"rank {env['RANK']}: node {r['node']} ({env.get('SLURMD_NODENAME') or '-'}) local_rank {env['LOCAL_RANK']}"
            f" group {init.get('group_backend')} {init.get('rank')}/{init.get('world_size')}"
            f" set_device {r['set_device'] or '-'} cuda {r.get('cuda_current_device', '-')}"
            f" CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r}"
            f" sampler {shards or '-'} loss lines {printed} wrote {wrote or '-'}"
        )
    return "\n".join(lines)
