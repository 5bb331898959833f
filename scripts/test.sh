#!/usr/bin/env bash
# Creates (or reuses) .venv, installs keras_tfam with its test and torch extras, runs the tests: the whole
# suite on TensorFlow (each maintained benchmark script in its smoke mode among it), the training tests, the
# layer and decoding-model harnesses and the losses on PyTorch, then the backend-neutral library (layer harness,
# ops, losses, generation, GPT-2 cached == uncached, Hugging Face parity) again on JAX. Arguments go to a single
# pytest run instead.
# Each phase runs on two pytest workers, one after the other: two processes for two cores (a third beside them
# only shares the cores, and slows every process). The TensorFlow and JAX phases give each worker a test file
# at a time, queued longest first (tests/conftest.py) so that no worker ends idle behind a long file.
# pytest exits non-zero when it fails or collects no test, and so does this script (after every phase).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test,torch
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
# XLA compiles quickly rather than well (LLVM -O0, the elemental emitters) for all but the training tests, which
# mostly compile small graphs once; the HLO passes, and so the computation, are unchanged.
# TensorFlow's pooled CPU tensor memory, as the pipelines use it: training steps reuse their temporaries.
export TF_CPU_ALLOCATOR_USE_BFC="${TF_CPU_ALLOCATOR_USE_BFC:-true}"
# One thread per op pool and per OpenMP team: the two workers fill the cores (subprocesses inherit it).
export TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 OMP_NUM_THREADS=1
O0="--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false ${XLA_FLAGS:-}"
WORKERS=(-n 2 --dist loadfile --no-loadscope-reorder)

status=0
# Each phase ends with its slowest tests and their times: where to look when CI nears its budget.
echo "== TensorFlow: everything but the training tests, with the benchmark scripts on a tiny model (--smoke)"
XLA_FLAGS="$O0" .venv/bin/python -m pytest -q "${WORKERS[@]}" --durations=15 -m "not training" || status=1
echo "== training to quality thresholds"
# A test each at a time: the few training tests are in few files.
.venv/bin/python -m pytest -q -n 2 --dist load --durations=10 -m training || status=1
echo "== the layer and decoding-model harnesses and the losses on PyTorch"
# The layer harness, the decoding models, 16-bit caches, samplers, logits processors, losses and quantize, eagerly
# (Keras' default on PyTorch).
KERAS_BACKEND=torch .venv/bin/python -m pytest -q "${WORKERS[@]}" -m "not training" \
  -k "Harness or test_decoding_models or test_token_cross_entropy or test_quantize_frees or test_samplers \
  or test_half_precision_cache or test_processors" tests/layers \
  tests/models/test_decoding_models.py tests/generation/test_samplers.py tests/generation/test_processors.py \
  tests/generation/test_processors_vs_transformers.py tests/losses || status=1
echo "== the library on the JAX backend"
# What tests/conftest.py marks `every_backend` (layer harness, ops, losses, generation, attention contract, GPT-2,
# Hugging Face parity), again on JAX.
XLA_FLAGS="$O0" KERAS_BACKEND=jax .venv/bin/python -m pytest -q "${WORKERS[@]}" --durations=15 \
  -m "every_backend and not training" \
  tests/ops tests/losses tests/generation tests/layers tests/models/test_gpt2_lm.py \
  tests/models/test_decoding_models.py \
  tests/convert/test_huggingface_gpt2.py tests/convert/test_huggingface_llama.py tests/models/test_keras_export.py \
  tests/test_backend_neutral.py tests/test_engine.py tests/test_cpu.py || status=1
exit "$status"
