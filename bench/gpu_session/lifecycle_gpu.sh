#!/bin/bash
# The model's lifecycle on 2 GPUs (NCCL): `ddpify verify --nproc 2` on fixtures 50-58, whose wrap
# now follows the last change to the model. GPU-only: a wrap before the move to the GPU raises
# only with device_ids on GPUs, so 57 is also run as the converter of main 5a90351 wrote it
# (wrap right after `Block()`, on the CPU): that run is expected to FAIL
# ("device_ids ... only work with ... GPU modules"), the new one to PASS.
# Usage (repo root, >= 2 GPUs): bash bench/gpu_session/lifecycle_gpu.sh OUTDIR
set -u
R=$PWD; O=${1:-/tmp/lifecycle_gpu}; mkdir -p $O; T=$(mktemp -d); OLD=$(mktemp -d)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
FIX="50_apply_init_after_move 51_trainer_move_in_init 52_finetune_frozen_backbone 53_compile_orig_mod 54_ema_swa_copies 55_reload_unwrapped_for_test 56_unused_head_no_grad 57_init_helper_before_move 58_trainer_setup_freeze_ema"
run() {  # log-name expect(PASS|FAIL) verify-args...
  local name=$1 want=$2; shift 2
  { echo "=== $name"; echo "\$ ddpify verify $*"; } > $T/$name.log
  CUDA_VISIBLE_DEVICES=0,1 timeout 300 python3 -m ddpify.verify "$@" >> $T/$name.log 2>&1
  local rc=$?
  local got=PASS; [ $rc -ne 0 ] && got=FAIL
  if [ $got = $want ]; then echo "PASS $name (verify exit $rc, expected $want)"; else echo "FAIL $name (verify exit $rc, expected $want)"; fi | tee -a $T/$name.log $T/summary.txt
}
fargs() { [ -f fixtures/$1/args.txt ] && echo -- $(cat fixtures/$1/args.txt); }
{ date -u; nvidia-smi -L; python3 -c 'import torch;print("torch",torch.__version__)'; git log --oneline -1; } > $T/000_machine.log
for f in $FIX; do run v2_$f PASS fixtures/$f/input.py --nproc 2 --steps 10 --timeout 90 $(fargs $f); done
# the old wrap of 57: converted by main 5a90351's ddpify, run as it is
git archive 5a90351 ddpify | tar -x -C $OLD
(cd $OLD && python3 -c "
from ddpify import convert_source
src = open('$R/fixtures/57_init_helper_before_move/input.py').read()
open('$OLD/57_old_output.py', 'w').write(convert_source(src).source)")
grep -n "DDP(model" $OLD/57_old_output.py > $T/001_old_57_wrap.log
run old_57_wrap_before_move FAIL $OLD/57_old_output.py --no-convert --no-baseline --nproc 2 --steps 10 --timeout 90
grep -h "device_ids\|only work with" $T/old_57_wrap_before_move.log | head -3 >> $T/001_old_57_wrap.log
cat $T/*.log > $O/lifecycle_gpu.log
cp $T/summary.txt $O/lifecycle_gpu_summary.txt
cat $O/lifecycle_gpu_summary.txt
