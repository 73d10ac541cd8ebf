#!/bin/bash
# ddpify verify on GPUs (NCCL): twelve fixtures at --nproc 2 and 4, the GPU-only bug, the
# modernised legacy-apex fixtures (apex NOT installed), then apex 25.04 from source (.apex/)
# and the --amp apex outputs. Usage (repo root, 4 GPUs): bash bench/gpu_session/verify_gpu.sh OUTDIR
set -u
O=${1:-/tmp/verify_gpu}; mkdir -p $O; T=/tmp/vlogs; rm -rf $T; mkdir -p $T
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
FIX="02_mnist_classic 05_json_config_file 09_shuffle_positional 13_checkpoint_resume 16_tqdm_pbar_postfix 20_gan 21_bn_cnn_syncbn 22_transformer_lm_generate 27_cuda_amp_fp16 30_while_max_steps 36_gpt_param_groups_method 37_model_choice_branches"
run() {  # log-name gpus verify-args...
  local name=$1 gpus=$2; shift 2
  { echo "=== $name"; echo "\$ CUDA_VISIBLE_DEVICES=$gpus ddpify verify $*"; } > $T/$name.log
  CUDA_VISIBLE_DEVICES=$gpus timeout 300 python3 -m ddpify.verify "$@" >> $T/$name.log 2>&1
  echo "exit status $?" >> $T/$name.log
}
fargs() { [ -f fixtures/$1/args.txt ] && echo -- $(cat fixtures/$1/args.txt); }
{ date -u; nvidia-smi -L; python3 -c 'import torch;print("torch",torch.__version__)'; } > $T/000_machine.log
NG=$(nvidia-smi -L | wc -l); B=2,3; [ $NG -lt 4 ] && B=0,1  # 2 GPUs: run the two groups one after the other
( for f in $FIX; do run v2_$f 0,1 fixtures/$f/input.py --nproc 2 --steps 10 --timeout 90 $(fargs $f); done ) &
[ $NG -lt 4 ] && wait
( run bug_no_set_device $B tests/verify_cases/no_set_device.py --no-convert --nproc 2 --steps 10 --timeout 90 --backend nccl
  for f in 40_apex_classifier 41_apex_segmentation_json 42_apex_two_encoders_fusedadam; do
    run modernised_$f $B fixtures/$f/expected.py --no-convert --no-baseline --nproc 2 --steps 10 --timeout 90 $(fargs $f); done ) &
wait
[ $NG -ge 4 ] && for f in $FIX; do run v4_$f 0,1,2,3 fixtures/$f/input.py --nproc 4 --steps 10 --timeout 90 $(fargs $f); done
(cd .apex && python3 -m pip install --no-build-isolation --no-deps . > $T/zz_apex_install.log 2>&1; echo "apex install exit $?" >> $T/zz_apex_install.log)
python3 -c "import apex, apex.amp, apex.parallel; print('apex amp + parallel import OK')" >> $T/zz_apex_install.log 2>&1
for f in 40_apex_classifier 41_apex_segmentation_json 42_apex_two_encoders_fusedadam; do
  run zz_apex_$f 0,1 fixtures/$f/expected_apex.py --no-convert --no-baseline --nproc 2 --steps 10 --timeout 90 $(fargs $f); done
run zz_apex_43_single 0,1 fixtures/43_single_gpu_for_apex/input.py --amp apex --nproc 2 --steps 10 --timeout 90
cat $T/*.log > $O/verify_gpu.log
grep -h "^=== \|^exit status" $T/*.log | paste - - > $O/verify_gpu_summary.txt
