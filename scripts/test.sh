#!/usr/bin/env bash
# Creates (or reuses) .venv, installs keras_tfam with its test and torch extras, runs the tests: the
# whole suite on TensorFlow, then the backend-neutral library (layer harness, ops, losses, generation,
# GPT-2 cached == uncached, Hugging Face parity) again on JAX; beside them, in a second lane, the
# training tests, the layer and decoding-model harnesses and the losses on PyTorch, and each maintained
# benchmark script in its smoke mode. Arguments go to a single pytest run instead.
# Two pytest workers, a test file each at a time: the tests mostly trace and compile on one core. Files are
# queued longest first (tests/conftest.py) so that no worker ends idle behind a long file.
# pytest exits non-zero when it fails or collects no test, and so does this script (after every lane).
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
O0="--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false ${XLA_FLAGS:-}"

# Two lanes at once, so that both cores stay busy to the end: training then PyTorch in one process, beside two
# workers running TensorFlow then JAX. The second lane's output follows the first's.
second_lane_log=$(mktemp)
(
  set +e
  echo "== training to quality thresholds"
  # One thread per op pool, as in the TensorFlow phase: the other lane fills the second core.
  TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 .venv/bin/python -m pytest -q -p no:xdist --durations=15 \
    -m training
  training=$?
  echo "== the layer and decoding-model harnesses and the losses on PyTorch"
  # The layer harness, the decoding models, 16-bit caches, samplers, logits processors, losses and quantize, eagerly (Keras' default
  # on PyTorch). One OpenMP thread: these small tensors gain nothing from a second, which only spins.
  OMP_NUM_THREADS=1 KERAS_BACKEND=torch .venv/bin/python -m pytest -q -p no:xdist -m "not training" \
    -k "Harness or test_decoding_models or test_token_cross_entropy or test_quantize_frees or test_samplers \
    or test_half_precision_cache or test_processors" tests/layers \
    tests/models/test_decoding_models.py tests/generation/test_samplers.py tests/generation/test_processors.py \
    tests/generation/test_processors_vs_transformers.py tests/losses
  torch=$?
  echo "== the benchmark scripts on a tiny model (--smoke)"
  XLA_FLAGS="$O0" TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q \
    -p no:xdist --durations=10 -m benchmarks tests/benchmarks
  benchmarks=$?
  exit $(( training != 0 || torch != 0 || benchmarks != 0 ))
) > "$second_lane_log" 2>&1 &
second_lane=$!
# Stopped early (a signal, an error of this script): the second lane's pytest stops too.
# (The trap runs under `set -e`: a lane already gone must not fail it.)
trap '{ pkill -P "$second_lane"; kill "$second_lane"; } 2>/dev/null || true; rm -f "$second_lane_log"' EXIT

status=0
# Each phase ends with its 15 slowest tests and their times: where to look when CI nears its budget.
echo "== TensorFlow: everything but the training tests"
# One thread per op pool: two workers and the training lane already fill the cores (subprocesses inherit it).
TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 XLA_FLAGS="$O0" .venv/bin/python -m pytest -q -n 2 --dist loadfile \
  --no-loadscope-reorder --durations=15 -m "not training and not benchmarks" || status=1
echo "== the library on the JAX backend"
# What tests/conftest.py marks `every_backend` (layer harness, ops, losses, generation, attention contract, GPT-2,
# Hugging Face parity), again on JAX.
XLA_FLAGS="$O0" KERAS_BACKEND=jax .venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder \
  --durations=15 -m "every_backend and not training" \
  tests/ops tests/losses tests/generation tests/layers tests/models/test_gpt2_lm.py \
  tests/models/test_decoding_models.py \
  tests/convert/test_huggingface_gpt2.py tests/convert/test_huggingface_llama.py tests/models/test_keras_export.py \
  tests/test_backend_neutral.py tests/test_engine.py tests/test_cpu.py || status=1
wait "$second_lane" || status=1
cat "$second_lane_log"
exit "$status"
