#!/bin/bash
# Issue 20 on 4 GPUs (session 7), one call:
#  1. the CNN's input pipeline alone: can the host feed 4 ranks (bench/gpu/loader_rate.py)?
#  2. the benchmark at 1 and 4 GPUs: hand-written DDP and ddpify --optimize, both models
#  3. the CNN again with --workers 16 for every variant (the same recipe change for all)
#  4. ddpify verify --optimize on both scripts, NCCL, 2 processes each (GPUs 0,1 and 2,3 at once)
# Usage (repo root, with .whl/): bash bench/gpu_session/optimize_4gpu_s7.sh OUTDIR
set -u
O=$1; mkdir -p "$O"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ date -u; nvidia-smi -L; nproc; lscpu | grep -i "model name\|^CPU(s)\|Thread\|Socket"; } > "$O/machine.txt" 2>&1
B="python3 bench/gpu/run_gpu_bench.py --gpus 1 4 --precisions default --timeout 70 --no-original"
echo "\$ $B --budget 220 --variants handwritten ddpify-opt --out \$OUT/bench" >> "$O/commands.txt"
timeout 300 $B --budget 220 --variants handwritten ddpify-opt --out "$O/bench" > "$O/bench.log" 2>&1
echo "bench exit $?"; grep -B2 -A30 "^## Targets" "$O/bench/gpu_results.md" | head -40
for m in cnn gpt; do
  g=$([ $m = cnn ] && echo 0,1 || echo 2,3)
  cmd="python3 -m ddpify verify bench/gpu/${m}_single.py --optimize --nproc 2 --steps 8 --timeout 60 --backend nccl"
  echo "\$ CUDA_VISIBLE_DEVICES=$g $cmd" >> "$O/commands.txt"
  (CUDA_VISIBLE_DEVICES=$g timeout 110 $cmd > "$O/verify_$m.log" 2>&1; echo "verify --optimize $m exit $?" >> "$O/verify_$m.log") &
done
wait
tail -n 3 "$O"/verify_*.log
echo "\$ python3 bench/gpu/loader_rate.py --procs 1 4 --workers 8 16 --batches 60" > "$O/loader_rate.txt"
timeout 90 python3 bench/gpu/loader_rate.py --procs 1 4 --workers 8 16 --batches 60 >> "$O/loader_rate.txt" 2>&1
cat "$O/loader_rate.txt"
echo "\$ $B --budget 60 --models cnn --variants handwritten ddpify-opt --script-args '--workers 16' --out \$OUT/bench_w16" >> "$O/commands.txt"
timeout 110 $B --budget 60 --models cnn --variants handwritten ddpify-opt --script-args "--workers 16" --out "$O/bench_w16" > "$O/bench_w16.log" 2>&1
echo "bench_w16 exit $?"; grep -A12 "^| model" "$O/bench_w16/gpu_results.md" | head -14
# the Trainer-class fixtures changed in session 7, over NCCL (GPUs 0,1)
CUDA_VISIBLE_DEVICES=0,1 timeout 200 bash bench/gpu_session/trainer_checks.sh "$O/trainer" 2>&1 | tee "$O/trainer_checks.txt"
