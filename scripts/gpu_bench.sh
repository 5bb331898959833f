#!/usr/bin/env bash
# The GPU benchmarks on a lent GPU machine (JAX backend; it has JAX, PyTorch and transformers, no
# TensorFlow and no Keras): GPT-2 small training against nanoGPT on the same GPU (benchmarks/gpu_train.py)
# and greedy decoding against transformers (benchmarks/generate_vs_transformers.py --device cuda).
#
# Here, once:   bash scripts/gpu_bench.sh prepare /path/to/nanoGPT-checkout
#   downloads the wheels the machine lacks (keras, namex, optree; Python 3.12) into .whl/ and copies
#   nanoGPT's train.py, model.py and configurator.py into .peers/nanoGPT/ (both kept out of git by
#   .git/info/exclude: nanoGPT's code is not part of this repository).
# Then, with the device tool:   run(command="bash scripts/gpu_bench.sh", carry=[".whl", ".peers"], timeout_s=540)
#   prints the tables (training against nanoGPT, decoding against transformers, training without the
#   fused attention kernel, the step's kernels) and leaves their logs and JSON in $OUT.
# And:          run(command="bash scripts/gpu_bench.sh tests", carry=[".whl"], timeout_s=400)
#   runs the backend-neutral tests of decoding and generation on the GPU.
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
[ "$#" -eq 0 ] || [ "$*" = "tests" ] || {
  echo "usage: bash scripts/gpu_bench.sh [prepare NANOGPT_CHECKOUT | tests]" >&2
  exit 2
}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" KERAS_BACKEND=jax PYTHONUNBUFFERED=1
out="${OUT:-/tmp}"
if [ "${1:-}" = "tests" ]; then
  # The backend-neutral tests of decoding, generation, the attention contract, GPT-2, the ops and the losses on
  # the GPU: float32 products at full precision (JAX's default rounds them to TensorFloat-32, past the tests'
  # tolerances), six processes sharing the GPU's memory as they need it.
  export XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_DEFAULT_MATMUL_PRECISION=highest
  exec python3 -m pytest -q -p no:cacheprovider -n 6 --dist loadfile -m "every_backend and not training" -rfE \
    tests/models/test_decoding_models.py tests/generation tests/layers/attention/test_attention_contract.py \
    tests/models/test_gpt2_lm.py tests/ops tests/losses
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
status=0
# 1. Training: ours (the fused attention kernel, checked against the explicit path) against nanoGPT.
python3 benchmarks/gpu_train.py --nanogpt .peers/nanoGPT --peers-python python3 2>&1 \
  | tee "$out/gpu_train.log" || status=1
# 2. Greedy decoding of GPT-2 small against transformers on the GPU, float32 and bfloat16.
python3 benchmarks/generate_vs_transformers.py --device cuda --batch 1 8 --peers-python python3 \
  --engines keras_tfam-float32 keras_tfam-bfloat16 transformers-float32 transformers-bfloat16 \
  --json "$out/gpu_generate.json" 2>&1 | tee "$out/gpu_generate.log" || status=1
# 3. Ours without the fused kernel: what it is worth.
python3 benchmarks/gpu_train.py --no-flash 2>&1 | tee "$out/gpu_train_no_flash.log" || status=1
# 4. Where ours spends the step: kernels per name, matched to the HLO fusions they run (the traces stay in /tmp).
python3 benchmarks/gpu_step_profile.py --batch 32 --out /tmp/gpu_profile --hlo /tmp/gpu_hlo 2>&1 \
  | tee "$out/gpu_step_profile.log" || status=1
exit $status
