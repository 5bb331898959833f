"""Multihead attention block of the Set Transformer (Lee et al. 2019)."""

import keras

from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention
from keras_tfam.layers.blocks.feed_forward import FeedForward
from keras_tfam.utils import check_positive_int, head_size


@keras.saving.register_keras_serializable(package="keras_tfam")
class MAB(keras.layers.Layer):
    """`MAB(X, Y) = LayerNorm(H + rFF(H))`, `H = LayerNorm(X + Multihead(X, Y, Y))`.

    The building block of the Set Transformer (Lee et al. 2019, eq. 6-7):
    the elements of `X` attend to the elements of `Y`, then a row-wise
    feed-forward network; each in a residual with layer normalisation.

    Args:
        num_heads: attention heads; the width of `X` must be divisible by it.
        intermediate_dim: hidden width of rFF; default the width of `X`.
        use_layer_norm: the paper's LayerNorms (its code makes them optional).
        activation: rFF activation (see `FeedForward`).

    Call arguments:
        query: `X`, `(B, n, d)`.
        value: `Y`, `(B, m, dy)`.
        value_mask: `(B, m)` padding mask of `Y`.

    Returns:
        `(B, n, d)`.

    Examples:
        >>> MAB(4)(keras.random.normal((2, 5, 32)), keras.random.normal((2, 9, 16))).shape
        (2, 5, 32)
    """

    def __init__(self, num_heads, intermediate_dim=None, use_layer_norm=True, activation="relu", **kwargs):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.use_layer_norm = use_layer_norm
        self.activation = activation
        self.supports_masking = True

    def build(self, query_shape, value_shape=None):
        width = query_shape[-1]
        key_dim = head_size("width", width, self.num_heads)
        value_shape = query_shape if value_shape is None else value_shape
        self.attention = MultiHeadAttention(self.num_heads, key_dim, dtype=self.dtype_policy, name="attention")
        self.attention.build(query_shape, value_shape)
        self.feed_forward = FeedForward(
            self.intermediate_dim or width, activation=self.activation, dtype=self.dtype_policy, name="rff"
        )
        self.feed_forward.build(query_shape)
        if self.use_layer_norm:
            self.norm_1 = keras.layers.LayerNormalization(epsilon=1e-5, dtype=self.dtype_policy, name="norm_1")
            self.norm_1.build(query_shape)
            self.norm_2 = keras.layers.LayerNormalization(epsilon=1e-5, dtype=self.dtype_policy, name="norm_2")
            self.norm_2.build(query_shape)
        self.built = True

    def call(self, query, value=None, value_mask=None):
        value = query if value is None else value
        hidden = query + self.attention(query, value, query_mask=None, value_mask=value_mask)
        if self.use_layer_norm:
            hidden = self.norm_1(hidden)
        outputs = hidden + self.feed_forward(hidden)
        return self.norm_2(outputs) if self.use_layer_norm else outputs

    def compute_output_shape(self, query_shape, value_shape=None):
        return query_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim,
            use_layer_norm=self.use_layer_norm,
            activation=self.activation,
        )
        return config
