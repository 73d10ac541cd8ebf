#!/bin/bash
# The real-world corpus (bench/realworld) on 2 GPUs with NCCL: every entry converted by this
# checkout's ddpify, then `ddpify verify --no-convert` on the output (2 processes, NCCL), the
# original run where verify fails (harness error or wrong output), gpu_only entries included.
# No network: sources and fake data come from .realworld_export/, made beforehand on a machine
# with the mirrors and carried with the working tree:
#     python bench/realworld/run.py --export .realworld_export
# Usage (repo root): [SPLIT=dev|heldback|all] [ONLY=name,name] [JOBS=n] bash bench/gpu_session/realworld_gpu.sh OUTDIR [SHARD] [--full]
#   SPLIT: the corpus split (default dev; export with --split all to carry both).
#   SHARD I/N runs every N-th entry from the I-th (about 30-40 s an entry: 2/2 halves fit in 10 min
#   commands better than the whole corpus); --full also runs each original and the whole small run
#   of each output under torchrun. Prints one PASS/FAIL line per entry; logs and results in OUTDIR.
set -u
O=${1:-${OUT:-/tmp/realworld_gpu}}; SHARD=${2:-}; FULL=${3:-}
mkdir -p "$O"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ ! -d .realworld_export ]; then
  echo "FAIL setup: .realworld_export/ is missing (run.py --export .realworld_export, then carry it)"; exit 2
fi
{ date -u; nvidia-smi -L; git rev-parse HEAD
  python3 -c 'import torch,torchvision;print("torch",torch.__version__,"torchvision",torchvision.__version__,"cuda",torch.cuda.device_count())'
  for m in numpy PIL scipy matplotlib pandas tensorboard yaml requests tqdm accelerate; do
    python3 -c "import $m" 2>/dev/null && echo "have $m" || echo "MISSING $m (entries importing it end as harness-error)"; done
} > "$O/machine.txt" 2>&1
cat "$O/machine.txt"
python3 bench/realworld/run.py --gpu --from-export .realworld_export --split "${SPLIT:-dev}" --results "$O/results_gpu.json" \
  --logs "$O/logs" --diffs "$O/diffs" ${SHARD:+--shard "$SHARD"} ${ONLY:+--only "$ONLY"} ${JOBS:+--jobs "$JOBS"} $FULL 2>&1 | tee "$O/run.out"
python3 bench/realworld/run.py --table --split "${SPLIT:-dev}" --results "$O/results_gpu.json" > "$O/table_gpu.md"
python3 - "$O/results_gpu.json" <<'PY'
import json, sys
res = json.load(open(sys.argv[1]))
ok = {"correct", "refused", "untouched"}
for name, r in sorted(res.items()):
    tag = "PASS" if r["outcome"] in ok else "FAIL"
    print(f"{tag} {name}: {r['outcome']} {r.get('cause', '')}")
print(sum(r["outcome"] in ok for r in res.values()), "passed,", sum(r["outcome"] not in ok for r in res.values()), "failed")
PY
