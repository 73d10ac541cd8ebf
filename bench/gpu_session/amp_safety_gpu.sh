#!/bin/bash
# Mixed precision that must be left out or confined on GPUs (branch amp): DDP044 (losses on
# probabilities, in_float32) and DDP140 (sparse tensors). Part 1: the torch facts the rules rest
# on, on CUDA bf16 (and fp16 where said). Part 2: ddpify verify --nproc 2 (NCCL) on the fixtures.
# Usage (repo root, 2 GPUs): bash bench/gpu_session/amp_safety_gpu.sh [OUTDIR]   (about 4 minutes)
set -u
O=${1:-${OUT:-/tmp/amp_safety_gpu}}; mkdir -p "$O"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
summary="$O/amp_safety_summary.txt"; : > "$summary"
{ date -u; nvidia-smi -L; python3 -c 'import torch;print("torch",torch.__version__, "bf16", torch.cuda.is_bf16_supported())'; } > "$O/000_machine.log" 2>&1

# -- part 1: torch facts on CUDA ---------------------------------------------------------
python3 - > "$O/part1_facts.log" 2>&1 <<'PY'
import torch, torch.nn as nn, torch.nn.functional as F
dev = "cuda"
torch.manual_seed(0)

def line(ok, name, what):
    print(f"{'PASS' if ok else 'FAIL'} {name} ({what})")

def in_float32(op):  # as ddpify generates it
    def run(*args, **kwargs):
        f32 = lambda v: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        with torch.autocast(dev, enabled=False):
            return op(*map(f32, args), **{k: f32(v) for k, v in kwargs.items()})
    return run

G = nn.Sequential(nn.Linear(8, 16), nn.Tanh()).to(dev)
D = nn.Sequential(nn.Linear(16, 1), nn.Sigmoid()).to(dev)
bce = nn.BCELoss()
z, valid = torch.randn(32, 8, device=dev), torch.ones(32, 1, device=dev)
# 1. the former output: the whole statement under autocast(enabled=False) (gan-vanilla's error)
try:
    with torch.autocast(dev, dtype=torch.bfloat16):
        g = G(z)
        with torch.autocast(dev, enabled=False):
            loss = bce(D(g).float(), valid.float())
    line(False, "old_statement_off_fails", "it ran: expected a dtype error")
except RuntimeError as e:
    line("dtype" in str(e) or "same" in str(e), "old_statement_off_fails", str(e).splitlines()[0][:100])
# 2. in_float32: D under autocast, the loss alone in float32, backward works
with torch.autocast(dev, dtype=torch.bfloat16):
    g = G(z)
    loss = in_float32(bce)(D(g), valid)
loss.backward()
line(loss.dtype == torch.float32 and torch.isfinite(loss).item(), "in_float32_runs", f"loss {loss.item():.4f} {loss.dtype}")
# 3. BCE inside CUDA autocast is refused by torch itself
try:
    with torch.autocast(dev, dtype=torch.bfloat16):
        bce(D(G(z)), valid)
    line(False, "bce_refused_under_autocast", "it ran")
except RuntimeError as e:
    line("unsafe to autocast" in str(e), "bce_refused_under_autocast", str(e).splitlines()[0][:80])
# 4. probabilities in bf16/fp16: a sigmoid of confident logits rounds to exactly 1, and BCE
#    against target 0 hits its clamp (100) where float32 gives ~logit
lin = nn.Linear(4, 1).to(dev)
with torch.no_grad():
    lin.weight.fill_(2.0); lin.bias.zero_()
x = torch.full((64, 4), 1.0, device=dev)  # logit 8
y0 = torch.zeros(64, 1, device=dev)
ref = F.binary_cross_entropy(torch.sigmoid(lin(x)), y0).item()
for dt in (torch.bfloat16, torch.float16):
    with torch.autocast(dev, dtype=dt):
        p = torch.sigmoid(lin(x))
    got = F.binary_cross_entropy(p.float(), y0).item()
    print(f"INFO probabilities_{dt}: p dtype {p.dtype}, exactly 1.0: {(p == 1).float().mean().item():.2f}, BCE {got:.2f} vs float32 {ref:.2f}")
    if dt == torch.bfloat16:
        line(got > 2 * ref, "bf16_probabilities_break_bce", f"{got:.2f} vs {ref:.2f}")
# 5. sparse: pygcn's torch.spmm under autocast
i = torch.tensor([[0, 1, 2], [1, 2, 0]], device=dev)
adj = torch.sparse_coo_tensor(i, torch.ones(3, device=dev), (3, 3))
w = nn.Linear(4, 4).to(dev)
for dt in (torch.bfloat16, torch.float16):
    try:
        with torch.autocast(dev, dtype=dt):
            out = torch.spmm(adj, w(torch.randn(3, 4, device=dev)))
        out.sum().backward()
        print(f"INFO spmm_under_{dt}: runs ({out.dtype})")
        if dt == torch.bfloat16:
            line(False, "spmm_bf16_fails", "it ran")
    except (RuntimeError, NotImplementedError) as e:
        print(f"INFO spmm_under_{dt}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
        if dt == torch.bfloat16:
            line(True, "spmm_bf16_fails", str(e).splitlines()[0][:80])
# 6. INFO, for gan-acgan's GPU-only error (a [128] float tensor modified in place, at D's
#    backward): a BatchNorm discriminator run twice (real, fake) before one backward
Dbn = nn.Sequential(nn.Conv2d(1, 8, 3, 2, 1), nn.LeakyReLU(0.2), nn.BatchNorm2d(8, 0.8), nn.Flatten(), nn.Linear(8 * 8 * 8, 1)).to(dev)
xr, xf = torch.randn(16, 1, 16, 16, device=dev), torch.randn(16, 1, 16, 16, device=dev)
for dt in (None, torch.bfloat16, torch.float16):
    try:
        with torch.autocast(dev, dtype=dt or torch.bfloat16, enabled=dt is not None):
            l = F.binary_cross_entropy_with_logits(Dbn(xr), torch.ones(16, 1, device=dev)) + F.binary_cross_entropy_with_logits(Dbn(xf), torch.zeros(16, 1, device=dev))
        l.backward()
        print(f"INFO bn_two_forwards_autocast_{dt}: backward ok")
    except RuntimeError as e:
        print(f"INFO bn_two_forwards_autocast_{dt}: {str(e).splitlines()[0][:140]}")
PY
grep -E "^(PASS|FAIL|INFO)" "$O/part1_facts.log" | tee -a "$summary"
[ -s "$O/part1_facts.log" ] && ! grep -qE "^(PASS|FAIL)" "$O/part1_facts.log" && echo "FAIL part1 (no result: see part1_facts.log)" | tee -a "$summary"

# -- part 2: ddpify verify on 2 GPUs ------------------------------------------------------
run() {  # name verify-args...
  local name=$1; shift
  { echo "=== $name"; echo "\$ ddpify verify $*"; } > "$O/$name.log"
  CUDA_VISIBLE_DEVICES=0,1 timeout 300 python3 -m ddpify verify "$@" >> "$O/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then echo "PASS $name"; else echo "FAIL $name (verify exit $rc)"; fi | tee -a "$summary"
}
V="--nproc 2 --steps 30 --timeout 120 --backend nccl"
run 180_gan_bf16 fixtures/180_gan_bceloss_amp_bf16/input.py --amp bf16 $V
run 180_gan_fp16 fixtures/180_gan_bceloss_amp_bf16/input.py --amp fp16 $V
run 180_gan_auto fixtures/180_gan_bceloss_amp_bf16/input.py $V
run 70_vae_bce_auto fixtures/70_vae_bce/input.py $V
run 70_vae_bce_bf16 fixtures/70_vae_bce/input.py --amp bf16 $V
run 75_multilabel_auto fixtures/75_multilabel_bceloss/input.py $V
run 181_gcn_sparse_auto fixtures/181_gcn_sparse_adjacency/input/train.py $V
run 181_gcn_sparse_bf16 fixtures/181_gcn_sparse_adjacency/input/train.py --amp bf16 $V
# what the conversions contain: no autocast for the BCE and sparse cases by default
for f in 70_vae_bce/input.py 75_multilabel_bceloss/input.py 181_gcn_sparse_adjacency/input/train.py; do
  python3 -m ddpify "fixtures/$f" --diff > "$O/diff_$(echo "$f" | tr / _).txt" 2>&1
  if grep -q "^+.*torch.autocast" "$O/diff_$(echo "$f" | tr / _).txt"; then echo "FAIL no_autocast $f"; else echo "PASS no_autocast $f"; fi | tee -a "$summary"
done
echo "summary: $summary"
