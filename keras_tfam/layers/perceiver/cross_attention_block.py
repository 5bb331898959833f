"""Pre-norm cross-attention block: queries attend to another sequence, then an MLP."""

import keras

from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention
from keras_tfam.layers.blocks.feed_forward import FeedForward
from keras_tfam.utils import check_positive_int, head_size


@keras.saving.register_keras_serializable(package="keras_tfam")
class CrossAttentionBlock(keras.layers.Layer):
    """`q = q + Attn(LN(q), LN(x))`, then `q = q + MLP(LN(q))` (Perceiver IO's cross-attend).

    Jaegle et al. 2022 use it to read inputs into latents (with the query
    residual) and to decode latents into outputs (often without it). Cost is
    linear in the length of `x`.

    Args:
        num_heads: attention heads.
        intermediate_dim: MLP width; default the query width.
        use_query_residual: add the queries to the attention output.
        activation: MLP activation (see `FeedForward`).
        dropout: dropout on the attention output and in the MLP.

    Call arguments:
        query: `(B, N, D)`.
        value: `(B, M, C)`.
        value_mask: `(B, M)` padding mask of `value`.
        training: whether dropout is active.

    Returns:
        `(B, N, D)`.

    Examples:
        >>> CrossAttentionBlock(1)(keras.random.normal((2, 8, 32)), keras.random.normal((2, 500, 3))).shape
        (2, 8, 32)
    """

    def __init__(
        self, num_heads, intermediate_dim=None, use_query_residual=True, activation="gelu", dropout=0.0, **kwargs
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.use_query_residual = use_query_residual
        self.activation = activation
        self.dropout = dropout

    def build(self, query_shape, value_shape):
        width = query_shape[-1]
        key_dim = head_size("width", width, self.num_heads)
        norm = dict(epsilon=1e-5, dtype=self.dtype_policy)
        self.query_norm = keras.layers.LayerNormalization(name="query_norm", **norm)
        self.query_norm.build(query_shape)
        self.value_norm = keras.layers.LayerNormalization(name="value_norm", **norm)
        self.value_norm.build(value_shape)
        self.attention = MultiHeadAttention(self.num_heads, key_dim, dtype=self.dtype_policy, name="attention")
        self.attention.build(query_shape, value_shape)
        self.mlp_norm = keras.layers.LayerNormalization(name="mlp_norm", **norm)
        self.mlp_norm.build(query_shape)
        self.mlp = FeedForward(
            self.intermediate_dim or width,
            activation=self.activation,
            dropout=self.dropout,
            dtype=self.dtype_policy,
            name="mlp",
        )
        self.mlp.build(query_shape)
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def call(self, query, value, value_mask=None, training=None):
        attended = self.attention(
            self.query_norm(query), self.value_norm(value), query_mask=None, value_mask=value_mask, training=training
        )
        attended = self.dropout_layer(attended, training=training)
        hidden = query + attended if self.use_query_residual else attended
        return hidden + self.mlp(self.mlp_norm(hidden), training=training)

    def compute_output_shape(self, query_shape, value_shape):
        return query_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim,
            use_query_residual=self.use_query_residual,
            activation=self.activation,
            dropout=self.dropout,
        )
        return config
