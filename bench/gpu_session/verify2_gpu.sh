#!/bin/bash
# verify v2 on 2 GPUs (NCCL): the control and every broken script of tests/verify_cases/ once, with
# --nproc 2 (the two-node case as --nnodes 2 x --nproc 1, one GPU per "node"). Each line of the
# summary says PASS when verify exited as expected and the expected check failed with its cause.
# Usage (repo root, a 2-GPU machine, torch with CUDA): OUT=/some/dir bash bench/gpu_session/verify2_gpu.sh
set -u
O=${OUT:-/tmp/verify2_gpu}; mkdir -p "$O"; T=$O/logs; mkdir -p "$T"; W=$O/work; mkdir -p "$W"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
C=tests/verify_cases
{ date -u; nvidia-smi -L; python3 -c 'import torch;print("torch",torch.__version__, "cuda", torch.cuda.device_count())'; } > "$T/000_machine.log" 2>&1
cat "$T/000_machine.log"

# check NAME EXPECTED_EXIT "CHECK=cause substring" ...: judge NAME's JSON report.
check() {
  python3 - "$T/$1.json" "$2" "${@:3}" <<'PY'
import json, sys
path, want_exit, *wants = sys.argv[1:]
name = path.rsplit("/", 1)[-1][:-5]
try:
    doc = json.load(open(path))
except Exception as exc:
    print(f"FAIL {name}: no report ({exc})"); sys.exit()
failed = {c["name"]: (c.get("cause") or c["figure"]) for c in doc.get("checks", []) if c["status"] == "FAIL"}
problems = []
if str(doc.get("exit_code")) != want_exit:
    problems.append(f"exit {doc.get('exit_code')}, expected {want_exit}")
for want in wants:
    check, _, text = want.partition("=")
    if check not in failed:
        problems.append(f"{check} did not fail")
    elif text not in failed[check]:
        problems.append(f"{check} cause lacks {text!r}: {failed[check][:300]!r}")
if problems:
    print(f"FAIL {name}: " + "; ".join(problems) + f" (failed checks: {sorted(failed)})")
else:
    print(f"PASS {name}: exit {doc.get('exit_code')}, failed {sorted(failed) or 'nothing'}")
PY
}

v() {  # NAME verify-args...
  local name=$1; shift
  echo "\$ ddpify verify $*" > "$T/$name.log"
  # --json before the script: what follows `--` goes to the script.
  ( cd "$W" && timeout 400 python3 -m ddpify.verify --json "$T/$name.json" "$@" ) >> "$T/$name.log" 2>&1
  echo "exit status $?" >> "$T/$name.log"
}
R=$PWD
v control          $R/$C/control.py --no-convert --nproc 2 --steps 6 -- --out $W
v no_sampler       $R/$C/no_sampler.py --no-convert --no-baseline --nproc 2 --steps 6 -- --out $W
v no_ddp           $R/$C/no_ddp.py --no-convert --no-baseline --nproc 2 --steps 6 -- --out $W
v all_ranks_save   $R/$C/all_ranks_save.py --no-convert --no-baseline --nproc 2 --steps 6 -- --out $W
v no_set_epoch     $R/$C/no_set_epoch.py --no-convert --no-baseline --nproc 2 --steps 6 -- --out $W
v no_set_device    $R/$C/no_set_device.py --no-convert --no-baseline --nproc 2 --steps 6 -- --out $W
v rank0_collective $R/$C/rank0_collective.py --no-convert --no-baseline --nproc 2 --steps 6 --timeout 30 -- --out $W
v uneven_batches   $R/$C/uneven_batches.py --no-convert --no-baseline --nproc 2 --steps 10 --timeout 30 -- --out $W
v unused_param     $R/$C/unused_param.py --no-convert --nproc 2 --steps 6
v seed_per_rank    $R/$C/seed_per_rank.py --no-convert --no-baseline --nproc 2 --epochs 1 -- --out $W
v early_stop_break $R/$C/early_stop_break.py --no-convert --no-baseline --nproc 2 --steps 6 --timeout 30 -- --out $W
v local_rank_guard $R/$C/local_rank_guard.py --no-convert --no-baseline --nnodes 2 --nproc 1 --steps 6
# The converted script that never saves: the stand-in converter is the test suite's, so through Python.
echo "\$ run_verify single.py with never_saves_ddp.py as the conversion, --epochs 1" > "$T/never_saves.log"
( cd "$W" && timeout 400 python3 - "$R" "$T/never_saves.json" <<'PY' ) >> "$T/never_saves.log" 2>&1
import sys
from pathlib import Path
from ddpify import Result
from ddpify.verify import run_verify
root, out = Path(sys.argv[1]), sys.argv[2]
conv = lambda source, options, path: Result(source=(root / "tests/verify_cases/never_saves_ddp.py").read_text(), changed=True, status="converted")
run_verify(str(root / "tests/verify_cases/single.py"), ["--out", "."], nproc=2, epochs=1, json_path=out, converter=conv)
PY
echo "exit status $?" >> "$T/never_saves.log"

{
check control 0
check no_sampler 1 "data-sharding=not DistributedSampler"
check no_ddp 1 "params-in-sync=never wrapped in DistributedDataParallel"
check all_ranks_save 1 "rank0-writes=runs on every rank"
check no_set_epoch 1 "epoch-shuffle=set_epoch(epoch) is never called"
check no_set_device 1 "devices=set_device(LOCAL_RANK) is never called"
check rank0_collective 1 "no-hang=inside \`if rank == 0:\`"
# NCCL may hang instead of aborting on the mismatched collectives: the imbalance is named either way.
check uneven_batches 1 "even-batches=rank 0: 9 batches, rank 1: 7"
check unused_param 1 "ranks=aux_head.weight, aux_head.bias"
check seed_per_rank 1 "data-sharding=rank 0: seed=0, rank 1: seed=1" "saved=module."
check early_stop_break 1 "no-hang=through the \`break\` at line 55"
check local_rank_guard 1 "rank0-writes=(node 1, LOCAL_RANK 0)"
check never_saves 1 "saved=never ran on any rank"
} | tee "$O/verify2_gpu_summary.txt"
cat "$T"/*.log > "$O/verify2_gpu.log"
echo "summary: $(grep -c '^PASS' "$O/verify2_gpu_summary.txt") PASS, $(grep -c '^FAIL' "$O/verify2_gpu_summary.txt") FAIL; logs in $O"
