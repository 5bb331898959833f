"""Attention masks: the one place where they are built and merged.

Every mask in keras_tfam is boolean with `True` meaning "may attend". Padding
masks are `(B, T)`; attention masks are `(B, T, S)` (query length `T`, key
length `S`) or anything that broadcasts to it, such as `(1, T, S)`.

Positions are absolute. Masks are built from the positions of the queries
and of the keys (`position_mask`): in a full pass both are `0 .. T - 1`; with
a KV cache the queries start at the cache update index and each cache slot
knows the position it holds (`ring_positions`: slot `s` holds position `s`
until a sliding-window cache wraps around), so the same rule hides the slots
not yet written and, in a ring cache, the positions that left the window.
"""

from keras import ops

from keras_tfam.utils import check_window


def keras_mask(x):
    """The Keras mask attached to `x` (e.g. by `Embedding(mask_zero=True)`), or `None`."""
    return getattr(x, "_keras_mask", None)


def positions(length, offset=0):
    """`(length,)` int32 absolute positions `offset, offset + 1, ...`."""
    return ops.add(ops.arange(length, dtype="int32"), ops.cast(offset, "int32"))


def relative_distance(query_positions, key_positions):
    """`(..., T, S)` int32 matrix of query position minus key position.

    Positions are `(T,)` and `(S,)`, or `(..., T)` and `(..., S)` with the
    same leading axes (blocks of queries, each with its own keys).
    """
    query_positions = ops.cast(query_positions, "int32")
    key_positions = ops.cast(key_positions, "int32")
    return ops.subtract(ops.expand_dims(query_positions, -1), ops.expand_dims(key_positions, -2))


def ring_positions(slots, end):
    """Positions held by the `slots` slots of a ring cache once positions `< end` are written.

    Position `p` lives in slot `p % slots`, so slot `s` holds the latest
    `p < end` with `p % slots == s`. A cache that never wrapped
    (`end <= slots`) holds position `s` in slot `s`. Slots not written yet
    get `-1`, which `position_mask` never lets a query attend.

    Returns:
        `(slots,)` int32.
    """
    slot = ops.arange(slots, dtype="int32")
    end = ops.cast(end, "int32")
    held = slot + slots * ops.floor_divide(end - 1 - slot, slots)
    return ops.where(held >= 0, held, -1)


def position_mask(query_positions, key_positions, causal=True, window=None):
    """Which keys each query may attend, from their absolute positions.

    A key at a negative position is an empty cache slot and is never
    attended. With `causal`, a query at `i` sees keys at `j <= i`; with
    `window`, only the `window` most recent ones, `i - window < j`
    (Beltagy et al. 2020; Mistral's sliding window); without `causal`,
    `|i - j| < window`.

    Args:
        query_positions: `(T,)` int positions of the queries (or `(..., T)`,
            see `relative_distance`).
        key_positions: `(S,)` int positions of the keys (or `(..., S)`).
        causal: hide keys after the query.
        window: positive int (or scalar tensor), or `None` for no limit.

    Returns:
        Boolean tensor of shape `(1, T, S)` (`(1, ..., T, S)`).
    """
    window = check_window(window)
    distance = relative_distance(query_positions, key_positions)
    allowed = ops.greater_equal(ops.expand_dims(ops.cast(key_positions, "int32"), -2), 0)
    allowed = ops.broadcast_to(allowed, ops.shape(distance))
    if causal:
        allowed = ops.logical_and(allowed, ops.greater_equal(distance, 0))
    if window is not None:
        reach = distance if causal else ops.abs(distance)
        allowed = ops.logical_and(allowed, ops.less(reach, window))
    return ops.expand_dims(allowed, 0)


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
    return position_mask(positions(query_length, query_offset), positions(key_length, key_offset))


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
    if window is None:
        raise ValueError("`window` must be a positive integer. Received: window=None")
    window = check_window(window)
    key_length = query_length if key_length is None else key_length
    return position_mask(
        positions(query_length, query_offset), positions(key_length, key_offset), causal=causal, window=window
    )


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


def position_rule(query_positions, key_positions, causal=False, window=None, pattern=None, num_heads=None):
    """Causality, a `window` and an attention `pattern` as one mask from positions, or `None`.

    The rule every attention kind applies, in its full pass and when
    decoding, so an option means the same thing in both.

    Args:
        query_positions: `(T,)` int positions (or `(..., T)`: blocks of queries).
        key_positions: `(S,)` int positions, `-1` for an empty cache slot (or `(..., S)`).
        causal: hide keys after the query.
        window: attend to the `window` most recent positions, or `None`.
        pattern: an `AttentionPattern`, or `None`.
        num_heads: query heads; a pattern with `head_groups > 1` is repeated to them.

    Returns:
        Boolean `(1, [...,] T, S)`, or `(1, [...,] N, T, S)` for a per-head pattern; `None` when nothing restricts.
    """
    rule = None
    if causal or window is not None:
        rule = position_mask(query_positions, key_positions, causal=causal, window=window)
    if pattern is None:
        return rule
    allowed = pattern.mask(query_positions, key_positions)
    if pattern.head_groups > 1:
        allowed = ops.repeat(allowed, num_heads // pattern.head_groups, axis=-3)
        rule = None if rule is None else ops.expand_dims(rule, -3)
    allowed = ops.expand_dims(allowed, 0)
    return allowed if rule is None else ops.logical_and(rule, allowed)


def attention_rule_mask(padding=None, attention_mask=None, rule=None):
    """Padding `(B, T, S)`, an explicit `attention_mask` and a `position_rule` merged into one mask, or `None`.

    A per-head rule (rank 4 or more) gets a head axis on the others.
    """
    other = merge_masks(padding, attention_mask)
    if other is not None and rule is not None and len(rule.shape) == 4 and len(other.shape) == 3:
        other = ops.expand_dims(other, 1)  # [B, 1, T, S] against a per-head rule
    return merge_masks(other, rule)
