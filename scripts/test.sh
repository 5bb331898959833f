#!/usr/bin/env bash
# Creates (or reuses) .venv, installs keras_tfam with its test and torch extras, runs the tests: the
# whole suite on TensorFlow, then the backend-neutral library (layer harness, ops, losses, generation,
# GPT-2 cached == uncached, Hugging Face parity) again on JAX; beside them, in a second lane, the
# training tests and then the layer and decoding-model harnesses and the losses on PyTorch. Arguments
# go to a single pytest run instead.
# Two pytest workers (pytest-xdist), a test file each at a time: most tests are small models whose
# time goes to tracing and compiling on one core, so two at once keep both cores busy. The files are
# queued longest first, from the seconds a recorded run took (tests/conftest.py), so that neither worker
# ends with the other's core idle behind a long file.
# pytest exits non-zero when it fails or collects no test, and so does this script (after every lane).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test,torch
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
# For all but the training tests, XLA compiles quickly rather than well: those tests spend most of their
# time compiling small graphs once (on JAX, every eager op is a compiled program). LLVM at -O0 compiles
# 10% (TensorFlow) to 25% (JAX) faster, and XLA CPU's older elemental emitters instead of its MLIR fusion
# emitters 30% faster again (JAX phase 424 -> 299 s); the HLO passes, and so the computation, are
# unchanged. The training tests run many steps, so they keep XLA's defaults.
# TensorFlow's pooled CPU tensor memory (keras_tfam.cpu.pool_cpu_tensor_memory), as the pipelines use it: the
# training tests' steps no longer fault their temporaries in at every step (a 2-layer GPT-2's 300 steps:
# 48 -> 40 CPU-seconds, 2.9 -> 0.2 million page faults, 2-core AMD EPYC). The other backends ignore it.
export TF_CPU_ALLOCATOR_USE_BFC="${TF_CPU_ALLOCATOR_USE_BFC:-true}"
O0="--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false ${XLA_FLAGS:-}"

# Two lanes at once, so that both cores stay busy to the end: one process runs the training tests and
# then the PyTorch phase while two workers run the TensorFlow and then the JAX phase. Run one after the
# other, each phase ended with a core idle behind its longest test (the eight training tests: 216 s for
# ~150 s of work on two workers) and paid its own start-up; together the lanes took 1,551-1,589 s against
# 1,535-1,667 s on a 2-core AMD EPYC. The second lane's output follows the first's.
second_lane_log=$(mktemp)
(
  set +e
  echo "== training to quality thresholds"
  # One thread per pool here too (the TensorFlow phase says why): the Transformer's reversal test took
  # 53 CPU-seconds with it against 62 with two threads per pool, and less wall time (49 against 53 s) even
  # with both cores its own; the set transformer's 50 against 58 (2-core AMD EPYC).
  TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 .venv/bin/python -m pytest -q -p no:xdist --durations=15 -m training
  training=$?
  echo "== the layer and decoding-model harnesses and the losses on PyTorch"
  # Every layer through the shared harness, every decoding model (full pass == token by token == prefill +
  # steps, greedy == argmax), 16-bit attention caches, the samplers, the losses' custom gradients and
  # quantize's freed float weights, eagerly: Keras' default on PyTorch (tests/harness.py says why).
  # One OpenMP thread: PyTorch's ops on these small tensors gain nothing from a second thread, whose spinning
  # took the decoding models' file 34 CPU-seconds against 21 with one (24 against 25 s of wall time).
  OMP_NUM_THREADS=1 KERAS_BACKEND=torch .venv/bin/python -m pytest -q -p no:xdist -m "not training" \
    -k "Harness or test_decoding_models or test_token_cross_entropy or test_quantize_frees or test_samplers \
    or test_half_precision_cache" tests/layers \
    tests/models/test_decoding_models.py tests/generation/test_samplers.py tests/losses
  torch=$?
  exit $(( training != 0 || torch != 0 ))
) > "$second_lane_log" 2>&1 &
second_lane=$!
# Stopped early (a signal, an error of this script): the second lane's pytest stops too.
# (The trap runs under `set -e`: a lane already gone must not fail it.)
trap '{ pkill -P "$second_lane"; kill "$second_lane"; } 2>/dev/null || true; rm -f "$second_lane_log"' EXIT

status=0
# Each phase ends with its 15 slowest tests and their times: where to look when CI nears its budget.
echo "== TensorFlow: everything but the training tests"
# One thread per TensorFlow op pool in each worker: two workers (and the training lane beside them) already
# fill the two cores, and pools of two threads each spin waiting for one another. The same four model test
# files took 129-130 s against 149 s with the default pools in two of three paired runs (153 / 155 in the
# third), 2-core AMD EPYC. (Subprocesses the tests start inherit it.)
TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 XLA_FLAGS="$O0" .venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 -m "not training" || status=1
echo "== the library on the JAX backend"
# What tests/conftest.py marks `every_backend` (the layer harness, ops, losses, generation, the attention contract,
# GPT-2 and Hugging Face parity), again on JAX. (tests/conftest.py has JAX reuse one MLIR context per thread
# instead of building one for every lowering: a fifth less time.)
XLA_FLAGS="$O0" KERAS_BACKEND=jax .venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 -m "every_backend and not training" \
  tests/ops tests/losses tests/generation tests/layers tests/models/test_gpt2_lm.py tests/models/test_decoding_models.py \
  tests/convert/test_huggingface_gpt2.py tests/convert/test_huggingface_llama.py tests/models/test_keras_export.py \
  tests/test_backend_neutral.py tests/test_cpu.py || status=1
wait "$second_lane" || status=1
cat "$second_lane_log"
exit "$status"
