#!/bin/bash
# `ddpify verify` (this checkout's converter, with the one-process baseline) over NCCL on 2 GPUs
# for the Trainer-class fixtures whose conversion session 7 changed: the model handed to a class
# that moves it in __init__ (wrapped there), set_epoch through self.<loader>, a GPU index -> LOCAL_RANK.
# Usage (repo root): bash bench/gpu_session/trainer_checks.sh OUTDIR
O=${1:-/tmp/trainer_checks}; mkdir -p "$O"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD  # keep a libcst put on the path by the caller
for f in 201_trainer_gpu_index 94_trainer_loader_from_main 03_trainer_dataclass 141_cpu_only_trainer_class; do
  w=$(mktemp -d); cp fixtures/$f/input.py "$w/train.py"
  args=$(cat fixtures/$f/args.txt 2>/dev/null)
  (cd "$w" && timeout 150 python3 -m ddpify verify train.py $args --nproc 2 --backend nccl --json "$O/verify_$f.json" > "$O/verify_$f.log" 2>&1)
  rc=$?
  echo "$f verify rc=$rc: $(grep -c PASS "$O/verify_$f.log") PASS lines, $(grep -c FAIL "$O/verify_$f.log") FAIL lines"
  # the output under the real torchrun on 2 GPUs, to its end
  cp fixtures/$f/expected.py "$w/out.py"
  (cd "$w" && timeout 120 torchrun --standalone --nproc_per_node=2 out.py $args > "$O/torchrun_$f.log" 2>&1)
  echo "$f torchrun rc=$?"
done
