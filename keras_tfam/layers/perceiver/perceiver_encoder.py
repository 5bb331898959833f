"""Perceiver IO encoder: inputs -> learned latent array -> latent self-attention (Jaegle et al. 2022)."""

import keras
from keras import ops

from keras_tfam.layers.blocks.transformer_encoder_block import TransformerEncoderBlock
from keras_tfam.layers.perceiver.cross_attention_block import CrossAttentionBlock
from keras_tfam.utils import check_positive_int


@keras.saving.register_keras_serializable(package="keras_tfam")
class PerceiverEncoder(keras.layers.Layer):
    """Reads inputs of any length into `num_latents` latents, then processes the latents.

    Perceiver IO (Jaegle et al. 2022): a cross-attention from a learned
    latent array to the inputs (cost linear in input length), followed by a
    stack of pre-norm latent self-attention blocks (cost independent of the
    input length). Without positional features in the inputs, the latents
    are invariant to permutations of the inputs.

    Args:
        num_latents: size `N` of the latent array.
        latent_dim: width `D` of each latent.
        num_self_attention_layers: latent self-attention blocks.
        num_heads: heads of the self-attention blocks.
        num_cross_attention_heads: heads of the input cross-attention.
        intermediate_dim: MLP width of the self-attention blocks (default `4D`).
        dropout: dropout rate.

    Call arguments:
        inputs: `(B, M, C)`.
        mask: `(B, M)` padding mask (default: the Keras mask of `inputs`).
        training: whether dropout is active.

    Returns:
        `(B, N, D)` latents.

    Examples:
        >>> encoder = PerceiverEncoder(num_latents=64, latent_dim=128)
        >>> encoder(keras.random.normal((2, 10000, 3))).shape
        (2, 64, 128)
    """

    def __init__(
        self,
        num_latents,
        latent_dim,
        num_self_attention_layers=2,
        num_heads=4,
        num_cross_attention_heads=1,
        intermediate_dim=None,
        dropout=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (("num_latents", num_latents), ("latent_dim", latent_dim)):
            check_positive_int(name, value)
        self.num_latents = num_latents
        self.latent_dim = latent_dim
        self.num_self_attention_layers = num_self_attention_layers
        self.num_heads = num_heads
        self.num_cross_attention_heads = num_cross_attention_heads
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout

    def build(self, inputs_shape):
        self.latents = self.add_weight(
            name="latents",
            shape=(self.num_latents, self.latent_dim),
            initializer=keras.initializers.TruncatedNormal(stddev=0.02),
        )
        latent_shape = (inputs_shape[0], self.num_latents, self.latent_dim)
        self.cross_attention = CrossAttentionBlock(
            self.num_cross_attention_heads, dropout=self.dropout, dtype=self.dtype_policy, name="cross_attention"
        )
        self.cross_attention.build(latent_shape, inputs_shape)
        self.self_attention_blocks = []
        for i in range(self.num_self_attention_layers):
            block = TransformerEncoderBlock(
                self.num_heads,
                self.intermediate_dim or 4 * self.latent_dim,
                norm_position="pre",
                dropout=self.dropout,
                dtype=self.dtype_policy,
                name=f"self_attention_{i}",
            )
            block.build(latent_shape)
            self.self_attention_blocks.append(block)
        self.built = True

    def call(self, inputs, mask=None, training=None):
        batch = ops.shape(inputs)[0]
        latents = ops.broadcast_to(
            ops.cast(self.latents, self.compute_dtype)[None], (batch, self.num_latents, self.latent_dim)
        )
        latents = self.cross_attention(latents, inputs, value_mask=mask, training=training)
        for block in self.self_attention_blocks:
            latents = block(latents, training=training)
        return latents

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, inputs_shape):
        return (inputs_shape[0], self.num_latents, self.latent_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_latents=self.num_latents,
            latent_dim=self.latent_dim,
            num_self_attention_layers=self.num_self_attention_layers,
            num_heads=self.num_heads,
            num_cross_attention_heads=self.num_cross_attention_heads,
            intermediate_dim=self.intermediate_dim,
            dropout=self.dropout,
        )
        return config
