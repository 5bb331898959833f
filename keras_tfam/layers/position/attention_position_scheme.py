"""Base class of position schemes that act inside attention."""

import keras
from keras import ops

from keras_tfam.ops.masks import positions


@keras.saving.register_keras_serializable(package="keras_tfam")
class AttentionPositionScheme(keras.layers.Layer):
    """A position scheme that `MultiHeadAttention` applies to its heads.

    Schemes that rotate queries and keys (rotary) override
    `rotate_query_key`; schemes that add a bias to the attention scores
    (ALiBi, relative position buckets) override `attention_bias`. The
    defaults do nothing, so a scheme overrides only the hook it needs and the
    attention layer stays free of per-scheme branches.

    Positions are absolute. Rotations see the position of the first query
    and of the first new key (with a KV cache, both the cache update index);
    biases see the position of every query and every key, since the keys of
    a cache are its slots, and a sliding-window (ring) cache holds positions
    out of order. So cached decoding sees the same positions as a full pass.
    """

    @property
    def adds_score_bias(self):
        """Whether the scheme adds a bias to the scores (it overrides `attention_bias`)."""
        return type(self).attention_bias is not AttentionPositionScheme.attention_bias

    def rotate_query_key(self, query, key, query_offset=0, key_offset=0):
        """Returns `(query, key)` transformed; `(B, T, N, H)` / `(B, S, K, H)`."""
        return query, key

    def attention_bias(self, query_positions, key_positions):
        """Returns a float32 bias broadcastable to `(B, N, T, S)`, or `None`.

        Args:
            query_positions: `(T,)` int32 absolute positions of the queries.
            key_positions: `(S,)` int32 absolute positions of the keys.
        """
        return None

    def call(self, attention_scores, query_offset=0):
        """Bias schemes as a layer: `(B, N, T, S)` scores plus the bias, float32.

        The queries sit at `query_offset ..`, the keys at `0 ..`.
        """
        shape = ops.shape(attention_scores)
        bias = self.attention_bias(positions(shape[-2], query_offset), positions(shape[-1]))
        return ops.cast(attention_scores, "float32") + bias

    def compute_output_shape(self, attention_scores_shape):
        return attention_scores_shape


def check_no_score_bias(owner, position):
    """A `ValueError` for a scheme that biases scores given to attention that never forms them."""
    if position is not None and position.adds_score_bias:
        raise ValueError(
            f"{owner} cannot add a score bias (ALiBi, relative positions); use rotary or learned positions. "
            f"Received: position={position!r}"
        )
