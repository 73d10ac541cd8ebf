#!/bin/bash
# Driver for the ddpify GPU benchmark calls (lives in git-ignored .whl/, carried with the call).
# usage: bash .whl/drive.sh CALL SANITY(0|1) "DIR|EST_S|harness args" ...
# Each spec runs one harness invocation into $OUT/DIR, only if it should end before LIMIT (585 s)
# of this call; finished invocations are moved to /tmp/done and tarred into $OUT/done.tgz.
set -u
T0=$SECONDS
LIMIT=${LIMIT:-585}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
CALL=$1; SAN=$2; shift 2
mkdir -p /tmp/done
L=$OUT/sanity_$CALL.txt
{ echo "call $CALL start $(date -u '+%F %T UTC')"; echo "ddpify tree hash: $(find ddpify -name '*.py' | sort | xargs cat | sha1sum)"; } >> $L
if [ "$SAN" = 1 ]; then
  TR=$(command -v torchrun || echo "python3 -m torch.distributed.run")
  (
    echo "== sanity check: in-place DDP conversion of examples/train.py on CUDA"
    python3 -c 'import torch; print("torch.__version__ =", torch.__version__, "| cuda", torch.version.cuda, "| nccl", torch.cuda.nccl.version(), "|", torch.cuda.get_device_name(0))'
    cp examples/train.py /tmp/x.py
    echo "\$ python3 -m ddpify /tmp/x.py"; python3 -m ddpify /tmp/x.py 2>&1; echo "ddpify rc=$?"
    echo "--- /tmp/x.py after conversion:"; cat /tmp/x.py; echo "---"
    echo "\$ cd /tmp && $TR --nproc_per_node 1 /tmp/x.py"
    (cd /tmp && timeout 60 $TR --nproc_per_node 1 /tmp/x.py 2>&1); echo "torchrun rc=$?"
  ) > /tmp/sanity_raw.txt 2>&1 &
  SP=$!
  # Untimed warm-up launches of each model's hand-written script (what the harness's
  # --warm-up-launch does one after another), run at the same time, before round 1.
  for m in cnn gpt text; do
    ( t=$SECONDS; PYTHONPATH=$PWD/bench/gpu:$PWD:$PYTHONPATH BENCH_WARMUP=10 BENCH_STEPS=100 BENCH_CHUNK=10 \
      timeout 120 python3 -m torch.distributed.run --standalone --nproc_per_node=1 bench/gpu/${m}_ddp_handwritten.py --precision default;
      echo "warm-up launch $m rc=$? wall=$((SECONDS-t))s" ) > /tmp/done/warmup_$m.txt 2>&1 &
  done
  wait
  tail -n 60 /tmp/sanity_raw.txt >> $L
  cp /tmp/sanity_raw.txt /tmp/done/sanity_full.txt
  for m in cnn gpt text; do grep -h "BENCH\|rc=" /tmp/done/warmup_$m.txt >> $L; done
  echo "sanity + warm-up launches done at $((SECONDS-T0)) s" >> $L
  tar czf $OUT/done.tgz -C /tmp/done .
fi
for spec in "$@"; do
  d=${spec%%|*}; rest=${spec#*|}; est=${rest%%|*}; a=${rest#*|}
  el=$((SECONDS-T0))
  # DIR~OTHER: an alternative to OTHER, skipped where OTHER ran
  if [[ $d == *~* ]]; then o=${d#*~}; d=${d%%~*}; if [ -d /tmp/done/$o ]; then echo "SKIP $d: $o ran" | tee -a $L; continue; fi; fi
  if [ $((el+est)) -gt $LIMIT ]; then echo "SKIP $d at ${el}s (needs ~${est}s): $a" | tee -a $L; continue; fi
  B=$((LIMIT - 85 - el))
  cmd="python3 bench/gpu/run_gpu_bench.py $a --budget $B --out \$OUT/$d"
  echo "RUN $d at ${el}s: $cmd" | tee -a $L
  python3 bench/gpu/run_gpu_bench.py $a --budget $B --out $OUT/$d 2>&1 | tee /tmp/done/console_$d.txt | grep -v "^\s*$" | grep "^\[" 
  echo "END $d rc=${PIPESTATUS[0]} at $((SECONDS-T0))s" | tee -a $L
  mv $OUT/$d /tmp/done/ && tar czf $OUT/done.tgz -C /tmp/done .
done
echo "call $CALL end at $((SECONDS-T0)) s" | tee -a $L
