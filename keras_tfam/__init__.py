"""keras_tfam: Transformer building blocks for Keras 3 and the GPT-2 pipeline built from them.

The library is backend-neutral (`keras.ops` only): it runs on whichever backend Keras runs on
(TensorFlow, JAX or PyTorch: `KERAS_BACKEND` or `~/.keras/keras.json`, as Keras decides). The
pipelines (`pipelines/`) need TensorFlow. Importing keras_tfam changes nothing in the process;
`keras_tfam.cpu.configure()` is the one call that sets process options (pooled tensor memory,
XLA's vector width), made by the `tfam` command line and available to users.
"""

from keras_tfam import convert, cpu, engine, generation, layers, losses, models, ops, retrieval

__version__ = "0.3.0"  # the one declaration of the version: setup.cfg reads it
__all__ = [
    "convert",
    "cpu",
    "engine",
    "generation",
    "keras_backend",
    "layers",
    "losses",
    "models",
    "ops",
    "retrieval",
    "__version__",
]


def keras_backend():
    """The Keras backend keras_tfam runs on (`"tensorflow"`, `"jax"` or `"torch"`)."""
    import keras

    return keras.config.backend()
