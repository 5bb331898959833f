"""Base class of position schemes that act inside attention."""

import math

import keras
from keras import ops

from keras_tfam.ops.attention import apply_attention_weights, attention_weights
from keras_tfam.ops.masks import positions


@keras.saving.register_keras_serializable(package="keras_tfam")
class AttentionPositionScheme(keras.layers.Layer):
    """A position scheme that `MultiHeadAttention` applies to its heads.

    The attention calls five hooks; the defaults do nothing, so a scheme
    overrides only the ones it needs and the attention layer stays free of
    per-scheme branches:

    - `rotate_query_key`: transforms queries and keys (rotary);
    - `attention_bias`: a bias added to the scores that depends on the
      positions only (ALiBi, T5's relative buckets);
    - `score_terms`: a term that depends on the query or key *content* and
      their positions, added to the query-key products before scaling (Shaw
      et al.'s `q_i . a^K_ij`, Transformer-XL's `u`, `v` and `R` terms);
    - `reweight`: changes the attention weights after the softmax (adaptive
      span's soft mask);
    - `value_terms`: a term added to the attended values (Shaw et al.'s
      `sum_j alpha_ij a^V_ij`).

    The scores read `scale * (q . k + score_terms) + attention_bias`. A
    scheme that overrides `reweight` or `value_terms` makes the attention
    compute its weights explicitly (`acts_on_weights`). Schemes with weights
    that depend on the head size are built with the shape of the query heads,
    `(B, T, N, H)`.

    Positions are absolute. Rotations see the position of the first query
    and of the first new key (with a KV cache, both the cache update index);
    the other hooks see the position of every query and every key, since the
    keys of a cache are its slots, and a sliding-window (ring) cache holds
    positions out of order (an empty slot holds position `-1` and is masked).
    So cached decoding sees the same positions as a full pass.

    Args:
        **kwargs: the arguments of `keras.layers.Layer` (`name`, `dtype`, ...).

    Examples:
        >>> class DistancePenalty(AttentionPositionScheme):
        ...     # Subtracts `|i - j| / 10` from every score: ALiBi with one slope.
        ...     def attention_bias(self, query_positions, key_positions):
        ...         distance = keras.ops.abs(query_positions[:, None] - key_positions[None, :])
        ...         return -keras.ops.cast(distance, "float32") / 10.0
        >>> attention = MultiHeadAttention(4, 8, position=DistancePenalty())
        >>> attention(keras.random.normal((2, 6, 32)), use_causal_mask=True).shape
        (2, 6, 32)
    """

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

    def score_terms(self, query, key, query_positions, key_positions):
        """Returns a float32 term broadcastable to `(B, N, T, S)`, or `None`.

        Added to the query-key products `q_i . k_j` before they are scaled.

        Args:
            query: `(B, T, N, H)` query heads (after `rotate_query_key`).
            key: `(B, S, K, H)` key heads, `N` a multiple of `K`.
            query_positions: `(T,)` int32 absolute positions of the queries.
            key_positions: `(S,)` int32 absolute positions of the keys.
        """
        return None

    def reweight(self, weights, query_positions, key_positions):
        """Returns the attention weights `(B, N, T, S)` (float32) changed, or as they are."""
        return weights

    def value_terms(self, weights, query_positions, key_positions):
        """Returns a term added to the attention outputs, `(B, T, N, Hv)`, or `None`.

        Args:
            weights: `(B, N, T, S)` float32 attention weights (after
                `reweight` and dropout).
        """
        return None

    def spans(self):
        """The learned attention spans `(N,)` float32 (adaptive span), or `None`: a scheme without spans."""
        return None

    @property
    def acts_on_weights(self):
        """Whether the scheme overrides `reweight` or `value_terms` (attention then computes explicit weights)."""
        cls = type(self)
        return cls.reweight is not AttentionPositionScheme.reweight or (
            cls.value_terms is not AttentionPositionScheme.value_terms
        )

    @property
    def acts_on_scores(self):
        """Whether the scheme adds to the scores or changes the weights (kernels without scores cannot use it)."""
        cls = type(self)
        return (
            self.acts_on_weights
            or cls.attention_bias is not AttentionPositionScheme.attention_bias
            or (cls.score_terms is not AttentionPositionScheme.score_terms)
        )

    def score_bias(self, query, key, query_positions, key_positions, scale=None):
        """`attention_bias + scale * score_terms`, float32, broadcastable to `(B, N, T, S)`, or `None`.

        `scale` defaults to `1 / sqrt(H)`, as the attention's.
        """
        bias = self.attention_bias(query_positions, key_positions)
        terms = self.score_terms(query, key, query_positions, key_positions)
        if terms is None:
            return bias
        scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
        terms = ops.multiply(ops.cast(terms, "float32"), scale)
        return terms if bias is None else ops.add(terms, ops.cast(bias, "float32"))

    def attend(
        self,
        query,
        key,
        value,
        query_positions,
        key_positions,
        attention_mask=None,
        bias=None,
        scale=None,
        dropout=None,
        training=None,
    ):
        """Softmax attention with explicit weights, `reweight` and `value_terms` applied.

        Args:
            query: `(B, T, N, H)`; key: `(B, S, K, H)`; value: `(B, S, K, Hv)`.
            query_positions, key_positions: `(T,)`, `(S,)` int32.
            attention_mask: boolean, broadcastable to `(B, T, S)`.
            bias: float32 from `score_bias`, or `None`.
            scale: score multiplier, default `1 / sqrt(H)`.
            dropout: a dropout layer applied to the weights, or `None`.

        Returns:
            `(outputs (B, T, N, Hv), weights (B, N, T, S) float32)`; the
            weights returned are before dropout.
        """
        weights = self.reweight(
            attention_weights(query, key, attention_mask, bias, scale), query_positions, key_positions
        )
        dropped = weights if dropout is None else dropout(weights, training=training)
        outputs = apply_attention_weights(dropped, value)
        terms = self.value_terms(dropped, query_positions, key_positions)
        if terms is not None:
            outputs = ops.add(outputs, ops.cast(terms, outputs.dtype))
        return outputs, weights

    def call(self, attention_scores, query_offset=0):
        """Bias schemes as a layer: `(B, N, T, S)` scores plus the bias, float32.

        The queries sit at `query_offset ..`, the keys at `0 ..`.
        """
        shape = ops.shape(attention_scores)
        bias = self.attention_bias(positions(shape[-2], query_offset), positions(shape[-1]))
        return ops.cast(attention_scores, "float32") + bias

    def compute_output_shape(self, attention_scores_shape):
        return attention_scores_shape


@keras.saving.register_keras_serializable(package="keras_tfam")
class HeadsPositionScheme(AttentionPositionScheme):
    """A scheme whose hooks read the heads or the weights; as a layer, attention over given heads.

    Base of `ShawRelativePosition`, `TransformerXLPosition`, `AdaptiveSpan`
    and `ComposedPosition`: calling one runs softmax attention of query,
    key and value heads under its hooks (rotation excluded), which is what
    `MultiHeadAttention` does with it between its projections.

    Call arguments:
        query: `(B, T, N, H)` query heads.
        key: `(B, S, K, H)` key heads.
        value: `(B, S, K, Hv)` value heads.
        attention_mask: boolean `(B, T, S)`, `True` = may attend, or `None`.
        query_offset: absolute position of the first query.
        key_offset: absolute position of the first key.

    Returns:
        `(B, T, N, Hv)`.

    Args:
        **kwargs: the arguments of `keras.layers.Layer` (`name`, `dtype`, ...).

    Examples:
        >>> heads = keras.random.normal((2, 6, 4, 8))  # (B, T, N, H): queries, keys and values
        >>> ShawRelativePosition(max_distance=4)(heads, heads, heads).shape
        (2, 6, 4, 8)
    """

    def _heads_key_dim(self, query_shape):
        """`self.key_dim`, else the size of the query heads `(B, T, N, H)` being built for (stored)."""
        key_dim = getattr(self, "key_dim", None) or (None if query_shape is None else query_shape[-1])
        if key_dim is None:
            raise ValueError(
                f"{type(self).__name__} needs `key_dim`, or to be built with the shape of the query heads "
                f"(batch, seq, heads, key_dim). Received: query_shape={query_shape}"
            )
        self.key_dim = key_dim
        return key_dim

    def call(self, query, key, value, attention_mask=None, query_offset=0, key_offset=0):
        query_positions = positions(ops.shape(query)[1], query_offset)
        key_positions = positions(ops.shape(key)[1], key_offset)
        bias = self.score_bias(query, key, query_positions, key_positions)
        outputs, _ = self.attend(query, key, value, query_positions, key_positions, attention_mask, bias)
        return outputs

    def compute_output_shape(self, query_shape, key_shape=None, value_shape=None):
        value_dim = query_shape[-1] if value_shape is None else value_shape[-1]
        return tuple(query_shape[:-1]) + (value_dim,)


def check_no_score_bias(owner, position):
    """A `ValueError` for a scheme that acts on scores or weights, given to attention that never forms them."""
    if position is not None and position.acts_on_scores:
        raise ValueError(
            f"{owner} cannot add a score bias or change attention weights (ALiBi, relative positions, Shaw, "
            f"Transformer-XL, adaptive span); use rotary or learned positions. Received: position={position!r}"
        )
