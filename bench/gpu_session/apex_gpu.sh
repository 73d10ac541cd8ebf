#!/bin/bash
# Issue 33's GPU acceptance: single-GPU apex scripts (fixtures 210-225), each converted twice by
# ddpify: with --amp apex (expected_apex.py: the seeds' recipe, amp.initialize before the DDP wrap,
# amp.scale_loss, apex 25.04) and with the default --amp auto (expected.py: torch.amp). Both run
# under torchrun on the same GPUs (1 or 2) with the same seed and data; their per-epoch losses must
# agree within fp16 noise (bench/apex/compare_losses.py). PASS/FAIL per fixture, logs in OUTDIR.
#
# apex 25.04 is installed Python-only from .apex/ (`git archive 25.04` of NVIDIA/apex, carried with
# the tree; no network needed). amp, apex.parallel (DDP, the Python SyncBatchNorm) need nothing
# more; FusedAdam and FusedLAMB need apex's amp_C CUDA extension: bench/apex/build_amp_C.py builds
# it (about 30 s with 16 cores) while the fixtures that need none run, then the others run.
# Nothing here imports ddpify (no libcst needed): the outputs are the fixtures' reviewed files.
#
# Usage (repo root, torch with CUDA, nvcc for amp_C): bash bench/gpu_session/apex_gpu.sh [OUTDIR]
# OUTDIR defaults to $OUT. About 3-4 minutes on 2 H100s.
set -u
O=${1:-${OUT:-/tmp/apex_gpu}}; mkdir -p "$O"; T=$(mktemp -d)
[ -d .apex/apex/amp ] || { echo "FAIL: no apex source tree in .apex/ (git archive 25.04 of NVIDIA/apex)" | tee "$O/summary.txt"; exit 2; }
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMP_NUM_THREADS=2
NGPU=$(python3 -c 'import torch; print(max(1, min(2, torch.cuda.device_count())))')
{ date -u; nvidia-smi -L; nproc; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus used", '"$NGPU"')'; } > "$O/000_machine.log" 2>&1
SUMMARY="$O/summary.txt"; : > "$SUMMARY"
START=$(date +%s)

# fixture|script arguments (the same for both targets). No apex extension needed:
PLAIN=(
  "212_apex_trainer_class|"                        # Trainer class, opt_level from its config, scale_loss in a helper method, clip
  "214_apex_list_of_models|"                       # amp.initialize over two models and two optimizers
  "220_fp16_switch_off_by_default|--fp16"          # the script's own switch, turned on
  "221_scale_loss_helper|"                         # def backward(loss, optimizer) whose caller clips and steps
  "222_dcgan_three_losses|"                        # three losses (loss_id) onto two optimizers
  "223_fp16_off_in_config|$T/fp16_o2.json"         # the config turns fp16 on, opt_level O2
  "225_legacy_syncbn_own_group|--sync-bn"          # legacy: own process group, apex SyncBN / torch SyncBN
)
# FusedAdam / FusedLAMB: after amp_C is built
EXT=(
  "210_apex_toplevel_o1|"                          # FusedAdam (AdamW mode) at the top level, O1
  "211_apex_train_fn_o2_resume|--epochs 2"         # FusedAdam adam_w_mode=False (Adam, L2), O2, amp checkpoint
  "217_fusedlamb_amp_no_fallback|"                 # FusedLAMB kept by both targets, O2
)
echo '{"fp16": true, "opt_level": "O2"}' > "$T/fp16_o2.json"

(python3 bench/apex/build_amp_C.py --src .apex --out "$T/apex_ext" --jobs "$(nproc)" > "$O/zz_amp_C_build.log" 2>&1
 echo "build exit $?" >> "$O/zz_amp_C_build.log") & BUILD=$!
(cd .apex && python3 -m pip install --no-index --no-build-isolation --no-deps . ) > "$O/zz_apex_install.log" 2>&1
echo "apex install exit $?" >> "$O/zz_apex_install.log"
if ! python3 -c "import torch, apex.amp" 2> /dev/null; then  # the Python-only package straight from the source tree
  export PYTHONPATH="$PWD/.apex:${PYTHONPATH:-}"; echo "pip install failed: apex from PYTHONPATH=$PWD/.apex" >> "$O/zz_apex_install.log"
fi
python3 -c "import torch, apex, apex.amp, apex.parallel; print('apex', apex.__file__, 'amp and parallel import')" >> "$O/zz_apex_install.log" 2>&1

one() {  # fixture target(apex|torch) args...: one torchrun run in its own working directory
  local f=$1 target=$2; shift 2
  local script="$PWD/fixtures/$f/expected.py"; [ "$target" = apex ] && script="$PWD/fixtures/$f/expected_apex.py"
  local cwd="$T/run_${f}_$target"; mkdir -p "$cwd"
  local log="$O/${f}.$target.log"
  { echo "\$ (cd $cwd && torchrun --standalone --nproc_per_node=$NGPU $script $*)"; } > "$log"
  (cd "$cwd" && timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node="$NGPU" "$script" "$@") >> "$log" 2>&1
  echo "exit status $?" >> "$log"
}

run_pairs() {  # every run of the list at once, two per fixture (tiny models: the GPUs are shared)
  local item f args
  for item in "$@"; do
    f=${item%%|*}; args=${item#*|}
    one "$f" apex $args & one "$f" torch $args &
  done
  wait
  for item in "$@"; do
    f=${item%%|*}
    if grep -q "^exit status 0" "$O/$f.apex.log" && grep -q "^exit status 0" "$O/$f.torch.log"; then
      python3 bench/apex/compare_losses.py "$f" "$O/$f.apex.log" "$O/$f.torch.log"
    else
      echo "FAIL $f: a run did not finish (apex $(tail -1 "$O/$f.apex.log"), torch.amp $(tail -1 "$O/$f.torch.log"))"
    fi | tee -a "$SUMMARY"
  done
}

run_pairs "${PLAIN[@]}"
wait $BUILD
if grep -q "build exit 0" "$O/zz_amp_C_build.log"; then
  export PYTHONPATH="$T/apex_ext:${PYTHONPATH:-}"
  python3 -c "import torch, amp_C; from apex.optimizers import FusedAdam, FusedLAMB; print('amp_C', amp_C.__file__)" >> "$O/zz_amp_C_build.log" 2>&1
  run_pairs "${EXT[@]}"
else
  for item in "${EXT[@]}"; do echo "FAIL ${item%%|*}: amp_C did not build (zz_amp_C_build.log)" | tee -a "$SUMMARY"; done
fi
echo "$(grep -c '^PASS' "$SUMMARY") PASS, $(grep -c '^FAIL' "$SUMMARY") FAIL on $NGPU GPU(s) in $(( $(date +%s) - START )) s" | tee -a "$SUMMARY"
rm -rf "$T"
