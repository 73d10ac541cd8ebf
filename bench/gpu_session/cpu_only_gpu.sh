#!/bin/bash
# CPU programs on a GPU machine (DDP120): a script that never names a device is converted to a
# gloo CPU program. On a machine with 2 GPUs it must still train, touch no GPU (no CUDA context,
# nothing in nvidia-smi's process list) and pass verify. Also runs the corpus entries that are
# CPU programs, when an export is there (python bench/realworld/run.py --export .realworld_export).
# Usage (repo root, 2 GPUs): bash bench/gpu_session/cpu_only_gpu.sh OUTDIR
set -u
O=${1:-/tmp/cpu_only_out}; mkdir -p $O
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
{ date -u; nvidia-smi -L; python3 -c 'import torch;print("torch",torch.__version__, "cuda", torch.cuda.is_available())'; } > $O/000_machine.log 2>&1

for f in 45_cpu_only_regression 140_cpu_only_main_functions 141_cpu_only_trainer_class; do
  log=$O/$f.log; work=$(mktemp -d)
  cp fixtures/$f/expected.py $work/
  # torchrun, 2 ranks; a watcher samples nvidia-smi's compute processes while it runs
  (cd $work && timeout 180 python3 -m torch.distributed.run --standalone --nproc_per_node=2 expected.py) > $log 2>&1 & RUN=$!
  : > $O/$f.gpu_procs
  while kill -0 $RUN 2>/dev/null; do nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader >> $O/$f.gpu_procs 2>/dev/null; sleep 0.5; done
  wait $RUN; rc=$?
  timeout 180 python3 -m ddpify.verify fixtures/$f/input.py --nproc 2 --steps 20 --timeout 90 >> $log 2>&1; vrc=$?
  if [ $rc -eq 0 ] && [ $vrc -eq 0 ] && ! grep -q python $O/$f.gpu_procs && ! grep -qi "cuda\|nccl" <(grep -i "error" $log); then
    echo "PASS $f (torchrun rc=$rc, verify rc=$vrc, no GPU process)"
  else
    echo "FAIL $f (torchrun rc=$rc, verify rc=$vrc, GPU processes: $(sort -u $O/$f.gpu_procs | tr '\n' ' '))"
  fi
  rm -rf $work
done | tee $O/summary.txt
if [ -d .realworld_export ]; then
  python3 bench/realworld/run.py --gpu --from-export .realworld_export \
    --only hunkim-cnn-mnist,morvan-cnn,morvan-autoencoder,morvan-rnn-classifier > $O/realworld_cpu_programs.log 2>&1
  tail -8 $O/realworld_cpu_programs.log | tee -a $O/summary.txt
fi
