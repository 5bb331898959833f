#!/usr/bin/env bash
# Installs the benchmarks' peers into their own venv (default .venv-peers), away from the test install:
# PyTorch's CPU build (not the several-GB CUDA build a plain `pip install torch` takes), transformers,
# ONNX Runtime with optimum's exporter, and llama.cpp (llama-cpp-python, built here from its source release
# with the machine's own instruction set: minutes; the registry has no wheel of it) with the `gguf` package
# that writes its files. Then:
#   .venv/bin/python benchmarks/generate_vs_transformers.py --peers-python .venv-peers/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-peers}"
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# PyTorch's own index, given up at once where it cannot be reached (pip would otherwise retry each package for
# minutes); then the registry, whose 2.13.0 a machine's wheel folder (pip's find-links) may hold as the CPU build.
"$VENV/bin/python" -m pip install -q --retries 0 --timeout 10 torch --index-url https://download.pytorch.org/whl/cpu \
  || "$VENV/bin/python" -m pip install -q 'torch==2.13.0'
"$VENV/bin/python" -m pip install -q transformers optimum-onnx onnxruntime gguf
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$VENV/bin/python" -m pip install -q llama-cpp-python
"$VENV/bin/python" -c "import torch, transformers, onnxruntime, llama_cpp; print('peers:', torch.__version__, transformers.__version__, onnxruntime.__version__, 'llama-cpp-python', llama_cpp.__version__)"
