"""Attention masks: the one place where they are built and merged.

Every mask in keras_tfam is boolean with `True` meaning "may attend". Padding
masks are `(B, T)`; attention masks are `(B, T, S)` (query length `T`, key
length `S`) or anything that broadcasts to it, such as `(1, T, S)`.

Positions are absolute: a query at row `i` sits at position
`query_offset + i`, a key at column `j` at position `key_offset + j`. With a
KV cache the keys are the whole cache (`key_offset = 0`) and the new queries
start at the cache update index (`query_offset = index`), so the same mask
that a full causal pass uses also hides the cache slots not yet written.
"""

from keras import ops


def keras_mask(x):
    """The Keras mask attached to `x` (e.g. by `Embedding(mask_zero=True)`), or `None`."""
    return getattr(x, "_keras_mask", None)


def _positions(length, offset):
    return ops.add(ops.arange(length, dtype="int32"), ops.cast(offset, "int32"))


def _relative_distance(query_length, key_length, query_offset=0, key_offset=0):
    """`(T, S)` int32 matrix of query position minus key position."""
    query_positions = _positions(query_length, query_offset)
    key_positions = _positions(key_length, key_offset)
    return ops.subtract(
        ops.expand_dims(query_positions, 1), ops.expand_dims(key_positions, 0)
    )


def causal_mask(query_length, key_length=None, query_offset=0, key_offset=0):
    """Mask letting each query see keys at its own position or earlier.

    Args:
        query_length: int, or scalar tensor, number of queries `T`.
        key_length: number of keys `S`; defaults to `query_length`.
        query_offset: absolute position of the first query (the cache update
            index when decoding with a KV cache).
        key_offset: absolute position of the first key.

    Returns:
        Boolean tensor of shape `(1, T, S)`.
    """
    key_length = query_length if key_length is None else key_length
    distance = _relative_distance(query_length, key_length, query_offset, key_offset)
    return ops.expand_dims(ops.greater_equal(distance, 0), 0)


def sliding_window_mask(
    query_length,
    key_length=None,
    window=None,
    query_offset=0,
    key_offset=0,
    causal=True,
):
    """Local attention mask (Beltagy et al. 2020; Mistral's sliding window).

    A query at position `i` may attend a key at position `j` when
    `0 <= i - j < window` (causal) or `|i - j| < window` (not causal).

    Returns:
        Boolean tensor of shape `(1, T, S)`.
    """
    if window is None or int(window) < 1:
        raise ValueError(f"`window` must be a positive integer. Received: window={window}")
    key_length = query_length if key_length is None else key_length
    distance = _relative_distance(query_length, key_length, query_offset, key_offset)
    if causal:
        allowed = ops.logical_and(
            ops.greater_equal(distance, 0), ops.less(distance, window)
        )
    else:
        allowed = ops.less(ops.abs(distance), window)
    return ops.expand_dims(allowed, 0)


def padding_to_attention_mask(query_padding_mask=None, key_padding_mask=None):
    """Turns `(B, T)` / `(B, S)` padding masks into a `(B, T, S)` mask.

    Either argument may be `None`. As in Keras' own `MultiHeadAttention`, a
    padded query row sees no key at all, so its attention output is zeros.

    Returns:
        Boolean tensor broadcastable to `(B, T, S)`, or `None` if both are `None`.
    """
    mask = None
    if key_padding_mask is not None:
        mask = ops.expand_dims(ops.cast(key_padding_mask, "bool"), 1)  # [B, 1, S]
    if query_padding_mask is not None:
        query_mask = ops.expand_dims(ops.cast(query_padding_mask, "bool"), 2)  # [B, T, 1]
        mask = query_mask if mask is None else ops.logical_and(query_mask, mask)
    return mask


def merge_masks(*masks):
    """Logical AND of the given boolean masks, skipping `None`.

    Masks broadcast against each other (`(B, T, S)`, `(1, T, S)`,
    `(B, 1, S)`, ...). Returns `None` when every argument is `None`.
    """
    merged = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged
