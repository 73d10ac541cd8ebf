#!/usr/bin/env bash
# Extra packages of held-back split 4, installed beside the corpus's own (.realworld_deps/site, from
# `run.py --setup`): run.py puts every .realworld_deps/site* folder on the scripts' path.
# --no-deps with the dependencies listed, so that no torch wheel is ever pulled in (x-transformers,
# pretrainedmodels, thop and the like depend on torch); numpy, scipy, pandas, pillow, matplotlib,
# scikit-learn, tensorboard, pyyaml, opencv and gym come from the corpus's own site folder, and
# torchvision from run.py's setup.
set -euo pipefail
cd "$(dirname "$0")/../../.."
T=.realworld_deps/site_heldback4
python -m pip install -q --upgrade --no-deps --target "$T" \
  einx einops loguru frozendict torch-einops-utils \
  thop \
  pretrainedmodels faiss-cpu \
  fire termcolor \
  autograd torchdiffeq opt-einsum \
  configargparse \
  tensorboardX \
  oyaml \
  scikit-image tifffile lazy_loader networkx
echo "held-back split 4 packages in $T"
