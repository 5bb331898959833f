"""Base class of self-attention within buckets (LSH, routing)."""

import keras
from keras import ops

from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention
from keras_tfam.ops.bucketed_attention import (
    causal_bucket_rule,
    causal_chunked_bucket_attention,
    chunked_bucket_attention,
)
from keras_tfam.utils import check_positive_int


@keras.saving.register_keras_serializable(package="keras_tfam")
class BucketedAttention(MultiHeadAttention):
    """Self-attention whose queries see only keys of their bucket, in chunks of `chunk_length`.

    What `LSHAttention` (hash buckets) and `RoutingAttention` (k-means
    clusters) share; subclasses assign the buckets (`query_buckets`,
    `key_buckets`, `(B, N, R, T)` for `R` rounds).

    - **Causal** (and every cached call): chunks are counted inside each
      bucket, so the keys a query sees depend on the past only
      (`keras_tfam.ops.bucketed_attention.causal_bucket_rule`): the full
      pass and token-by-token decoding compute the same thing. A sequence
      that fits in one chunk sees every earlier key of its bucket.
    - **Not causal** (encoders): the paper's form, positions sorted by
      (bucket, position) and cut into chunks, each chunk attending to
      itself and the previous one (cyclically: the first chunk looks back
      at the last, as the Reformer does).

    Any length works: a sequence that is not a multiple of `chunk_length`
    (or whose length is unknown until run time) is padded to one, and the
    padding is masked. Padding, `use_causal_mask`, a call-level `window`
    and decoding with a cache are honoured; an `attention_mask`, attention
    scores, patterns, a `memory`, ring caches and cross-attention are
    refused (one line each).

    Args:
        num_heads, key_dim, and the rest of `MultiHeadAttention`'s
            arguments (`position`: rotary only; no `pattern`).
        chunk_length: positions per chunk.
    """

    self_attention_only = True
    supports_attention_mask = False
    supports_attention_scores = False
    supports_pattern = False
    supports_memory = False
    supports_ring_cache = False
    accepts_score_bias = False
    decodes_causally = True
    attention_kernels = ()  # its own chunked kernels

    def __init__(self, num_heads, key_dim, chunk_length=64, **kwargs):
        super().__init__(num_heads, key_dim, **kwargs)
        check_positive_int("chunk_length", chunk_length)
        self.chunk_length = int(chunk_length)

    @property
    def num_bucket_ids(self):
        """Bucket ids run over `[0, num_bucket_ids)`."""
        raise NotImplementedError

    def assign_buckets(self, query, key, context):
        """`(B, T, N, H)` queries and `(B, S, N, H)` keys -> their `(B, N, R, T)` and `(B, N, R, S)` int32 buckets."""
        raise NotImplementedError

    def exclude_self(self):
        """Whether a query attends to itself only when nothing else is left (shared QK)."""
        return False

    def attend(self, query, key, value, context):
        key, value = self.repeat_key_value_heads(key), self.repeat_key_value_heads(value)
        query_buckets, key_buckets = self.assign_buckets(query, key, context)
        if context.causal:
            if not context.cached and self.shares_query_key:
                outputs = self._chunked(query, key, value, key_buckets, context, causal=True)
            else:
                outputs = self._dense_rule_attention(query, key, value, query_buckets, key_buckets, context)
        else:
            outputs = self._chunked(query, key, value, (query_buckets, key_buckets), context, causal=False)
        if context.query_mask is not None:
            outputs = outputs * ops.cast(context.query_mask, outputs.dtype)[:, :, None, None]
        return ops.cast(outputs, self.compute_dtype), None, None

    def _heads_first(self, *tensors):
        return [ops.cast(ops.transpose(x, (0, 2, 1, 3)), "float32") for x in tensors]

    def _weights_dropout(self, training):
        if self.dropout and training:
            return lambda weights: self.dropout_layer(weights, training=True)  # noqa: E731
        return None

    def _dense_rule_attention(self, query, key, value, query_buckets, key_buckets, context):
        """The causal rule as a dense mask: cached decoding, and queries with buckets of their own (routing)."""
        allowed = causal_bucket_rule(
            query_buckets,
            context.query_positions,
            key_buckets,
            context.key_positions,
            self.chunk_length,
            valid=context.key_mask,
        )
        if context.window is not None:
            allowed = ops.logical_and(allowed, context.rule()[:, None])
        if self.exclude_self():
            allowed = _not_self_unless_alone(allowed, context.query_positions, context.key_positions)
        return self._compute_attention(query, key, value, allowed, None, context.training, False)[0]

    def _chunked(self, query, key, value, buckets, context, causal):
        """The chunked forms, padded to a multiple of `chunk_length`."""
        q, k, v = self._heads_first(query, key, value)
        dropout = self._weights_dropout(context.training)
        if causal:
            outputs = causal_chunked_bucket_attention(
                q,
                k,
                v,
                buckets,
                self.chunk_length,
                num_buckets=self.num_bucket_ids,
                window=context.window,
                key_padding_mask=context.key_mask,
                exclude_self=self.exclude_self(),
                scale=self.scale,
                dropout=dropout,
            )
            return ops.transpose(outputs, (0, 2, 1, 3))
        query_buckets, key_buckets = buckets
        length = ops.shape(q)[2]
        chunk = self.chunk_length
        padded = ops.maximum((length + chunk - 1) // chunk * chunk, 1)
        static = isinstance(length, int)
        if static and (length <= chunk or length % chunk == 0):
            extra, key_mask = 0, context.key_mask
        else:
            extra = padded - length
            real = ops.ones((ops.shape(q)[0], length), "bool") if context.key_mask is None else context.key_mask
            key_mask = ops.pad(ops.cast(real, "bool"), [[0, 0], [0, extra]], constant_values=False)
            pad = [[0, 0], [0, 0], [0, extra], [0, 0]]
            q, k, v = (ops.pad(x, pad) for x in (q, k, v))
            pad = [[0, 0], [0, 0], [0, 0], [0, extra]]
            shared = query_buckets is key_buckets
            # Padding sorts last (the highest bucket id) and is masked as keys.
            query_buckets = ops.pad(query_buckets, pad, constant_values=self.num_bucket_ids)
            key_buckets = query_buckets if shared else ops.pad(key_buckets, pad, constant_values=self.num_bucket_ids)
        outputs = chunked_bucket_attention(
            q,
            k,
            v,
            query_buckets,
            key_buckets,
            chunk,
            causal=False,
            window=context.window,
            key_padding_mask=key_mask,
            exclude_self=self.exclude_self(),
            deduplicate=True,
            scale=self.scale,
            dropout=dropout,
        )
        return ops.transpose(outputs, (0, 2, 1, 3))[:, :length]

    def get_config(self):
        config = super().get_config()
        config.update(chunk_length=self.chunk_length)
        return config


def _not_self_unless_alone(mask, query_positions, key_positions):
    """`mask (B, N, T, S)` without each query's own position, except where it is all that is left."""
    itself = ops.equal(ops.cast(query_positions, "int32")[:, None], ops.cast(key_positions, "int32")[None, :])
    others = ops.logical_and(mask, ops.logical_not(itself))
    return ops.where(ops.any(others, axis=-1, keepdims=True), others, mask)
