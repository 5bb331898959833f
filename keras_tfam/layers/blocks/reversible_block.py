"""Reversible residual block (Gomez et al. 2017; Kitaev et al. 2020, Reformer)."""

import keras
from keras import ops

from keras_tfam.layers.blocks.transformer_block_base import TransformerBlockBase


@keras.saving.register_keras_serializable(package="keras_tfam")
class ReversibleBlock(TransformerBlockBase):
    """A Transformer block on two streams whose inputs can be recomputed from its outputs.

    Reformer (Kitaev et al. 2020, section 3), after RevNets (Gomez et al.
    2017): the activations are split in two halves and
    `y1 = x1 + F(x2)`, `y2 = x2 + G(y1)` with `F` the attention branch
    `attention(norm(.))` and `G` the feed-forward branch `ff(norm(.))`;
    then `x2 = y2 - G(y1)` and `x1 = y1 - F(x2)` (`inverse`). Alone, the
    block is differentiated as any layer (activations stored);
    `ReversibleStack` chains blocks and recomputes instead.

    Branches must be deterministic for the recomputation to match, so
    `dropout` and `attention_dropout` must be 0; the norms are pre-norm by
    construction (inside `F` and `G`).

    Args:
        num_heads, intermediate_dim: as in `TransformerEncoderBlock`, and so
            are `key_dim`, `num_key_value_heads`, `activation`, `norm`,
            `norm_epsilon`, `use_bias`, `position`, `kernel_initializer`,
            `bias_initializer` and `output_kernel_initializer`.
        attention: a layer replacing the default `MultiHeadAttention`
            (called as `attention(x, x, use_causal_mask=...)`).
        use_causal_mask: whether the attention is causal.

    Call arguments:
        inputs: `(B, T, 2D)`, the two streams `x1, x2` side by side.
        training: passed to the branches.

    Returns:
        `(B, T, 2D)`: `y1, y2` side by side.

    Examples:
        >>> block = ReversibleBlock(num_heads=4, intermediate_dim=1024, use_causal_mask=True)
        >>> block(keras.random.normal((2, 16, 512))).shape
        (2, 16, 512)
    """

    _LAYER_ARGUMENTS = ("position", "attention")

    def __init__(self, num_heads, intermediate_dim, attention=None, use_causal_mask=False, **kwargs):
        kwargs.setdefault("norm_position", "pre")
        super().__init__(num_heads, intermediate_dim, **kwargs)
        for name in ("dropout", "attention_dropout"):
            if getattr(self, name):
                raise ValueError(
                    f"A reversible block recomputes its branches, which must then be deterministic: `{name}` must "
                    f"be 0. Received: {name}={getattr(self, name)}"
                )
        if self.norm_position != "pre":
            raise ValueError(
                "A reversible block normalises inside its branches (pre-norm). Received: "
                f"norm_position={self.norm_position!r}"
            )
        self._check_injected("attention", attention)
        self.attention = attention
        self.use_causal_mask = use_causal_mask

    def build(self, inputs_shape):
        if inputs_shape[-1] % 2:
            raise ValueError(f"The inputs hold two streams: an even last axis. Received: inputs.shape={inputs_shape}")
        shape = tuple(inputs_shape[:-1]) + (inputs_shape[-1] // 2,)
        self.attention_norm = self._make_norm("attention_norm", shape)
        self.attention_layer = self.attention or self._make_attention("attention", shape[-1], self.position)
        if not self.attention_layer.built:
            self.attention_layer.build(shape, shape)
        self._build_feed_forward(shape)
        self.built = True

    def attention_branch(self, x, training=None):
        """`F(x) = attention(norm(x))`."""
        h = self.attention_norm(x)
        return self.attention_layer(h, h, use_causal_mask=self.use_causal_mask, training=training)

    def feed_forward_branch(self, x, training=None):
        """`G(x) = ff(norm(x))`."""
        return self.feed_forward(self.feed_forward_norm(x), training=training)

    def call(self, inputs, training=None):
        x1, x2 = ops.split(inputs, 2, axis=-1)
        y1 = x1 + self.attention_branch(x2, training)
        y2 = x2 + self.feed_forward_branch(y1, training)
        return ops.concatenate([y1, y2], axis=-1)

    def inverse(self, outputs, training=None):
        """The inputs that give `outputs`: `x2 = y2 - G(y1)`, `x1 = y1 - F(x2)`."""
        y1, y2 = ops.split(outputs, 2, axis=-1)
        x2 = y2 - self.feed_forward_branch(y1, training)
        x1 = y1 - self.attention_branch(x2, training)
        return ops.concatenate([x1, x2], axis=-1)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            attention=keras.saving.serialize_keras_object(self.attention), use_causal_mask=self.use_causal_mask
        )
        return config
