#!/usr/bin/env bash
# Creates (or reuses) .venv, installs keras_tfam with its test extra, runs the tests: the whole suite
# on TensorFlow, then the backend-neutral library (layer harness, ops, generation, GPT-2 cached ==
# uncached, Hugging Face parity) again on JAX. Arguments go to a single pytest run instead.
# Two pytest workers (pytest-xdist), a test file each at a time: most tests are small models whose
# time goes to tracing and compiling on one core, so two at once keep both cores busy.
# pytest exits non-zero when it fails or collects no test, and so does this script.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q -n 2 --dist loadfile
echo "== the library on the JAX backend"
# On JAX: every layer through the shared harness (config, save/load, symbolic, compiled fit step, mixed
# precision), the ops, generation, the attention contract (every kind x every option: full pass ==
# decoding), GPT-2 cached == uncached and Hugging Face parity. The layers' NumPy references run on
# TensorFlow above; the math they check is keras.ops, the same on every backend.
KERAS_BACKEND=jax .venv/bin/python -m pytest -q -n 2 --dist loadfile -m "not training" tests/ops tests/generation \
  tests/layers/attention/test_attention_contract.py \
  tests/models/test_gpt2_lm.py tests/convert/test_huggingface_gpt2.py tests/test_backend_neutral.py
# A GPT-2 of every attention kind generates the argmax of its full pass (full pass == decoding: the contract above),
# its tests spread over both workers.
KERAS_BACKEND=jax .venv/bin/python -m pytest -q -n 2 --dist load -k "gpt2_ and greedy" tests/models/test_decoding_models.py
KERAS_BACKEND=jax .venv/bin/python -m pytest -q -n 2 --dist loadfile -k Harness tests/layers
