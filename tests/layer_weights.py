"""The projections of an attention layer as float64 NumPy arrays, by name (not by weight order)."""

import numpy as np


def dense_weights(layer):
    """`(wq, bq, wk, bk, wv, bv, wo, bo)`; a layer without a key projection gives `None` for it."""
    arrays = []
    for name in ("query_dense", "key_dense", "value_dense", "output_dense"):
        dense = getattr(layer, name, None)
        for weight in ("kernel", "bias"):
            variable = getattr(dense, weight, None) if dense is not None else None
            arrays.append(None if variable is None else np.asarray(variable.value, np.float64))
    return arrays
