"""LSH attention (Kitaev et al. 2020, Reformer)."""

import keras
from keras import ops

from keras_tfam.layers.attention.bucketed_attention import BucketedAttention
from keras_tfam.layers.attention.seeded_draws import SeededDraws
from keras_tfam.ops import masks as mask_ops
from keras_tfam.utils import check_positive_int, check_window


def lsh_buckets(x, rotations):
    """Angular LSH: `h(x) = argmax([x R ; -x R])` for each random rotation (Kitaev et al. 2020, section 2).

    Args:
        x: `(..., H)`.
        rotations: `(R, H, b / 2)`, one random matrix per hash round.

    Returns:
        `(..., R)` int32 buckets in `[0, b)`.
    """
    rotated = ops.einsum("...h,rhb->...rb", ops.cast(x, "float32"), rotations)
    return ops.cast(ops.argmax(ops.concatenate([rotated, -rotated], axis=-1), axis=-1), "int32")


def not_self_unless_alone(mask, query_positions, key_positions):
    """`mask (B, N, T, S)` without each query's own position, except where it is all that is left."""
    itself = ops.equal(query_positions[:, None], key_positions[None, :])
    others = ops.logical_and(mask, ops.logical_not(itself))
    return ops.where(ops.any(others, axis=-1, keepdims=True), others, mask)


@keras.saving.register_keras_serializable(package="keras_tfam")
class LSHAttention(SeededDraws, BucketedAttention):
    """Self-attention within locality-sensitive hash buckets (Reformer).

    Kitaev et al. 2020 ("Reformer: The Efficient Transformer"), section 2:
    queries and keys are shared (`k = q / |q|`, one projection), hashed by
    random rotations, `h(x) = argmax([x R ; -x R])` with `R` a random
    `(H, b / 2)` Gaussian matrix; positions are sorted by (bucket,
    position) and cut into chunks of `chunk_length`, and each chunk attends
    to itself and to the previous chunk, to keys of its own bucket only. A
    token does not attend to itself unless nothing else is left (with
    shared QK its own key would dominate). `num_hashes` rounds with
    independent rotations are combined by their log-sum-exps, each key
    counted once however many rounds find it, so more rounds approach full
    attention. Cost `O(T * chunk_length * num_hashes)`.

    Decoding with a KV cache (`MultiHeadAttention`'s, ring caches included)
    attends to every cached key that shares the query's bucket in some
    round: what the chunked form computes when one chunk holds the whole
    sequence; with shorter chunks the training form sees a subset of it.

    The rotations are a seeded non-trainable weight, saved with the model,
    redrawn every `redraw` training calls when set (Reformer hashes afresh
    at every step: `redraw=1`).

    Args:
        num_heads, key_dim, value_dim, output_dim, use_bias, dropout,
        position, scale, kernel_initializer, bias_initializer,
        output_kernel_initializer: as in `MultiHeadAttention` (`position`:
        rotary only; no key projection, no grouped key/value heads).
        num_buckets: buckets per round, even (`argmax` over `b/2` rotated
            coordinates and their negatives), or 1 (no hashing).
        num_hashes: hash rounds.
        chunk_length: positions per chunk; a sequence longer than it must
            be a multiple of it.
        redraw: redraw the rotations every this many training calls, or
            `None`.
        seed: seed of the rotations; `None` picks one (kept in the config).

    Call arguments:
        As `MultiHeadAttention` for self-attention: `query` (`value`, if
        given, must be `query`), padding masks, `use_causal_mask`, `window`,
        `cache`, `cache_update_index`, `training`. No `attention_mask`, no
        attention scores.

    Returns:
        `(B, T, output_dim)`, or `(outputs, cache)` with a cache.

    Example:

    >>> attention = LSHAttention(num_heads=4, key_dim=64, num_buckets=64, num_hashes=2, chunk_length=64)
    >>> attention(keras.random.normal((2, 4096, 256)), use_causal_mask=True).shape
    (2, 4096, 256)
    """

    def __init__(self, num_heads, key_dim, num_buckets=32, num_hashes=1, chunk_length=64, redraw=None, seed=None,
                 **kwargs):
        super().__init__(num_heads, key_dim, chunk_length=chunk_length, **kwargs)
        check_positive_int("num_buckets", num_buckets)
        if num_buckets > 1 and num_buckets % 2:
            raise ValueError(
                "`num_buckets` must be even (argmax over b/2 rotated coordinates and their negatives) or 1. "
                f"Received: num_buckets={num_buckets}"
            )
        check_positive_int("num_hashes", num_hashes)
        if self.num_key_value_heads != num_heads:
            raise ValueError(
                "LSH attention shares queries and keys: it has no grouped key/value heads. Received: "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        self.num_buckets = num_buckets
        self.num_hashes = num_hashes
        self._init_draws(seed, redraw)

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        self.query_dense = self._dense(self.num_heads * self.key_dim, "query")  # queries = keys
        self.query_dense.build(query_shape)
        self.value_dense = self._dense(self.num_heads * self.value_dim, "value")
        self.value_dense.build(value_shape)
        self.output_dense = self._dense(
            self.output_dim or query_shape[-1], "attention_output", self.output_kernel_initializer
        )
        self.output_dense.build(tuple(query_shape[:-1]) + (self.num_heads * self.value_dim,))
        if self.dropout:
            self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        if self.position is not None and not self.position.built:
            self.position.build(None)
        shape = (self.num_hashes, self.key_dim, max(self.num_buckets // 2, 1))
        self.rotations = self._build_draws(
            "rotations", shape, lambda seed: keras.random.normal(shape, seed=seed, dtype="float32")
        )
        self.built = True

    def buckets(self, x, rotations=None):
        """`(..., H)` heads -> `(..., num_hashes)` int32 buckets."""
        if self.num_buckets == 1:
            return ops.zeros((*ops.shape(x)[:-1], self.num_hashes), "int32")
        return lsh_buckets(x, self.rotations.value if rotations is None else rotations)

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        window=None,
        cache=None,
        cache_update_index=None,
        return_attention_scores=False,
        training=None,
    ):
        self._check_call(query, value, key, attention_mask, return_attention_scores)
        window = check_window(window)
        _, _, query_mask, key_padding = self._resolve_inputs(query, None, None, query_mask, value_mask, key_mask, cache)
        rotations = self._current_draw(training)
        offset = 0 if cache_update_index is None else cache_update_index
        q = self._split_heads(self.query_dense(query), self.num_heads)  # [B, T, N, H]
        v = self._split_heads(self.value_dense(query), self.num_heads)  # [B, T, N, Hv]
        k = q / ops.sqrt(ops.sum(ops.square(q), axis=-1, keepdims=True) + 1e-6)  # shared QK, unit keys
        if self.position is not None:
            q, k = self.position.rotate_query_key(q, k, offset, offset)
        if cache is not None:
            self._check_cache(cache)
            cache, k, v, key_positions = self._update_cache(cache, k, v, cache_update_index, window)
            query_positions = mask_ops.positions(ops.shape(q)[1], offset)
            mask = mask_ops.merge_masks(
                mask_ops.padding_to_attention_mask(query_mask, key_padding),
                mask_ops.position_mask(query_positions, key_positions, causal=True, window=window),
            )
            shared = ops.any(  # [B, N, T, S]: same bucket in some round
                ops.equal(self.buckets(q, rotations)[:, :, None], self.buckets(k, rotations)[:, None]), axis=-1
            )
            mask = ops.logical_and(ops.expand_dims(mask, 1), ops.transpose(shared, (0, 3, 1, 2)))
            mask = not_self_unless_alone(mask, query_positions, key_positions)
            outputs, _ = self._compute_attention(q, k, v, mask, None, training, False)
            return self._output(outputs, query_mask), cache
        buckets = ops.transpose(self.buckets(k, rotations), (0, 2, 3, 1))  # [B, N, R, T]
        outputs = self._attend_in_chunks(
            q, k, v, buckets, buckets, training, causal=use_causal_mask, window=window,
            key_padding_mask=key_padding, exclude_self=True, deduplicate=True,
        )
        return self._output(outputs, query_mask)

    def get_config(self):
        config = super().get_config()
        config.update(num_buckets=self.num_buckets, num_hashes=self.num_hashes, redraw=self.redraw, seed=self.seed)
        return config
