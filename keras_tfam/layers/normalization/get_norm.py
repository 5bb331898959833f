"""The closed set of normalization layers a block can be built with."""

import keras

from keras_tfam.layers.normalization.rms_norm import RMSNorm
from keras_tfam.layers.normalization.scale_norm import ScaleNorm

NORMS = ("layer", "rms", "gemma_rms", "scale")


def check_norm(norm):
    """Raises a `ValueError` unless `norm` is one of `NORMS`."""
    if norm not in NORMS:
        raise ValueError(f"`norm` must be one of {NORMS}. Received: norm={norm!r}")


def get_norm(norm, epsilon, **kwargs):
    """Builds the normalization layer named by `norm`.

    Args:
        norm: `"layer"` (Keras' `LayerNormalization`, Ba et al. 2016),
            `"rms"` (`RMSNorm`), `"gemma_rms"` (`RMSNorm` with Gemma's
            `x * (1 + weight)` gain) or `"scale"` (`ScaleNorm`).
        epsilon: the layer's epsilon.
        **kwargs: passed to the layer (`name`, `dtype`).
    """
    check_norm(norm)
    if norm == "layer":
        return keras.layers.LayerNormalization(epsilon=epsilon, **kwargs)
    if norm == "rms":
        return RMSNorm(epsilon=epsilon, **kwargs)
    if norm == "gemma_rms":
        return RMSNorm(epsilon=epsilon, scale_offset=1.0, **kwargs)
    return ScaleNorm(epsilon=epsilon, **kwargs)
