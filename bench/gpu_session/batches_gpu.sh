#!/bin/bash
# The corpus entries of the no-DataLoader/sampler work (branch `batches`) on 2 GPUs with NCCL:
# ng-gpt (too large for verify on the shared CPU) and the entries that are correct on CPU, whose
# GPU path differs (NCCL, autocast, pinned copies). Same harness as realworld_gpu.sh, with --only.
# Needs .realworld_export/ (python bench/realworld/run.py --export .realworld_export) carried with
# the working tree. Usage (repo root): bash bench/gpu_session/batches_gpu.sh OUTDIR
# Prints one PASS/FAIL line per entry; logs and results in OUTDIR.
set -u
O=${1:-${OUT:-/tmp/batches_gpu}}
mkdir -p "$O"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ ! -d .realworld_export ]; then
  echo "FAIL setup: .realworld_export/ is missing (run.py --export .realworld_export, then carry it)"; exit 2
fi
ENTRIES=ng-gpt,ng-bigram,examples-word-lm,yunjey-language-model,pygcn,pygat,examples-gat,makemore
{ date -u; nvidia-smi -L; git rev-parse HEAD; } > "$O/machine.txt" 2>&1
cat "$O/machine.txt"
python3 bench/realworld/run.py --gpu --from-export .realworld_export --only "$ENTRIES" \
  --results "$O/results_gpu.json" --logs "$O/logs" --diffs "$O/diffs" 2>&1 | tee "$O/run.out"
python3 - "$O/results_gpu.json" <<'PY'
import json, sys
res = json.load(open(sys.argv[1]))
for name, r in sorted(res.items()):
    tag = "PASS" if r["outcome"] in ("correct", "refused") else "FAIL"
    print(f"{tag} {name}: {r['outcome']} {r.get('cause', '')}")
PY
