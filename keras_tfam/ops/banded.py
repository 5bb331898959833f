"""Banded (local) attention in `O(T * w)` memory: blocks of queries over their neighbouring key blocks.

When every query `i` sees only keys `j` with `i - lookback < j <= i + lookahead`
(a sliding window, Beltagy et al. 2020; the local layers of GPT-3 and
GPT-Neo), the scores outside that band are all masked, and computing the
dense `T x T` matrix wastes time and memory. Here the sequence is cut into
`nb` blocks of `b >= lookback` queries (as blocked local-attention kernels
do); block `i` attends to the keys of blocks `i - 1`, `i` (and `i + 1` when
the band looks ahead). The blocks are folded into the batch, so the whole
computation is one call of an ordinary attention function on
`(B * nb, b, N, H)` queries and `(B * nb, 2b or 3b, K, H)` keys: scores take
`O(T * b)` memory, with no Python loop over blocks.

Masks are built from the absolute positions of each block's queries and keys
(a key outside the sequence gets position `-1`, which `position_mask` never
lets a query attend), so causality, windows and attention patterns apply as
in the dense computation.
"""

from keras import ops

from keras_tfam.ops import masks as mask_ops
from keras_tfam.ops.attention import scaled_dot_product_attention


def band_block_size(lookback, lookahead=0):
    """Queries per block for a band of `lookback` keys back (itself included) and `lookahead` ahead."""
    return max(int(lookback), int(lookahead) + 1, 1)


def _band_reach(lookback, lookahead):
    """`(blocks before, blocks after)` a query block's keys reach (blocks of `>= lookback` positions)."""
    return (1 if lookback > 1 else 0), (1 if lookahead > 0 else 0)


def _to_blocks(x, block, num_blocks):
    """`(B, T, ...)` -> `(B, nb, block, ...)`, zero-padded at the end."""
    pad = [[0, 0], [0, num_blocks * block - x.shape[1]]] + [[0, 0]] * (len(x.shape) - 2)
    return ops.reshape(ops.pad(x, pad), (-1, num_blocks, block, *x.shape[2:]))


def _to_bands(blocks, before, after, fill=0):
    """`(B, nb, block, ...)` -> `(B, nb, (before + 1 + after) * block, ...)`: each block with its neighbours."""
    num_blocks = blocks.shape[1]
    pad = [[0, 0], [before, after]] + [[0, 0]] * (len(blocks.shape) - 2)
    padded = ops.pad(blocks, pad, constant_values=fill)
    return ops.concatenate([padded[:, offset : offset + num_blocks] for offset in range(before + 1 + after)], axis=2)


def band_positions(length, block, before=1, after=0):
    """Absolute positions of the queries `(nb, block)` and keys `(nb, S_b)` of each block.

    Query block `i` holds positions `i * block ..`; its keys are those of
    blocks `i - before .. i + after`. Key positions outside `[0, length)`
    are `-1` (never attended).
    """
    num_blocks = -(-length // block)
    query_positions = ops.reshape(mask_ops.positions(num_blocks * block), (1, num_blocks, block))
    keys = ops.where(query_positions < length, query_positions, -1)
    return query_positions[0], _to_bands(keys, before, after, fill=-1)[0]


def banded_attention(
    query,
    key,
    value,
    lookback,
    lookahead=0,
    query_mask=None,
    key_mask=None,
    mask_fn=None,
    bias_fn=None,
    attend=None,
    scale=None,
):
    """Attention restricted to a band of positions, in `O(T * block)` memory.

    Query `i` may only attend keys `j` with `i - lookback < j <= i + lookahead`;
    `mask_fn` may restrict that further (causality, a dilated window, a
    pattern) but must not allow pairs outside the band. Queries and keys
    share positions `0 .. T - 1` (self-attention without a cache). Equals
    the dense computation under the same mask (`tests/ops/test_banded.py`).

    Args:
        query: `(B, T, N, H)` with a static `T`.
        key: `(B, T, K, H)`.
        value: `(B, T, K, Hv)`.
        lookback: positive int: keys up to `lookback - 1` positions back.
        lookahead: non-negative int: keys up to `lookahead` positions ahead
            (`0`: causal).
        query_mask, key_mask: boolean `(B, T)` padding masks or `None`.
        mask_fn: `(query_positions (nb, b), key_positions (nb, S_b))` ->
            boolean `(1, nb, b, S_b)` (or `(1, nb, N, b, S_b)` per head),
            `True` = may attend; default: the band itself.
        bias_fn: `(query_positions (b,), key_positions (S_b,))` -> bias
            broadcastable to `(1, N, b, S_b)`, or `None`. It is evaluated
            on one representative block and shared by all blocks, so it
            must depend on positions only through `i - j` (ALiBi, relative
            buckets).
        attend: `(query, key, value, mask, bias)` -> `(B', b, N, Hv)`, the
            attention to run on the folded blocks; default
            `scaled_dot_product_attention` with `scale`.
        scale: score multiplier of the default `attend`.

    Returns:
        `(B, T, N, Hv)`.
    """
    length = query.shape[1]
    if length is None:
        raise ValueError(f"Banded attention needs a static sequence length. Received: query.shape={tuple(query.shape)}")
    if key.shape[1] is not None and key.shape[1] != length:
        raise ValueError(
            "Banded attention is self-attention: keys and queries share their positions. Received: "
            f"query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}"
        )
    if int(lookback) < 1 or int(lookahead) < 0:
        raise ValueError(
            f"`lookback` must be >= 1 and `lookahead` >= 0. Received: lookback={lookback}, lookahead={lookahead}"
        )
    if attend is None:

        def attend(q, k, v, mask, bias):
            return scaled_dot_product_attention(q, k, v, mask, bias, scale)

    block = band_block_size(lookback, lookahead)
    num_blocks = -(-length // block)
    before, after = _band_reach(lookback, lookahead)
    query_positions, key_positions = band_positions(length, block, before, after)
    if mask_fn is None:
        distance = mask_ops.relative_distance(query_positions, key_positions)
        rule = ops.logical_and(ops.less(distance, lookback), ops.greater_equal(distance, -lookahead))
        rule = ops.expand_dims(ops.logical_and(rule, ops.expand_dims(key_positions >= 0, -2)), 0)
    else:
        rule = mask_fn(query_positions, key_positions)
    padding = None
    if query_mask is not None or key_mask is not None:
        query_blocks = None if query_mask is None else _to_blocks(query_mask, block, num_blocks)  # [B, nb, b]
        key_bands = None if key_mask is None else _to_bands(_to_blocks(key_mask, block, num_blocks), before, after)
        padding = mask_ops.padding_to_attention_mask(
            None if query_blocks is None else ops.reshape(query_blocks, (-1, block)),
            None if key_bands is None else ops.reshape(key_bands, (-1, key_positions.shape[-1])),
        )  # [B * nb, b | 1, S_b | 1]
    batch = ops.shape(query)[0]
    per_head = len(rule.shape) == 5
    rule = ops.reshape(ops.broadcast_to(rule, (batch, *rule.shape[1:])), (-1, *rule.shape[2:]))  # [B * nb, (N,) b, S_b]
    if padding is not None and per_head:
        padding = ops.expand_dims(padding, 1)
    mask = mask_ops.merge_masks(rule, padding)

    bias = None
    if bias_fn is not None:
        # One block away from the sequence's edges: every key position valid.
        representative = mask_ops.positions(block, before * block)
        bias = bias_fn(representative, mask_ops.positions(key_positions.shape[-1]))

    def bands(x):  # (B, T, K, H) -> (B * nb, S_b, K, H)
        x = _to_bands(_to_blocks(x, block, num_blocks), before, after)
        return ops.reshape(x, (-1, key_positions.shape[-1], *x.shape[3:]))

    queries = ops.reshape(_to_blocks(query, block, num_blocks), (-1, block, *query.shape[2:]))
    outputs = attend(queries, bands(key), bands(value), mask, bias)  # [B * nb, b, N, Hv]
    outputs = ops.reshape(outputs, (batch, num_blocks * block, *outputs.shape[2:]))
    return outputs[:, :length]
