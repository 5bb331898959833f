"""Transformer encoder block: self-attention and feed-forward."""

import keras

from keras_tfam.layers.attention.attention_inputs import check_mask
from keras_tfam.layers.blocks.transformer_block_base import TransformerBlockBase
from keras_tfam.ops import masks as mask_ops
from keras_tfam.utils import static_dim


@keras.saving.register_keras_serializable(package="keras_tfam")
class TransformerEncoderBlock(TransformerBlockBase):
    """Self-attention then feed-forward, each in a residual branch (Vaswani et al. 2017).

    Args:
        num_heads: attention heads.
        intermediate_dim: hidden width of the feed-forward network.
        key_dim: size of each head; defaults to `hidden_dim // num_heads`.
        num_key_value_heads: grouped key/value heads (default: `num_heads`).
        dropout: dropout on each residual branch and in the feed-forward.
        attention_dropout: dropout on the attention weights.
        activation: feed-forward activation (see `FeedForward`).
        norm: `"layer"`, `"rms"` or `"scale"`.
        norm_position: `"post"` (Vaswani et al., the default) or `"pre"`
            (Xiong et al. 2020, GPT-2).
        norm_epsilon: epsilon of the norms.
        use_bias: biases in the dense layers.
        attention: a layer to use as self-attention instead of the default
            `MultiHeadAttention` (e.g. `LinearAttention`); it is called as
            `attention(x, x, attention_mask=..., use_causal_mask=...)`.
        position: an `AttentionPositionScheme` for the default attention.
        kernel_initializer, bias_initializer, output_kernel_initializer:
            initializers of the dense layers (the output one is used by the
            projections that write into the residual stream).

    Call arguments:
        inputs: `(B, T, D)`.
        padding_mask: boolean `(B, T)`, `True` = real token. Taken from the
            Keras mask of `inputs` when not given.
        attention_mask: boolean `(B, T, T)`, `True` = may attend. Masks may
            be 0/1 integers; a float (additive) mask is refused: pass
            `additive_mask == 0`.
        use_causal_mask: restrict attention to earlier positions.
        training: whether dropout is active.

    Returns:
        `(B, T, D)`.

    Examples:
        >>> block = TransformerEncoderBlock(num_heads=8, intermediate_dim=2048)
        >>> block(keras.random.normal((2, 16, 512))).shape
        (2, 16, 512)
    """

    _LAYER_ARGUMENTS = ("position", "attention")

    def __init__(self, num_heads, intermediate_dim, attention=None, **kwargs):
        super().__init__(num_heads, intermediate_dim, **kwargs)
        self._check_injected("attention", attention)
        self.attention = attention

    def build(self, inputs_shape):
        self.attention_norm = self._make_norm("attention_norm", inputs_shape)
        self.attention_layer = self.attention or self._make_attention("attention", inputs_shape[-1], self.position)
        if not self.attention_layer.built:
            self.attention_layer.build(inputs_shape, inputs_shape)
        self._build_feed_forward(inputs_shape)
        self.built = True

    def call(self, inputs, padding_mask=None, attention_mask=None, use_causal_mask=False, training=None):
        batch, length = (static_dim(dim) for dim in tuple(inputs.shape)[:2])
        check_mask("padding_mask", padding_mask, (("batch", batch), ("length", length)))
        axes = (("batch", batch), ("query length", length), ("key length", length))
        check_mask("attention_mask", attention_mask, axes, broadcast=True)
        if padding_mask is None:
            padding_mask = mask_ops.keras_mask(inputs)

        h = self._branch_input(self.attention_norm, inputs)
        y = self.attention_layer(
            h,
            h,
            query_mask=padding_mask,
            value_mask=padding_mask,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            training=training,
        )
        x = self._add_branch(self.attention_norm, inputs, y, training)
        return self._feed_forward_branch(x, training)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(attention=keras.saving.serialize_keras_object(self.attention))
        return config
