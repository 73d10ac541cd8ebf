#!/bin/bash
# The training step on GPUs (issue 17): ddpify verify --nproc 2 (NCCL) on the fixtures whose
# conversion only matters under CUDA autocast, with the default precision (bf16 where the GPU has
# it) and with --amp fp16 (GradScaler). Then the two outputs as ddpify wrote them before the fix,
# run as they are, to show the GPU-only failures they reproduce.
# Usage (repo root, 2 GPUs or more): bash bench/gpu_session/step_gpu.sh [OUTDIR] [PART]
#   OUTDIR defaults to $OUT; PART: all (default, about 8 minutes on H100s), a (default precision),
#   b (--amp fp16, the outputs before the fix, the modernised legacy recipe): under a 10-minute
#   limit per command, run a then b.
set -u
O=${1:-${OUT:-/tmp/step_gpu}}; PART=${2:-all}; mkdir -p "$O"; T=$(mktemp -d)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
FIX="70_vae_bce 71_contrastive_inplace 74_ntxent_loss_function 75_multilabel_bceloss 72_word_lm_manual_sgd 76_optional_optimizer_lm"
FP16="70_vae_bce 71_contrastive_inplace 74_ntxent_loss_function 75_multilabel_bceloss"  # GradScaler + the fix
{ date -u; nvidia-smi -L; python3 -c 'import torch;print("torch",torch.__version__, "bf16", torch.cuda.is_bf16_supported())'; } > "$O/000_machine.log" 2>&1
summary="$O/step_gpu_summary_$PART.txt"; : > "$summary"
run() {  # name expect(pass|fail|info) verify-args...
  local name=$1 expect=$2; shift 2
  { echo "=== $name (expect $expect)"; echo "\$ ddpify verify $*"; } > "$T/$name.log"
  CUDA_VISIBLE_DEVICES=0,1 timeout 400 python3 -m ddpify verify "$@" >> "$T/$name.log" 2>&1
  local rc=$?
  echo "exit status $rc" >> "$T/$name.log"
  local got=pass; [ $rc -ne 0 ] && got=fail
  if [ "$expect" = info ]; then echo "INFO $name (verify exit $rc)"; elif [ "$got" = "$expect" ]; then echo "PASS $name (verify exit $rc, expected $expect)"; else echo "FAIL $name (verify exit $rc, expected $expect)"; fi | tee -a "$summary"
  cp "$T/$name.log" "$O/"
}
if [ "$PART" != b ]; then
  for f in $FIX; do run "${f}_auto" pass "fixtures/$f/input.py" --nproc 2 --steps 20 --timeout 120 --backend nccl; done
fi
[ "$PART" = a ] && { echo "logs: $O"; rm -rf "$T"; exit 0; }
for f in $FP16; do
  run "${f}_fp16" pass "fixtures/$f/input.py" --nproc 2 --steps 20 --timeout 120 --backend nccl --amp fp16 --no-baseline
done
# a legacy apex recipe modernised (no apex installed): nccl and set_device with CUDA (DDP098)
run legacy_77_modernised pass fixtures/77_legacy_apex_nccl/expected.py --no-convert --no-baseline --nproc 2 --steps 20 --timeout 120 --backend nccl
# before the fix, rebuilt from the expected outputs: the unsafe loss inside autocast must fail;
# logits.div_() left inside autocast is recorded either way (info)
B=$(mktemp -d)
python3 - "$B" <<'PY'
import sys, pathlib
out = pathlib.Path(sys.argv[1])
vae = pathlib.Path("fixtures/70_vae_bce/expected.py").read_text()
old = """    with torch.autocast(LOCAL_DEVICE.type, enabled=False):
        bce = F.binary_cross_entropy(recon_x.float(), x.view(-1, 64).float(), reduction="sum")"""
assert old in vae
(out / "vae_before.py").write_text(vae.replace(old, """    bce = F.binary_cross_entropy(recon_x, x.view(-1, 64), reduction="sum")"""))
con = pathlib.Path("fixtures/71_contrastive_inplace/expected.py").read_text().splitlines(True)
i = next(k for k, line in enumerate(con) if line.strip() == "logits = logits.float()")
j = next(k for k, line in enumerate(con) if line.strip().startswith("loss = 0.5"))
con[i : j + 1] = ["    " + line for line in con[i + 1 : j + 1]]
(out / "contrastive_before.py").write_text("".join(con))
PY
run before_70_vae_bce_without_fp32 fail "$B/vae_before.py" --no-convert --no-baseline --nproc 2 --steps 20 --timeout 120 --backend nccl
run before_71_inplace_under_autocast info "$B/contrastive_before.py" --no-convert --no-baseline --nproc 2 --steps 20 --timeout 120 --backend nccl
# what the fp16 manual-update conversion contains: no GradScaler, no autocast (DDP045)
python3 -m ddpify fixtures/72_word_lm_manual_sgd/input.py --amp fp16 --diff > "$O/72_fp16_diff.txt" 2>&1
if grep -q "SCALER\|torch.autocast" "$O/72_fp16_diff.txt"; then echo "FAIL 72_fp16_diff (scaler or autocast in a manual-update step)"; else echo "PASS 72_fp16_diff (no scaler, no autocast; DDP045 says why)"; fi | tee -a "$summary"
echo "logs: $O"; rm -rf "$T" "$B"
