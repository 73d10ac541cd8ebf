#!/usr/bin/env bash
# Wheels of the packages the held-back split imports that the GPU machine (Python 3.12, no network)
# lacks, into .realworld_deps/whl_heldback_gpu/ (git-ignored; about 30 MiB, botocore the largest:
# transformers 2.1.1 imports boto3 at start-up). Carry the folder with the export and install it
# there in front of site-packages (transformers 2.1.1 must shadow the machine's newer one):
#     python3 -m pip install -q --no-index --no-deps --target /tmp/site_h2 .realworld_deps/whl_heldback_gpu/*.whl
#     export PYTHONPATH=/tmp/site_h2:$PWD
set -euo pipefail
cd "$(dirname "$0")/../../.."
W=.realworld_deps/whl_heldback_gpu
PY=${PY_VERSION:-3.12}
mkdir -p "$W"
python -m pip download -q --no-deps --only-binary :all: --python-version "$PY" --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$W" \
  lmdb tensorboardX gymnasium farama-notifications cloudpickle typing_extensions \
  jsonpatch jsonpointer websocket-client tornado termcolor \
  ipdb ipython decorator jedi parso prompt_toolkit wcwidth pygments traitlets matplotlib-inline pexpect ptyprocess \
  stack_data asttokens executing pure_eval \
  yacs pytorch-metric-learning "transformers==2.1.1" sacremoses boto3 botocore jmespath s3transfer
# source-only packages (setup.py needs pkg_resources): built once in a throwaway venv
B=$(mktemp -d)
python -m venv "$B/venv"
"$B/venv/bin/pip" install -q "setuptools<70" wheel
"$B/venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$W" visdom torchnet fire
rm -rf "$B"
du -sh "$W"
