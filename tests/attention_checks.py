"""Shared by the attention tests: projections as NumPy arrays by name, decoding one token at a time."""

import numpy as np


def dense_weights(layer):
    """`(wq, bq, wk, bk, wv, bv, wo, bo)` float64; a layer without a key projection gives `None` for it."""
    arrays = []
    for name in ("query_dense", "key_dense", "value_dense", "output_dense"):
        dense = getattr(layer, name, None)
        for weight in ("kernel", "bias"):
            variable = getattr(dense, weight, None) if dense is not None else None
            arrays.append(None if variable is None else np.asarray(variable.value, np.float64))
    return arrays


def decode_in_steps(layer, x, prefill, cache):
    """Outputs of `layer` on `x (B, T, D)` through `cache`: the first `prefill` positions at once, then one by one.

    Returns the `(B, T, D')` outputs and the final cache.
    """
    out, cache = layer(x[:, :prefill], cache=cache, cache_update_index=0)
    outs = [np.asarray(out)]
    for t in range(prefill, x.shape[1]):
        out, cache = layer(x[:, t : t + 1], cache=cache, cache_update_index=t)
        outs.append(np.asarray(out))
    return np.concatenate(outs, axis=1), cache
