"""keras_tfam: Transformer building blocks for Keras 3 and the GPT-2 pipeline built from them.

The library is backend-neutral (`keras.ops` only): it runs on TensorFlow,
JAX and PyTorch. TensorFlow is the default: importing keras_tfam before
Keras sets `KERAS_BACKEND=tensorflow` unless the user chose another backend.
The pipelines (`pipelines/`) need TensorFlow. Importing keras_tfam also asks
TensorFlow to pool its CPU tensor memory (`cpu.pool_cpu_tensor_memory`: faster
training steps and `generate` calls) unless `TF_CPU_ALLOCATOR_USE_BFC` is set.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from keras_tfam import cpu  # noqa: E402  (only `os`: no tensor before the next line)

cpu.pool_cpu_tensor_memory()  # before TensorFlow's first tensor, unless the user made one or said otherwise

from keras_tfam import generation, layers, losses, models, ops, retrieval  # noqa: E402
from keras_tfam import convert  # noqa: E402  (after the models it fills: registers their loaders)

__version__ = "0.2.0"
__all__ = ["cpu", "generation", "keras_backend", "layers", "losses", "models", "ops", "retrieval", "__version__"]


def keras_backend():
    """The Keras backend keras_tfam runs on (`"tensorflow"`, `"jax"` or `"torch"`)."""
    import keras

    return keras.config.backend()
