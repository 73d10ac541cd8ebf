#!/usr/bin/env bash
# Extra packages of the held-back split, installed beside the corpus's own (.realworld_deps/site,
# from `run.py --setup`): run.py puts every .realworld_deps/site* folder on the scripts' path.
# gym 0.26's env checker still names np.bool8 (gone in numpy 2): patched to np.bool_ here, a
# harness-side compatibility fix like shim/sitecustomize.py's scipy.misc.imsave.
set -euo pipefail
cd "$(dirname "$0")/../../.."
T=.realworld_deps/site_devb
python -m pip install -q --no-deps --target "$T" h5py einops dominate gym==0.26.2 gym_notices cloudpickle easydict tensorboardX sympy mpmath scikit-image networkx tifffile lazy_loader scikit-learn joblib threadpoolctl narwhals
grep -rl "np.bool8" "$T/gym" | xargs -r sed -i 's/np\.bool8/np.bool_/g' || true
echo "held-back packages in $T"
