#!/usr/bin/env bash
# Extra packages of the held-back split, installed beside the corpus's own (.realworld_deps/site,
# from `run.py --setup`): run.py puts every .realworld_deps/site* folder on the scripts' path.
# --no-deps with the dependencies listed: numpy, scipy, pandas, pillow, requests and the like come
# from the corpus's own site folder. transformers is pinned to 2.1.1, the version GPT2-Chinese's
# requirements.txt names (it calls transformers.modeling_gpt2 and WarmupLinearSchedule).
# visdom and torchnet are source distributions whose setup.py needs pkg_resources (gone from
# current setuptools): their wheels are built in a throwaway venv with setuptools < 70.
set -euo pipefail
cd "$(dirname "$0")/../../.."
T=.realworld_deps/site_heldback
W=.realworld_deps/whl_heldback
if ! ls $W/visdom-*.whl $W/torchnet-*.whl >/dev/null 2>&1; then
  B=$(mktemp -d)
  python -m venv "$B/venv"
  "$B/venv/bin/pip" install -q "setuptools<70" wheel
  "$B/venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$W" visdom torchnet
  rm -rf "$B"
fi
python -m pip install -q --upgrade --no-deps --target "$T" $W/visdom-*.whl $W/torchnet-*.whl \
  h5py lmdb tensorboardX protobuf scikit-learn joblib threadpoolctl narwhals scikit-image networkx tifffile lazy_loader \
  gymnasium farama-notifications cloudpickle typing_extensions \
  jsonpatch jsonpointer websocket-client tornado fire termcolor \
  ipdb ipython decorator jedi parso prompt_toolkit wcwidth pygments traitlets matplotlib-inline pexpect ptyprocess \
  stack_data asttokens executing pure_eval \
  yacs pytorch-metric-learning absl-py \
  "transformers==2.1.1" regex sentencepiece sacremoses click boto3 botocore jmespath s3transfer python-dateutil
echo "held-back packages in $T"
