"""Perceiver IO decoder: output queries attend to the latents (Jaegle et al. 2022)."""

import keras

from keras_tfam.layers.perceiver.cross_attention_block import CrossAttentionBlock


@keras.saving.register_keras_serializable(package="keras_tfam")
class PerceiverDecoder(keras.layers.Layer):
    """Decodes latents at arbitrary output queries with one cross-attention.

    Perceiver IO (Jaegle et al. 2022, section 3): each output query (e.g. a
    learned class query, or position features of the outputs) attends to the
    latent array; the output size is set by the queries, not by the inputs.

    Args:
        num_heads: cross-attention heads (the query width must be divisible).
        intermediate_dim: MLP width; default the query width.
        use_query_residual: add the queries to the attention output.
        dropout: dropout rate.

    Call arguments:
        queries: `(B, O, E)` output queries.
        latents: `(B, N, D)`.
        training: whether dropout is active.

    Returns:
        `(B, O, E)`.

    Examples:
        >>> decoder = PerceiverDecoder(num_heads=1)
        >>> decoder(keras.random.normal((2, 1, 64)), keras.random.normal((2, 32, 128))).shape
        (2, 1, 64)
    """

    def __init__(self, num_heads=1, intermediate_dim=None, use_query_residual=True, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.use_query_residual = use_query_residual
        self.dropout = dropout

    def build(self, queries_shape, latents_shape):
        self.cross_attention = CrossAttentionBlock(
            self.num_heads,
            intermediate_dim=self.intermediate_dim,
            use_query_residual=self.use_query_residual,
            dropout=self.dropout,
            dtype=self.dtype_policy,
            name="cross_attention",
        )
        self.cross_attention.build(queries_shape, latents_shape)
        self.built = True

    def call(self, queries, latents, training=None):
        return self.cross_attention(queries, latents, training=training)

    def compute_output_shape(self, queries_shape, latents_shape):
        return queries_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim,
            use_query_residual=self.use_query_residual,
            dropout=self.dropout,
        )
        return config
