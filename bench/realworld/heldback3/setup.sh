#!/usr/bin/env bash
# Extra packages of held-back split 3, installed beside the corpus's own (.realworld_deps/site, from
# `run.py --setup`): run.py puts every .realworld_deps/site* folder on the scripts' path.
# --no-deps with the dependencies listed, so that no torch wheel is ever pulled in (timm, ignite,
# pretrainedmodels and the like depend on torch); numpy, scipy, pandas, pillow, requests, opencv
# and the like come from the corpus's own site folder. torchvision comes from run.py's setup.
# torch_geometric is pinned to the release whose examples the split runs.
set -euo pipefail
cd "$(dirname "$0")/../../.."
T=.realworld_deps/site_heldback3
python -m pip install -q --upgrade --no-deps --target "$T" \
  sktime scikit-base patool "reformer-pytorch==1.4.4" "local-attention==1.9.14" axial-positional-embedding "product-key-memory==0.1.10" PyWavelets sympy mpmath \
  timm "huggingface_hub<1" safetensors filelock fsspec einops \
  pytorch-ignite \
  dominate \
  scikit-image networkx tifffile lazy_loader \
  yacs gdown beautifulsoup4 soupsieve \
  "torch_geometric==2.8.0.post1" aiohttp aiosignal attrs frozenlist multidict yarl propcache aiohappyeyeballs jinja2 psutil xxhash \
  "albumentations==1.3.1" qudida \
  pretrainedmodels efficientnet_pytorch pytorch-metric-learning \
  tensorboardX lmdb
echo "held-back split 3 packages in $T"
