"""Base class of position schemes that act inside attention."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_tfam")
class AttentionPositionScheme(keras.layers.Layer):
    """A position scheme that `MultiHeadAttention` applies to its heads.

    Schemes that rotate queries and keys (rotary) override
    `rotate_query_key`; schemes that add a bias to the attention scores
    (ALiBi, relative position buckets) override `attention_bias`. The
    defaults do nothing, so a scheme overrides only the hook it needs and the
    attention layer stays free of per-scheme branches.

    Positions are absolute: the first query sits at `query_offset` and the
    first key at `key_offset`. With a KV cache, queries and the newly written
    keys both start at the cache update index, and bias schemes see the whole
    cache as keys starting at position 0, so cached decoding sees the same
    positions as a full pass.
    """

    def rotate_query_key(self, query, key, query_offset=0, key_offset=0):
        """Returns `(query, key)` transformed; `(B, T, N, H)` / `(B, S, K, H)`."""
        return query, key

    def attention_bias(self, query_length, key_length, query_offset=0, key_offset=0):
        """Returns a float32 bias broadcastable to `(B, N, T, S)`, or `None`."""
        return None

    def call(self, attention_scores, query_offset=0):
        """Bias schemes as a layer: `(B, N, T, S)` scores plus the bias, float32."""
        shape = ops.shape(attention_scores)
        bias = self.attention_bias(shape[-2], shape[-1], query_offset)
        return ops.cast(attention_scores, "float32") + bias

    def compute_output_shape(self, attention_scores_shape):
        return attention_scores_shape
