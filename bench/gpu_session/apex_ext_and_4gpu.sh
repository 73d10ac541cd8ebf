#!/bin/bash
# One 4-GPU call: build apex 25.04's amp_C extension (bench/apex/build_amp_C.py) in the
# background while the GPUs run the 2 nodes x 2 GPUs NCCL run and `verify --nproc 4` on six
# fixtures; then install apex 25.04 Python-only from .apex/ and verify the --amp apex outputs
# of 40-43 at --nproc 2 with amp_C on PYTHONPATH (42 keeps apex FusedAdam, which needs it).
# Usage (repo root, 4 GPUs, .apex/ = `git archive 25.04` of NVIDIA/apex): bash bench/gpu_session/apex_ext_and_4gpu.sh OUTDIR
set -u
O=${1:-/tmp/x4_out}; mkdir -p $O; T=/tmp/x4logs; rm -rf $T; mkdir -p $T
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
run() {  # log-name gpus verify-args...
  local name=$1 gpus=$2; shift 2
  { echo "=== $name"; echo "\$ CUDA_VISIBLE_DEVICES=$gpus ddpify verify $*"; } > $T/$name.log
  CUDA_VISIBLE_DEVICES=$gpus timeout 150 python3 -m ddpify.verify "$@" >> $T/$name.log 2>&1
  echo "exit status $?" >> $T/$name.log
}
fargs() { [ -f fixtures/$1/args.txt ] && echo -- $(cat fixtures/$1/args.txt); }
{ date -u; nvidia-smi -L; python3 -c 'import torch;print("torch",torch.__version__)'; nproc; } > $T/000_machine.log
(nice -n 10 python3 bench/apex/build_amp_C.py --src .apex --out /tmp/apex_ext --jobs 16 > $T/zz_amp_C_build.log 2>&1; echo "build exit $?" >> $T/zz_amp_C_build.log) & BUILD=$!
bash bench/multinode/run_2x2_nccl.sh $O
for f in 02_mnist_classic 13_checkpoint_resume 21_bn_cnn_syncbn 22_transformer_lm_generate 30_while_max_steps 36_gpt_param_groups_method; do
  run v4_$f 0,1,2,3 fixtures/$f/input.py --nproc 4 --steps 10 --timeout 90 $(fargs $f); done
wait $BUILD
(cd .apex && python3 -m pip install --no-build-isolation --no-deps . > $T/zz_apex_install.log 2>&1; echo "apex install exit $?" >> $T/zz_apex_install.log)
export PYTHONPATH=/tmp/apex_ext:${PYTHONPATH:-}
python3 -c "import amp_C, apex, apex.amp, apex.parallel; from apex.optimizers import FusedAdam; print('apex amp + parallel + amp_C import OK', amp_C.__file__)" >> $T/zz_apex_install.log 2>&1
for f in 42_apex_two_encoders_fusedadam 40_apex_classifier 41_apex_segmentation_json; do
  run zz_apex_$f 0,1 fixtures/$f/expected_apex.py --no-convert --no-baseline --nproc 2 --steps 10 --timeout 90 $(fargs $f); done
run zz_apex_43_single 0,1 fixtures/43_single_gpu_for_apex/input.py --amp apex --nproc 2 --steps 10 --timeout 90
cat $T/*.log > $O/apex_ext_and_4gpu.log
grep -h "^=== \|^exit status\|^build exit\|^apex install exit" $T/*.log > $O/apex_ext_and_4gpu_summary.txt
