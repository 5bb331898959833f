"""Scaled dot-product attention (Vaswani et al. 2017, eq. 1).

Layout follows `keras.ops.dot_product_attention`: query `(B, T, N, H)`, key
and value `(B, S, K, H)` with `K` key/value heads. When `K < N` the query
heads are split into `K` groups that share one key/value head (grouped-query
attention, Ainslie et al. 2023; multi-query when `K == 1`) without copying
the keys and values.

Scores, bias, masking and softmax run in float32 whatever the input dtype, so
mixed precision cannot overflow or produce NaN from masking; a query row whose
keys are all masked gets zero weights, and so a zero output.
"""

import math

import keras
from keras import ops

from keras_tfam.utils import static_dim

# Masked scores are *replaced* by this value (never added to), so it cannot
# overflow; exp(_MASKED - max) underflows to exactly 0 in float32.
_MASKED_SCORE = -1e9


def _check_rank(name, tensor, rank, layout):
    if len(tensor.shape) != rank:
        raise ValueError(f"`{name}` must have rank {rank} {layout}. Received: {name}.shape={tuple(tensor.shape)}")


def _head_counts(query, key, value):
    _check_rank("query", query, 4, "(batch, seq, heads, head_dim)")
    _check_rank("key", key, 4, "(batch, seq, kv_heads, head_dim)")
    _check_rank("value", value, 4, "(batch, seq, kv_heads, head_dim)")
    num_heads, head_dim = query.shape[2], query.shape[3]
    num_kv_heads = key.shape[2]
    if key.shape[3] is not None and head_dim is not None and key.shape[3] != head_dim:
        raise ValueError(
            "`query` and `key` must have the same head_dim (last axis). "
            f"Received: query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}"
        )
    if value.shape[2] != num_kv_heads:
        raise ValueError(
            "`key` and `value` must have the same number of heads (axis 2). "
            f"Received: key.shape={tuple(key.shape)}, value.shape={tuple(value.shape)}"
        )
    if num_heads % num_kv_heads:
        raise ValueError(
            "The number of query heads must be a multiple of the number of "
            f"key/value heads. Received: query heads={num_heads}, "
            f"key/value heads={num_kv_heads}"
        )
    return num_heads, num_kv_heads


def _split_groups(tensor, num_kv_heads):
    """`(B, T, N, H)` -> `(B, T, K, N // K, H)`."""
    shape = ops.shape(tensor)
    groups = tensor.shape[2] // num_kv_heads
    return ops.reshape(tensor, (shape[0], shape[1], num_kv_heads, groups, shape[3]))


def attention_weights(query, key, attention_mask=None, bias=None, scale=None):
    """Softmax attention weights `softmax(Q K^T * scale + bias)` with masking.

    Args:
        query: `(B, T, N, H)`.
        key: `(B, S, K, H)`, `N` a multiple of `K`.
        attention_mask: boolean, `True` = may attend; broadcastable to
            `(B, T, S)`, or a rank-4 mask broadcastable to `(B, N, T, S)`.
        bias: additive float bias broadcastable to `(B, N, T, S)`, such as
            ALiBi or a relative position bias.
        scale: multiplier of the scores; defaults to `1 / sqrt(H)`.

    Returns:
        float32 weights of shape `(B, N, T, S)`; rows with every key masked
        are all zeros.
    """
    num_heads, num_kv_heads = _head_counts(query, key, key)
    # One dtype for both (a float32 position layer rotates a 16-bit layer's queries and keys to float32,
    # and the keys of a 16-bit cache are 16-bit): not every backend's product mixes them.
    dtype = keras.backend.result_type(query.dtype, key.dtype)
    query, key = ops.cast(query, dtype), ops.cast(key, dtype)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    # Scaling the query before the product keeps float16 scores in range.
    query = ops.multiply(query, ops.cast(scale, query.dtype))
    if static_dim(query.shape[1]) == 1:
        # One query (a decoding step): a broadcast multiply-and-sum reads the
        # keys once in their (B, S, K, H) layout, where a batched matmul would
        # first transpose the whole cache.
        grouped = _split_groups(query, num_kv_heads)  # [B, 1, K, G, H]
        scores = ops.sum(grouped * ops.expand_dims(key, 3), axis=-1)  # [B, S, K, G]
        shape = ops.shape(scores)
        scores = ops.reshape(scores, (shape[0], 1, shape[1], num_heads))
        scores = ops.transpose(scores, (0, 3, 1, 2))  # [B, N, 1, S]
    elif num_kv_heads == num_heads:
        scores = ops.einsum("btnh,bsnh->bnts", query, key)
    else:
        grouped = _split_groups(query, num_kv_heads)
        scores = ops.einsum("btkgh,bskh->bkgts", grouped, key)
        shape = ops.shape(scores)
        scores = ops.reshape(scores, (shape[0], num_heads, shape[3], shape[4]))
    scores = ops.cast(scores, "float32")
    if bias is not None:
        scores = ops.add(scores, ops.cast(bias, "float32"))
    if attention_mask is None:
        return ops.softmax(scores, axis=-1)
    mask = ops.cast(attention_mask, "bool")
    if len(mask.shape) == 3:
        mask = ops.expand_dims(mask, 1)  # [B, 1, T, S]
    elif len(mask.shape) != 4:
        raise ValueError(
            "`attention_mask` must have rank 3 (batch, query_len, key_len) or 4 "
            f"(batch, heads, query_len, key_len). Received: attention_mask.shape="
            f"{tuple(mask.shape)}"
        )
    weights = ops.softmax(ops.where(mask, scores, _MASKED_SCORE), axis=-1)
    # A fully masked row would otherwise spread its weight uniformly.
    return ops.where(mask, weights, 0.0)


def apply_attention_weights(weights, value):
    """Weighted sum of values: `(B, N, T, S) x (B, S, K, H) -> (B, T, N, H)`."""
    num_heads, num_kv_heads = weights.shape[1], value.shape[2]
    weights = ops.cast(weights, value.dtype)
    if static_dim(weights.shape[2]) == 1:
        # One query: weighted sum over S in the values' own layout (see above).
        shape = ops.shape(weights)
        grouped = ops.reshape(
            ops.transpose(weights, (0, 3, 1, 2)),  # [B, S, N, 1]
            (shape[0], shape[3], num_kv_heads, num_heads // num_kv_heads, 1),
        )
        outputs = ops.sum(grouped * ops.expand_dims(value, 3), axis=1)  # [B, K, G, H]
        return ops.reshape(outputs, (shape[0], 1, num_heads, value.shape[-1]))
    if num_kv_heads == num_heads:
        return ops.einsum("bnts,bsnh->btnh", weights, value)
    shape = ops.shape(weights)
    grouped = ops.reshape(
        weights,
        (shape[0], num_kv_heads, num_heads // num_kv_heads, shape[2], shape[3]),
    )
    outputs = ops.einsum("bkgts,bskh->btkgh", grouped, value)
    shape = ops.shape(outputs)
    return ops.reshape(outputs, (shape[0], shape[1], num_heads, value.shape[-1]))


def scaled_dot_product_attention(
    query,
    key,
    value,
    attention_mask=None,
    bias=None,
    scale=None,
    return_attention_weights=False,
):
    """`softmax(Q K^T / sqrt(d) + bias) V`, masked, in float32 internally.

    Args:
        query: `(B, T, N, H)`.
        key: `(B, S, K, H)` with `N` a multiple of `K` (grouped-query heads).
        value: `(B, S, K, Hv)`.
        attention_mask: boolean, `True` = may attend, broadcastable to
            `(B, T, S)` (or rank 4, `(B, N, T, S)`).
        bias: additive bias broadcastable to `(B, N, T, S)`.
        scale: score multiplier, default `1 / sqrt(H)`.
        return_attention_weights: also return the `(B, N, T, S)` float32
            weights.

    Returns:
        `(B, T, N, Hv)` in the dtype of `value`, and the weights if asked.

    Examples:
        >>> q = k = v = keras.random.normal((2, 5, 4, 8))
        >>> scaled_dot_product_attention(q, k, v, causal_mask(5)).shape
        (2, 5, 4, 8)
    """
    _head_counts(query, key, value)
    weights = attention_weights(query, key, attention_mask, bias, scale)
    outputs = apply_attention_weights(weights, value)
    if return_attention_weights:
        return outputs, weights
    return outputs


def flash_attention_fits(query, key):
    """Whether causal self-attention of these heads can run as one fused (flash) kernel here.

    Yes on the JAX backend on a GPU (cuDNN's fused attention, through
    `keras.ops.dot_product_attention`), for bfloat16 or float16 heads of at
    most 128 dimensions, a multiple of 8. Elsewhere the score matrix is
    built explicitly (by the other kernels of `MultiHeadAttention`), with
    float32 scores.

    Args:
        query: `(B, T, N, H)` query heads.
        key: `(B, S, K, H)` key heads.

    Returns:
        A Python bool.

    Examples:
        >>> heads = keras.ops.ones((1, 4, 2, 8), "bfloat16")
        >>> flash_attention_fits(heads, heads)  # on a CPU
        False
    """
    import keras

    if keras.config.backend() != "jax" or not _on_gpu():
        return False
    head_dim = static_dim(query.shape[-1])
    dtypes = {keras.backend.standardize_dtype(t.dtype) for t in (query, key)}
    return (
        dtypes <= {"bfloat16", "float16"}
        and len(dtypes) == 1
        and head_dim is not None
        and (head_dim % 8 == 0 and head_dim <= 128)
    )


def _on_gpu():
    import jax

    return jax.default_backend() == "gpu"


def flash_causal_attention(query, key, value, scale=None):
    """Causal self-attention `(B, T, N, H)` over `(B, T, K, H)` keys in one fused kernel (Dao et al. 2022).

    Only where `flash_attention_fits`; the scores never leave the chip, the
    softmax statistics are float32 inside the kernel. Same result as
    `scaled_dot_product_attention` with a causal mask, to the rounding of
    the half-precision inputs.

    Args:
        query: `(B, T, N, H)`, bfloat16 or float16.
        key: `(B, T, K, H)` with `N` a multiple of `K` (grouped-query heads).
        value: `(B, T, K, H)`.
        scale: score multiplier, default `1 / sqrt(H)`.

    Returns:
        `(B, T, N, H)` in the dtype of `query`.

    Examples:
        >>> q = k = v = keras.random.normal((2, 128, 12, 64), dtype="bfloat16")
        >>> if flash_attention_fits(q, k):  # a GPU
        ...     outputs = flash_causal_attention(q, k, v)
    """
    import keras

    return keras.ops.dot_product_attention(query, key, value, scale=scale, is_causal=True, flash_attention=True)
