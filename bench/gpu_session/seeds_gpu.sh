#!/bin/bash
# Branch `seeds` (DDP145-DDP147) on 2 GPUs with NCCL: rank0_seed() broadcasts a CUDA tensor there.
# 1. a device-using script that draws its target with no seed, converted and run under torchrun:
#    every rank must print the same target (PASS) - the CPU tests cover gloo only;
# 2. the corpus entries the change touches (examples-regression, examples-dcgan) and the other
#    DDP110 entries, with verify's one-process baseline.
# Needs .realworld_export/ carried with the working tree for part 2.
# Usage (repo root): bash bench/gpu_session/seeds_gpu.sh OUTDIR
set -u
O=${1:-${OUT:-/tmp/seeds_gpu}}
mkdir -p "$O"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ date -u; nvidia-smi -L; git rev-parse HEAD; } > "$O/machine.txt" 2>&1
cat "$O/machine.txt"
cat > "$O/fit.py" <<'PY'
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
coeffs = torch.randn(3, 1, device=device)
model = nn.Linear(3, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(50):
    x = torch.randn(32, 3, device=device)
    loss = nn.functional.mse_loss(model(x), x @ coeffs)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", loss.item())
PY
python3 -m ddpify "$O/fit.py" > "$O/convert.txt" 2>&1
grep -q "rank0_seed())" "$O/fit.py" && echo "PASS convert: rank0_seed added" || echo "FAIL convert: no rank0_seed (see convert.txt)"
# every rank reports its target on stderr (ddpify guards prints to rank 0)
printf '\nimport sys\nprint("TARGET", RANK, [round(v, 6) for v in coeffs.view(-1).tolist()], file=sys.stderr)\n' >> "$O/fit.py"
torchrun --standalone --nproc_per_node 2 "$O/fit.py" > "$O/fit_run.txt" 2>&1
rc=$?
n=$(grep -o "TARGET [01] .*" "$O/fit_run.txt" | sed 's/TARGET [01] //' | sort -u | wc -l)
[ $rc -eq 0 ] && [ "$n" -eq 1 ] && echo "PASS nccl: both ranks drew the same target" || echo "FAIL nccl: rc=$rc, $n distinct targets (fit_run.txt)"
if [ -d .realworld_export ]; then
  python3 bench/realworld/run.py --gpu --baseline --from-export .realworld_export \
    --only examples-regression,examples-dcgan,ng-bigram,ng-gpt,spro-char-rnn-classification \
    --results "$O/results_gpu.json" --logs "$O/logs" --diffs "$O/diffs" 2>&1 | tee "$O/run.out"
  python3 - "$O/results_gpu.json" <<'PY'
import json, sys
res = json.load(open(sys.argv[1]))
for name, r in sorted(res.items()):
    tag = "PASS" if r["outcome"] in ("correct", "refused") else "FAIL"
    print(f"{tag} {name}: {r['outcome']} {r.get('cause', '')}")
PY
else
  echo "FAIL setup: .realworld_export/ is missing (run.py --export .realworld_export, then carry it)"
fi
