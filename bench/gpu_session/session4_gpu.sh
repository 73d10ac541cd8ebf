#!/bin/bash
# Session 4's GPU checks, one part per call (each under 10 minutes on 2 GPUs, NCCL):
#   part 1: the model's lifecycle (fixtures 50-58: verify --nproc 2) and the training step at
#           default precision (step_gpu.sh part a: 70-76);
#   part 2: the training step with --amp fp16 and the outputs before the fix (step_gpu.sh part b),
#           then verify v2's broken set (verify2_gpu.sh) where it exists.
# Usage (repo root, libcst wheel in .whl/): bash bench/gpu_session/session4_gpu.sh PART OUTDIR
set -u
PART=$1; O=$2; mkdir -p "$O"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ date -u; nvidia-smi -L; python3 -c 'import torch, libcst._version as v; print("torch", torch.__version__, "libcst", v.__version__)'; } > "$O/000_machine.log" 2>&1
fargs() { [ -f fixtures/$1/args.txt ] && echo -- $(cat fixtures/$1/args.txt); }
if [ "$PART" = 1 ]; then
  mkdir -p "$O/lifecycle"
  for f in 50_apply_init_after_move 51_trainer_move_in_init 52_finetune_frozen_backbone 53_compile_orig_mod 54_ema_swa_copies 55_reload_unwrapped_for_test 56_unused_head_no_grad 57_init_helper_before_move 58_trainer_setup_freeze_ema; do
    log="$O/lifecycle/$f.log"; echo "\$ ddpify verify fixtures/$f/input.py --nproc 2 --steps 10 --timeout 90 --backend nccl" > "$log"
    CUDA_VISIBLE_DEVICES=0,1 timeout 200 python3 -m ddpify verify fixtures/$f/input.py --nproc 2 --steps 10 --timeout 90 --backend nccl $(fargs $f) >> "$log" 2>&1
    rc=$?; echo "exit status $rc" >> "$log"
    if [ $rc -eq 0 ]; then echo "PASS lifecycle $f"; else echo "FAIL lifecycle $f (exit $rc)"; fi | tee -a "$O/summary.txt"
  done
  bash bench/gpu_session/step_gpu.sh "$O/step" a 2>&1 | tee -a "$O/summary.txt"
else
  bash bench/gpu_session/step_gpu.sh "$O/step" b 2>&1 | tee -a "$O/summary.txt"
  [ -f bench/gpu_session/verify2_gpu.sh ] && bash bench/gpu_session/verify2_gpu.sh "$O/verify2" 2>&1 | tail -40 | tee -a "$O/summary.txt"
fi
