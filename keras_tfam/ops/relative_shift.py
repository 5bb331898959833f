"""Transformer-XL's relative shift (Dai et al. 2019, appendix B)."""

from keras import ops


def relative_shift(x):
    """Turns per-distance scores into per-key scores without a gather.

    `x[..., i, r]` holds a query's term for the relative distance
    `S - 1 - r` (distances descending, as Transformer-XL's `R`). The result
    `y[..., i, j] = x[..., i, j + T - 1 - i]` is the term of the distance
    `(i + S - T) - j`: query `i` sits at position `i + S - T` of the `S`
    keys (the queries are the last `T` positions). Entries with
    `j > i + S - T` (keys after the query) hold other values and must be
    masked, as causal attention does.

    The shift is a zero column, a reshape and a slice (the paper's
    "efficient computation" of `B` and `D`): no `(T, S)` index gather.

    Args:
        x: `(..., T, S)`, `S >= T`.

    Returns:
        `(..., T, S)`.
    """
    shape = ops.shape(x)
    lead = [shape[i] for i in range(len(x.shape) - 2)]
    length, keys = shape[-2], shape[-1]
    padded = ops.pad(x, [[0, 0]] * (len(x.shape) - 1) + [[1, 0]])  # [..., T, S + 1]
    padded = ops.reshape(padded, lead + [keys + 1, length])
    return ops.reshape(padded[..., 1:, :], lead + [length, keys])
