#!/bin/bash
# Issue 20 on GPUs, in one call: the training-speed benchmark with ddpify --optimize (all
# speed-ups, then each on its own) against ddpify, hand-written DDP and Accelerate at 1, 2 (and 4
# where there are 4 GPUs) GPUs, default precision; then `ddpify verify --optimize` (NCCL, 2
# processes) on both benchmark scripts: the optimised output against the plain one.
# Usage, from a directory holding ddpify/, bench/ and .whl/ (the libcst wheel):
#   bash bench/gpu_session/optimize_gpu.sh OUTDIR [SECONDS_FOR_ALL_OF_IT]
# SKIP_VERIFY=1 leaves out the verify runs; VARIANTS="..." picks the benchmark's variants. On 4 GPUs
# one call does not fit everything: e.g. call 1 as is (verify, then 1/4/2 GPUs as time allows), call 2
# with SKIP_VERIFY=1 VARIANTS="ddpify handwritten accelerate ddpify-opt" for what call 1 skipped.
set -u
O=$1; TOTAL=${2:-580}; mkdir -p "$O"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
N=$(nvidia-smi -L | wc -l); COUNTS="1 2"; [ "$N" -ge 4 ] && COUNTS="1 2 4"
nvidia-smi -L > "$O/machine.txt" 2>&1
# verify first (it must pass on both), then the benchmark with what is left of the call's time.
for m in $([ "${SKIP_VERIFY:-0}" = 1 ] || echo cnn gpt); do
  cmd="python3 -m ddpify verify bench/gpu/${m}_single.py --optimize --nproc 2 --steps 8 --timeout 60 --backend nccl"
  echo "\$ $cmd" | tee -a "$O/commands.txt" > "$O/verify_$m.log"
  CUDA_VISIBLE_DEVICES=0,1 timeout 120 $cmd >> "$O/verify_$m.log" 2>&1
  rc=$?; echo "exit status $rc" >> "$O/verify_$m.log"
  if [ $rc -eq 0 ]; then echo "PASS verify --optimize $m"; else echo "FAIL verify --optimize $m (exit $rc)"; fi | tee -a "$O/summary.txt"
done
LEFT=$(( TOTAL - SECONDS - 100 ))
# loader-workers is left out: persistent workers matter from the second epoch on, and a run is 50 steps of one.
VARIANTS=${VARIANTS:-"ddpify handwritten accelerate ddpify-opt opt-channels-last opt-fused-optimizer opt-cudnn-benchmark opt-ddp-buckets opt-static-graph"}
echo "\$ python3 bench/gpu/run_gpu_bench.py --gpus $COUNTS --precisions default --budget $LEFT --timeout 80 --variants $VARIANTS --out $O/bench" | tee -a "$O/commands.txt"
timeout $((LEFT + 90)) python3 bench/gpu/run_gpu_bench.py --gpus $COUNTS --precisions default --budget "$LEFT" --timeout 80 --variants $VARIANTS --out "$O/bench" > "$O/bench.log" 2>&1
echo "bench exit $?" | tee -a "$O/summary.txt"
grep -A40 "^## Targets" "$O/bench/gpu_results.md" | head -30 >> "$O/summary.txt"
