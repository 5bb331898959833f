"""keras_tfam: Transformer building blocks for Keras 3 and the GPT-2 pipeline built from them.

TensorFlow is the default backend: importing keras_tfam before Keras sets
`KERAS_BACKEND=tensorflow` unless the user chose another backend.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from keras_tfam import generation, layers, models, ops  # noqa: E402

__version__ = "0.1.0"
__all__ = ["generation", "layers", "models", "ops", "__version__"]
