"""Bucketed relative position bias (Raffel et al. 2020, T5)."""

import math

import keras
from keras import ops

from keras_tfam.layers.position.attention_position_scheme import AttentionPositionScheme
from keras_tfam.ops.masks import relative_distance
from keras_tfam.utils import check_positive_int


def relative_position_buckets(distance, bidirectional=True, num_buckets=32, max_distance=128):
    """T5's bucket of each `distance = query_position - key_position`.

    Half the buckets (per direction when bidirectional) hold exact distances
    `0 .. n/2 - 1`; the rest cover distances up to `max_distance`
    logarithmically; larger distances share the last bucket. When
    bidirectional, keys after the query use the upper half of the buckets.
    """
    distance = ops.cast(distance, "int32")
    buckets = ops.zeros_like(distance)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + ops.cast(ops.less(distance, 0), "int32") * num_buckets
        distance = ops.abs(distance)
    else:
        distance = ops.maximum(distance, 0)
    max_exact = num_buckets // 2
    is_small = ops.less(distance, max_exact)
    safe = ops.cast(ops.maximum(distance, 1), "float32")
    large = max_exact + ops.cast(
        ops.log(safe / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact),
        "int32",
    )
    large = ops.minimum(large, num_buckets - 1)
    return buckets + ops.where(is_small, distance, large)


@keras.saving.register_keras_serializable(package="keras_tfam")
class RelativePositionBias(AttentionPositionScheme):
    """Learned per-head scalar bias for each bucket of relative distance (T5).

    Implements the relative attention bias of Raffel et al. 2020 (T5): the
    distance between a query and a key is mapped to one of `num_buckets`
    buckets (exact for short distances, logarithmic up to `max_distance`),
    and each head learns one scalar per bucket, added to the scores.

    Args:
        num_heads: number of attention heads.
        num_buckets: number of buckets (T5: 32).
        max_distance: distances from here on share the last bucket (T5: 128).
        bidirectional: separate buckets for keys before and after the query
            (encoders); `False` for causal decoders.
        embeddings_initializer: initializer of the `(num_buckets, num_heads)`
            table.

    Call arguments:
        attention_scores: `(B, N, T, S)` scores.
        query_offset: absolute position of the first query (cache index).

    Returns:
        `attention_scores` plus the bias, float32.

    Examples:
        >>> bias = RelativePositionBias(num_heads=8, bidirectional=False)
        >>> attention = MultiHeadAttention(8, 64, position=bias)
    """

    def __init__(
        self,
        num_heads,
        num_buckets=32,
        max_distance=128,
        bidirectional=True,
        embeddings_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        min_buckets = 4 if bidirectional else 2
        if not isinstance(num_buckets, int) or num_buckets < min_buckets:
            raise ValueError(f"`num_buckets` must be an integer >= {min_buckets}. Received: num_buckets={num_buckets}")
        exact = num_buckets // (4 if bidirectional else 2)
        if max_distance <= exact:
            raise ValueError(
                f"`max_distance` must exceed the {exact} exactly bucketed distances. "
                f"Received: max_distance={max_distance}"
            )
        self.num_heads = num_heads
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.num_buckets, self.num_heads),
            initializer=self.embeddings_initializer,
        )
        self.built = True

    def attention_bias(self, query_positions, key_positions):
        distance = relative_distance(query_positions, key_positions)
        buckets = relative_position_buckets(distance, self.bidirectional, self.num_buckets, self.max_distance)
        bias = ops.take(ops.cast(self.embeddings, "float32"), buckets, axis=0)  # [T, S, N]
        return ops.expand_dims(ops.transpose(bias, (2, 0, 1)), 0)  # [1, N, T, S]

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
            bidirectional=self.bidirectional,
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
        )
        return config
