#!/bin/bash
# Session 8's corpus runs on a 2-GPU machine (NCCL), one split per invocation, several at once.
# The device gets the session's checkout, not this branch: this branch's tree travels as a
# tarball and runs from a copy (so the measured ddpify is this branch's, whatever main holds then).
# Usage (from the copy's root): gpu8_corpus.sh LABEL EXPORT_DIR WHEEL_DIR... -- JOBS LIMIT_S [run.py args]
#   LABEL: output folder $OUT/LABEL; EXPORT_DIR: run.py --export output; WHEEL_DIR: wheels installed
#   into /tmp/site_LABEL in front of site-packages; LIMIT_S: timeout of the whole run.py (results
#   are written after each entry, so a cut run keeps what finished); run.py args: --split/--manifest.
set -u
L=$1; E=$2; shift 2
WH=(); while [ "$1" != "--" ]; do WH+=("$1"); shift; done; shift
J=$1; LIM=$2; shift 2
O=$OUT/$L; mkdir -p "$O"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
SITE=/tmp/site_$L
whls=(); for d in "${WH[@]}"; do whls+=("$d"/*.whl); done
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "${whls[@]}" > "$O/pip.log" 2>&1
echo "pip exit $?" >> "$O/pip.log"
# gym 0.26's env checker names np.bool8 (numpy 2): patched as devb/setup.sh does on CPU
[ -d "$SITE/gym" ] && grep -rl "np.bool8" "$SITE/gym" | xargs -r sed -i 's/np\.bool8/np.bool_/g'
# APEX: a source tree of NVIDIA apex (git archive 25.04), imported Python-only (amp's Python fallback)
export PYTHONPATH=$SITE${APEX:+:$APEX}:$PWD
{ date -u; nvidia-smi -L; nproc; cat GPU8_TREE 2>/dev/null
  python3 -c 'import torch,torchvision;print("torch",torch.__version__,"torchvision",torchvision.__version__,"cuda",torch.cuda.device_count())'
  python3 -m pip list 2>/dev/null | grep -i -E "^(numpy|pandas|scipy|scikit-learn|opencv|gym|gymnasium|tyro|tensorboard|transformers|libcst|h5py|lmdb|einops|sympy|apex) "
  python3 -c 'import apex, apex.amp; print("apex", apex.__file__)' 2>&1 | tail -1
  echo "run.py args: --gpu --from-export $E --jobs $J $*   (timeout $LIM s)"; } > "$O/machine.txt" 2>&1
START=$(date +%s)
timeout "$LIM" python3 bench/realworld/run.py --gpu --from-export "$E" --jobs "$J" --results "$O/results_gpu.json" \
  --logs "$O/logs" --diffs "/tmp/diffs_$L" "$@" > "$O/run.out" 2>&1
echo "run.py exit $? after $(( $(date +%s) - START )) s" >> "$O/run.out"
python3 bench/realworld/run.py --table --results "$O/results_gpu.json" "$@" > "$O/table_gpu.md" 2>&1
