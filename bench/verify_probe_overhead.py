"""What the verify probe costs: the same training script timed with and without the probe, in one run.

    python bench/verify_probe_overhead.py [--repeats 5] [--steps 300] [--device cpu|cuda]

For each workload the script runs alternately as `python workload.py` and as
`python ddpify/verify/probe.py workload.py` (the way verify starts every rank; K is set above the
step count so the probe never stops it). The workload times itself between step 20 and its last step
and prints samples/s and CPU seconds per step, so both measurements use the same clocks and window.
Prints medians and best runs, and the probe's cost as a fraction of throughput and in microseconds
per step, on wall-clock time and on the process's own CPU time (which other load on a shared machine
disturbs far less).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "ddpify" / "verify" / "probe.py"

WORKLOAD = """
import json, sys, time
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

width, batch, steps, device = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), torch.device(sys.argv[4])
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
torch.manual_seed(0)
data = TensorDataset(torch.randn(batch * 64, 64), torch.randint(0, 10, (batch * 64,)))
loader = DataLoader(data, batch_size=batch, shuffle=True)
model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
step, t0, seen = 0, None, 0
while step < steps:
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step == 20:
            sync()
            t0, c0, seen = time.perf_counter(), time.process_time(), 0
        elif step > 20:
            seen += x.shape[0]
        if step == steps:
            break
sync()
dt, dc = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"samples_per_s": seen / dt, "s_per_step": dt / (steps - 20), "cpu_s_per_step": dc / (steps - 20)}))
"""

CONFIGS = [
    # (name, width, batch): a tiny model, where the fixed per-step cost of the hooks shows most,
    # and a small MLP closer to a real (if small) CPU training step.
    ("tiny MLP (width 16, batch 4)", 16, 4),
    ("MLP (width 512, batch 64)", 512, 64),
]


def run_once(
    work: Path, tmp: Path, width: int, batch: int, steps: int, probe: bool, device: str
) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    args = [str(width), str(batch), str(steps), device]
    if not probe:
        out = subprocess.run(
            [sys.executable, str(work), *args],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(out.stdout.strip().splitlines()[-1])
    run_dir = Path(tempfile.mkdtemp(dir=tmp))
    env.update(
        DDPIFY_VERIFY_DIR=str(run_dir),
        DDPIFY_VERIFY_STEPS=str(steps + 1000),
        DDPIFY_VERIFY_MAIN_FILE=str(work),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
    )
    subprocess.run([sys.executable, str(PROBE), str(work), *args], env=env, check=True)
    # The probe sends the script's output to the rank's file; its record proves the hooks ran.
    record = json.loads((run_dir / "rank0.json").read_text())
    assert record["status"] == "finished" and record["steps"] == steps, record
    return json.loads((run_dir / "rank0.out").read_text().strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument(
        "--device", default="cpu", help="cpu, or cuda to time the workload on GPU 0"
    )
    args = parser.parse_args()
    import torch

    where = (
        torch.cuda.get_device_name(0)
        if args.device.startswith("cuda")
        else f"{os.cpu_count()} CPUs"
    )
    print(
        f"torch {torch.__version__}, python {sys.version.split()[0]}, {where}, OMP_NUM_THREADS=1"
    )
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="ddpify-probe-bench-") as d:
        tmp = Path(d)
        work = tmp / "workload.py"
        work.write_text(WORKLOAD)
        for name, width, batch in CONFIGS:
            plain, probed = [], []
            for _ in range(
                args.repeats
            ):  # alternate so drifting machine load hits both alike
                plain.append(
                    run_once(work, tmp, width, batch, args.steps, False, args.device)
                )
                probed.append(
                    run_once(work, tmp, width, batch, args.steps, True, args.device)
                )
            p = statistics.median(r["samples_per_s"] for r in plain)
            q = statistics.median(r["samples_per_s"] for r in probed)
            bp = max(r["samples_per_s"] for r in plain)
            bq = max(r["samples_per_s"] for r in probed)
            step_p = statistics.median(r["s_per_step"] for r in plain)
            step_q = statistics.median(r["s_per_step"] for r in probed)
            cpu_p = statistics.median(r["cpu_s_per_step"] for r in plain)
            cpu_q = statistics.median(r["cpu_s_per_step"] for r in probed)
            print(f"\n{name}, {args.steps} steps x {args.repeats} repeats each")
            for label, a, best, wall, cpu in (
                ("without probe", p, bp, step_p, cpu_p),
                ("with probe   ", q, bq, step_q, cpu_q),
            ):
                print(
                    f"  {label}: median {a:,.0f} samples/s (best {best:,.0f}), "
                    f"{wall * 1e6:,.0f} us/step wall, {cpu * 1e6:,.0f} us/step CPU"
                )
            print(
                f"  probe cost, wall clock: {1 - q / p:+.1%} of throughput (medians), {1 - bq / bp:+.1%} (best runs), "
                f"{(step_q - step_p) * 1e6:+.0f} us/step"
            )
            best_p = min(r["cpu_s_per_step"] for r in plain)
            best_q = min(r["cpu_s_per_step"] for r in probed)
            print(
                f"  probe cost, CPU time:   {cpu_q / cpu_p - 1:+.1%} per step (medians), {best_q / best_p - 1:+.1%} "
                f"(best runs), {(cpu_q - cpu_p) * 1e6:+.0f} us/step"
            )


if __name__ == "__main__":
    main()
