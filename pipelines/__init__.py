"""TensorFlow-specific pipelines: data, training, export and the `tfam` CLI."""

import os

# Pooled CPU tensor memory for every run of the pipelines (`keras_tfam.cpu.pool_cpu_tensor_memory` says
# why: 1.3-1.45x tokens/s for nanoGPT's CPU recipe). Set here, by name, before anything imports
# TensorFlow: importing keras_tfam for the function would import TensorFlow ahead of the `tfam` command
# line, which silences TensorFlow's start-up lines while it loads. A value already set is kept.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
