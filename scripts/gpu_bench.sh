#!/usr/bin/env bash
# The GPU check of issue 25: GPT-2 small training on the lent GPU machine (JAX backend; it has JAX and
# PyTorch, no TensorFlow and no Keras) against nanoGPT on the same GPU (benchmarks/gpu_train.py).
#
# Here, once:   bash scripts/gpu_bench.sh prepare /path/to/nanoGPT-checkout
#   downloads the wheels the machine lacks (keras, namex, optree; Python 3.12) into .whl/ and copies
#   nanoGPT's train.py, model.py and configurator.py into .peers/nanoGPT/ (both kept out of git by
#   .git/info/exclude: nanoGPT's code is not part of this repository).
# Then, with the device tool:   run(command="bash scripts/gpu_bench.sh", carry=[".whl", ".peers"], timeout_s=540)
#   prints the table and leaves the log in $OUT/gpu_train.log.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "prepare" ]; then
  [ -n "${2:-}" ] || { echo "usage: bash scripts/gpu_bench.sh prepare NANOGPT_CHECKOUT" >&2; exit 2; }
  grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
  grep -qx "/.peers/" .git/info/exclude 2>/dev/null || echo "/.peers/" >> .git/info/exclude
  keras_version=$(.venv/bin/python -c "import keras; print(keras.__version__)")
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "keras==$keras_version" namex optree
  mkdir -p .peers/nanoGPT
  cp "$2"/train.py "$2"/model.py "$2"/configurator.py .peers/nanoGPT/
  ls .whl .peers/nanoGPT
  exit 0
fi
[ "$#" -eq 0 ] || { echo "usage: bash scripts/gpu_bench.sh [prepare NANOGPT_CHECKOUT]" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" KERAS_BACKEND=jax PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
python3 benchmarks/gpu_train.py --nanogpt .peers/nanoGPT --peers-python python3 2>&1 | tee "${OUT:-/tmp}/gpu_train.log"
