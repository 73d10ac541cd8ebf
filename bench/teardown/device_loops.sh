#!/usr/bin/env bash
# Many abort loops side by side on a machine with many cores (the GPU machine's 16 CPU cores; gloo
# on CPU, no GPU used): the scripts come from `abort_loop.py --export` (no git or ddpify needed there).
#   python bench/teardown/abort_loop.py --fixture ... --export .teardown_carry/after        # here
#   python bench/teardown/abort_loop.py --fixture ... --rev f4d309f --export .teardown_carry/before
#   bash bench/teardown/device_loops.sh $OUT 500 "tryit 01_toplevel_regression" 3 100 "01_toplevel_regression" 1 100
# args: OUT SECONDS AFTER_KINDS LOOPS_PER_KIND RUNS_PER_LOOP BEFORE_KINDS BEFORE_LOOPS BEFORE_RUNS
set -u
OUT=$1; SECS=$2; AFTER=$3; NA=$4; RA=$5; BEFORE=${6:-}; NB=${7:-0}; RB=${8:-0}
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
$PY -c 'import torch, sys; print("torch", torch.__version__, "python", sys.version.split()[0])' | tee "$OUT/summary.txt"
nproc | sed 's/^/cores: /' | tee -a "$OUT/summary.txt"
start() {  # set kind loops runs
  for kind in $2; do
    for i in $(seq 1 "$3"); do
      timeout "$SECS" $PY bench/teardown/abort_loop.py --scripts ".teardown_carry/$1" --only "$kind" --runs "$4" \
        --out "$OUT/json/$1_${kind}_$i.json" --keep-logs "$OUT/fail/$1_${kind}_$i" > "$OUT/json/$1_${kind}_$i.log" 2>&1 &
    done
  done
}
mkdir -p "$OUT/json" "$OUT/fail"
start after "$AFTER" "$NA" "$RA"
[ -n "$BEFORE" ] && start before "$BEFORE" "$NB" "$RB"
wait
$PY - "$OUT" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys, glob, collections, os
out = sys.argv[1]
tot = collections.defaultdict(lambda: [0, 0, 0])
for f in sorted(glob.glob(os.path.join(out, "json", "*.json"))):
    name = os.path.basename(f)[:-5]
    setname, rest = name.split("_", 1)
    for kind, r in json.load(open(f))["kinds"].items():
        t = tot[(setname, kind)]
        t[0] += r["runs"]; t[1] += r["nonzero_exit"]; t[2] += r["terminate_called"]
for (s, k), (n, bad, term) in sorted(tot.items()):
    print(f"{s:7s} {k:30s} {n:5d} runs  {bad:3d} non-zero exit  {term:3d} 'terminate called'")
PY
tar -czf "$OUT/loops.tgz" -C "$OUT" json fail && rm -rf "$OUT/json" "$OUT/fail"
