#!/bin/bash
# ddpify verify on ONE GPU (issue 28): `--nproc 2` with one GPU, so the two ranks share it
# (--share-gpus, the default with fewer GPUs than processes: gloo carries the CUDA tensors, each
# rank on cuda:LOCAL_RANK % 1). Runs the two benchmark scripts (small arguments), 12 fixture
# inputs (verify converts each), the two project layouts, and every planted-bug script of
# tests/verify_cases/, each expecting its failing check. One PASS/FAIL line per case, then a
# summary; logs and JSON reports under $OUT. About 4 minutes on an H100 host (PAR runs at once).
#
# Usage (repo root; a 1-GPU machine, torch with CUDA; ddpify's deps as wheels in .whl/):
#   OUT=/some/dir bash bench/gpu_session/verify_one_gpu.sh
# A machine with several GPUs: only GPU 0 is used (CUDA_VISIBLE_DEVICES=0).
# Dry run on a CPU machine: CUDA_VISIBLE_DEVICES= bash bench/gpu_session/verify_one_gpu.sh (no GPU:
# the ranks run on the CPU, the sharing is not exercised; the cases that need one say so).
# ONLY=REGEX runs the cases whose name matches (e.g. ONLY='^(bench|fx)_').
set -u
ONLY=${ONLY:-.}
want() { [[ $1 =~ $ONLY ]]; }
O=${OUT:-/tmp/verify_one_gpu}; T=$O/logs; W=$O/work; rm -rf "$T" "$W"; mkdir -p "$T" "$W"
PAR=${PAR:-6}
R=$PWD
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$R${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-0}
START=$(date +%s)
{ date -u; nvidia-smi -L 2>&1 | head -4; echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES";
  python3 -c 'import torch; print("torch", torch.__version__, "cuda devices", torch.cuda.device_count())'; } > "$T/000_machine.log" 2>&1
cat "$T/000_machine.log"
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
C=$R/tests/verify_cases
# The benchmark scripts import their local module (project mode): a folder of their own, outside the repo.
mkdir -p "$W/bench" && cp "$R"/bench/gpu/{cnn_single,gpt_single,benchmodels}.py "$W/bench/"
cp -r "$C/projects/pythonpath" "$W/pythonpath"; cp -r "$C/projects/lazy_import" "$W/lazy_import"

# v NAME [ENV=VALUE ...] -- verify-args...: one verify run in its own working directory, in the background.
v() {
  want "$1" || return 0
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  while [ "$(jobs -r | wc -l)" -ge "$PAR" ]; do sleep 0.5; done
  mkdir -p "$W/$name"
  echo "\$ ${envs[*]} ddpify verify $*" > "$T/$name.log"
  ( cd "$W/$name" && env "${envs[@]}" timeout 300 python3 -m ddpify.verify --json "$T/$name.json" "$@" ) >> "$T/$name.log" 2>&1 &
}
# s NAME SCRIPT CONVERSION [verify-args as Python keywords]: verify SCRIPT with CONVERSION standing in for
# the converter (a planted conversion bug), through Python.
s() {
  want "$1" || return 0
  local name=$1 script=$2 conv=$3 kw=${4:-}
  while [ "$(jobs -r | wc -l)" -ge "$PAR" ]; do sleep 0.5; done
  mkdir -p "$W/$name"
  echo "\$ run_verify $script with $conv as the conversion $kw" > "$T/$name.log"
  ( cd "$W/$name" && timeout 300 python3 - "$script" "$conv" "$T/$name.json" <<PY ) >> "$T/$name.log" 2>&1 &
import sys
from pathlib import Path
from ddpify import Result
from ddpify.verify import run_verify
script, conv, out = sys.argv[1:]
stand_in = lambda source, options, path: Result(source=Path(conv).read_text(), changed=True, status="converted")
code = run_verify(script, ["--out", "."] if "single" in script else [], nproc=2, json_path=out, converter=stand_in, $kw).exit_code
print("exit status", code)
PY
}

FARGS=(--nproc 2 --steps 10 --timeout 90)
# -- the benchmark scripts, converted by verify, tiny arguments (--smoke: 1/16 width, short sequences)
v bench_cnn -- "$W/bench/cnn_single.py" "${FARGS[@]}" -- --smoke --batch-size 16 --dataset-size 512 --workers 2 --log-interval 2
v bench_gpt -- "$W/bench/gpt_single.py" "${FARGS[@]}" -- --smoke --batch-size 8 --dataset-size 512 --workers 2 --log-interval 2 --max-iters 40 --warmup-iters 4
# -- fixture inputs of different styles (their own options as in fixtures/*/options.json)
for f in 02_mnist_classic 05_json_config_file 06_cuda_style_classifier 07_cuda_nonblocking_pinned \
         09_shuffle_positional 13_checkpoint_resume 16_tqdm_pbar_postfix 20_gan 22_transformer_lm_generate \
         30_while_max_steps 36_gpt_param_groups_method 37_model_choice_branches 21_bn_cnn_syncbn 27_cuda_amp_fp16; do
  opts=(); [ "$f" = 21_bn_cnn_syncbn ] && opts=(--sync-bn); [ "$f" = 27_cuda_amp_fp16 ] && opts=(--amp fp16)
  args=(); [ -f "$R/fixtures/$f/args.txt" ] && read -r -a args < "$R/fixtures/$f/args.txt"
  v "fx_$f" -- "$R/fixtures/$f/input.py" "${FARGS[@]}" "${opts[@]}" -- "${args[@]}"
done
# -- project layouts: PYTHONPATH=. with the entry in tools/, and a module imported inside a function
v proj_pythonpath PYTHONPATH="$W/pythonpath:$PYTHONPATH" -- "$W/pythonpath/tools/train.py" "${FARGS[@]}" -- --out "$W/proj_pythonpath"
v proj_lazy -- "$W/lazy_import/train.py" "${FARGS[@]}"
# -- the planted bugs (already distributed: --no-convert), as on 2 GPUs (bench/gpu_session/verify2_gpu.sh)
P=(--no-convert --no-baseline --nproc 2 --steps 6)
v control -- "$C/control.py" --no-convert --nproc 2 --steps 6 -- --out .
v no_sampler -- "$C/no_sampler.py" "${P[@]}" -- --out .
v no_ddp -- "$C/no_ddp.py" "${P[@]}" -- --out .
v all_ranks_save -- "$C/all_ranks_save.py" "${P[@]}" -- --out .
v no_set_epoch -- "$C/no_set_epoch.py" "${P[@]}" -- --out .
v no_set_device -- "$C/no_set_device.py" "${P[@]}" -- --out .
v rank0_collective -- "$C/rank0_collective.py" "${P[@]}" --timeout 30 -- --out .
v uneven_batches -- "$C/uneven_batches.py" --no-convert --no-baseline --nproc 2 --steps 10 --timeout 30 -- --out .
v unused_param -- "$C/unused_param.py" --no-convert --nproc 2 --steps 6
v seed_per_rank -- "$C/seed_per_rank.py" --no-convert --no-baseline --nproc 2 --epochs 1 -- --out .
v early_stop_break -- "$C/early_stop_break.py" "${P[@]}" --timeout 30 -- --out .
v same_random_batches -- "$C/same_random_batches.py" "${P[@]}"
v replacement_same_draws -- "$C/replacement_same_draws.py" "${P[@]}"
v manual_step -- "$C/manual_step.py" --no-convert --nproc 2 --steps 6 -- --out .
v unusual_inputs -- "$C/unusual_inputs.py" "${P[@]}"
v tracker_media PYTHONPATH="$C/site-packages:$PYTHONPATH" -- "$C/tracker_media.py" --no-convert --nproc 2 --epochs 1 -- --out .
v needs_cuda -- "$C/needs_cuda.py" --nproc 2 --steps 3
# two "nodes" on one host cannot share one GPU: their CPU path (--backend gloo), as the report advises
v local_rank_guard -- "$C/local_rank_guard.py" --no-convert --no-baseline --nnodes 2 --nproc 1 --steps 6 --backend gloo
s never_saves "$C/single.py" "$C/never_saves_ddp.py" "epochs=1"
s helper_prints "$C/helper_prints.py" "$C/helper_prints_ddp.py" "steps=6, baseline=False"
wait

# judge NAME EXPECTED_EXIT [gpu] "CHECK=cause substring" ...: NAME's JSON report against what it must say.
judge() {
  want "$1" || return 0
  python3 - "$T/$1.json" "$GPUS" "$@" <<'PY'
import json, sys
path, gpus, name, want_exit, *wants = sys.argv[1:]
gpus = int(gpus or 0)
try:
    doc = json.load(open(path))
except Exception as exc:
    print(f"FAIL {name}: no report ({exc}; see logs/{name}.log)"); sys.exit()
checks = {c["name"]: c for c in doc.get("checks", [])}
failed = {n: (c.get("cause") or c["figure"]) for n, c in checks.items() if c["status"] == "FAIL"}
problems = []
if "gpu" in wants:
    wants.remove("gpu")
    if gpus:  # the point of this run: the ranks shared the GPU, and computed on it
        if doc.get("shared_gpus") != 1:
            problems.append(f"the ranks did not share the GPU (shared_gpus={doc.get('shared_gpus')}, backend {doc.get('backend')})")
        if "cuda:0" not in checks.get("devices", {}).get("figure", ""):
            problems.append(f"not computed on the GPU: devices {checks.get('devices', {}).get('figure')!r}")
if want_exit.startswith("gpu:"):  # the exit status expected with a GPU / without one
    with_gpu, without = want_exit[4:].split("/")
    want_exit = with_gpu if gpus else without
if str(doc.get("exit_code")) != want_exit:
    problems.append(f"exit {doc.get('exit_code')}, expected {want_exit}" + (f": {doc.get('error')}" if doc.get("error") else ""))
for want in wants:
    check, _, text = want.partition("=")
    if check not in failed:
        problems.append(f"{check} did not fail")
    elif text not in failed[check]:
        problems.append(f"{check} cause lacks {text!r}: {failed[check][:300]!r}")
if not wants and want_exit == "0" and failed:
    problems.append("failed: " + "; ".join(f"{k}: {v[:200]}" for k, v in failed.items()))
verdict = doc.get("verdict") or doc.get("error", "")[:120]
if problems:
    print(f"FAIL {name}: " + "; ".join(problems) + f" (failed checks: {sorted(failed)})")
else:
    print(f"PASS {name}: exit {doc.get('exit_code')}, failed {sorted(failed) or 'nothing'}; {verdict[:110]}")
PY
}
{
judge bench_cnn 0 gpu
judge bench_gpt 0 gpu
for f in 02_mnist_classic 05_json_config_file 06_cuda_style_classifier 07_cuda_nonblocking_pinned \
         09_shuffle_positional 13_checkpoint_resume 16_tqdm_pbar_postfix 20_gan 22_transformer_lm_generate \
         30_while_max_steps 36_gpt_param_groups_method 37_model_choice_branches 21_bn_cnn_syncbn 27_cuda_amp_fp16; do
  # an input marked `# requires: cuda` cannot run as one process without a GPU: exit 2 there, with the hint
  if head -1 "$R/fixtures/$f/input.py" | grep -q "requires: cuda"; then judge "fx_$f" gpu:0/2 gpu; else judge "fx_$f" 0 gpu; fi
done
judge proj_pythonpath 0
judge proj_lazy 0
judge control 0
judge no_sampler 1 "data-sharding=not DistributedSampler"
judge no_ddp 1 "params-in-sync=never wrapped in DistributedDataParallel"
judge all_ranks_save 1 "rank0-writes=runs on every rank"
judge no_set_epoch 1 "epoch-shuffle=set_epoch(epoch) is never called"
# One GPU: every rank belongs on cuda:0, so a missing set_device cannot show (it needs 2 GPUs: verify2_gpu.sh).
judge no_set_device 0
judge rank0_collective 1 "no-hang=inside \`if rank == 0:\`"
judge uneven_batches 1 "even-batches=rank 0: 9 batches, rank 1: 7"
judge unused_param 1 "ranks=aux_head.weight, aux_head.bias"
judge seed_per_rank 1 "data-sharding=rank 0: seed=0, rank 1: seed=1" "saved=module."
judge early_stop_break 1 "no-hang=through the \`break\` at line 55"
judge same_random_batches 1 "data-sharding=every rank computed the same gradients"
judge replacement_same_draws 1 "data-sharding=replacement=True"
judge manual_step 0
judge unusual_inputs 0
judge tracker_media 0
# With a GPU the original runs and the conversion passes; without one, exit 2 and the --no-baseline hint.
judge needs_cuda gpu:0/2
judge local_rank_guard 1 "rank0-writes=(node 1, LOCAL_RANK 0)"
judge never_saves 1 "saved=never ran on any rank"
judge helper_prints 1 "rank0-output=helper_prints.py:16"
} | tee "$O/verify_one_gpu_summary.txt"
for f in "$T"/*.log; do echo "=== $(basename "$f" .log)"; cat "$f"; done > "$O/verify_one_gpu.log"
echo "summary: $(grep -c '^PASS' "$O/verify_one_gpu_summary.txt") PASS, $(grep -c '^FAIL' "$O/verify_one_gpu_summary.txt") FAIL in $(( $(date +%s) - START )) s; logs in $O" | tee -a "$O/verify_one_gpu_summary.txt"
