"""Transformer-XL block: relative self-attention over a memory and the segment, feed-forward."""

import keras
from keras import ops

from keras_tfam.layers.blocks.gru_gate import GRUGate
from keras_tfam.layers.blocks.transformer_block_base import TransformerBlockBase
from keras_tfam.layers.position.transformer_xl_position import TransformerXLPosition

RESIDUALS = ("add", "gru")


@keras.saving.register_keras_serializable(package="keras_tfam")
class TransformerXLBlock(TransformerBlockBase):
    """A decoder block whose causal self-attention also reads a memory of earlier states.

    Dai et al. 2019 (Transformer-XL): the keys and values of layer `n` come
    from `[SG(m^{n-1}); h^{n-1}]`, the memory (the states this layer read
    for the previous segment, gradient stopped by the caller) before the
    segment, with relative positions (`TransformerXLPosition` unless
    `position` says otherwise). Pre-norm, the memory normalised with the
    segment:

        y = attention(norm(x), memory=norm(m));  x = x + y
        x = x + feed_forward(norm(x))

    With `residual="gru"` it is Parisotto et al. 2020's GTrXL block: a
    `GRUGate` replaces each residual connection and a ReLU follows each
    sublayer, `x = gate_1(x, relu(y))`, `x = gate_2(x, relu(f(norm(x))))`;
    with the gate bias the block starts near the identity.

    Args:
        num_heads, intermediate_dim: as in `TransformerDecoderBlock`, and so
            are `key_dim`, `num_key_value_heads`, `dropout`,
            `attention_dropout`, `activation`, `norm`, `norm_epsilon`,
            `use_bias`, `kernel_initializer`, `bias_initializer` and
            `output_kernel_initializer`.
        norm_position: `"pre"` (default; GTrXL's "identity map reordering")
            or `"post"` (the original Transformer-XL; `residual="add"` only).
        position: the attention's position scheme; default a new
            `TransformerXLPosition(num_heads)`.
        residual: `"add"` (a residual connection) or `"gru"` (GTrXL gating).
        gate_bias: the gates' `b_g` (GTrXL: 2).

    Call arguments:
        inputs: `(B, T, D)` the segment.
        memory: `(B, M, D)` the memory, or `None`.
        memory_mask: boolean `(B, M)`, `True` = the slot holds a state.
        window: attend to at most this many most recent positions.
        training: whether dropout is active.

    Returns:
        `(B, T, D)`.

    Examples:
        >>> block = TransformerXLBlock(4, 64, residual="gru")
        >>> previous_inputs, segment = keras.random.normal((2, 2, 8, 32))  # the block's inputs, two segments
        >>> block(segment, memory=keras.ops.stop_gradient(previous_inputs)).shape
        (2, 8, 32)
    """

    def __init__(self, num_heads, intermediate_dim, residual="add", gate_bias=2.0, norm_position="pre", **kwargs):
        super().__init__(num_heads, intermediate_dim, norm_position=norm_position, **kwargs)
        if residual not in RESIDUALS:
            raise ValueError(f"`residual` must be one of {RESIDUALS}. Received: residual={residual!r}")
        if residual == "gru" and norm_position != "pre":
            raise ValueError(
                "GTrXL gating needs pre-norm blocks (its identity map reordering). Received: "
                f"residual='gru', norm_position={norm_position!r}"
            )
        self.residual = residual
        self.gate_bias = gate_bias

    def build(self, inputs_shape):
        hidden_dim = inputs_shape[-1]
        self.self_attention_norm = self._make_norm("self_attention_norm", inputs_shape)
        position = self.position or TransformerXLPosition(self.num_heads, dtype=self.dtype_policy, name="position")
        self.self_attention_layer = self._make_attention("self_attention", hidden_dim, position)
        self.self_attention_layer.build(inputs_shape)
        self._build_feed_forward(inputs_shape)
        if self.residual == "gru":
            self.self_attention_gate, self.feed_forward_gate = (
                GRUGate(self.gate_bias, kernel_initializer=self.kernel_initializer, dtype=self.dtype_policy, name=name)
                for name in ("self_attention_gate", "feed_forward_gate")
            )
            self.self_attention_gate.build(inputs_shape)
            self.feed_forward_gate.build(inputs_shape)
        self.built = True

    def _add_branch(self, norm, x, y, training):
        if self.residual == "add":
            return super()._add_branch(norm, x, y, training)
        gate = self.self_attention_gate if norm is self.self_attention_norm else self.feed_forward_gate
        return gate(x, ops.relu(self.dropout_layer(y, training=training)))

    def call(self, inputs, memory=None, memory_mask=None, window=None, training=None):
        if memory is not None and (len(memory.shape) != 3 or memory.shape[-1] != inputs.shape[-1]):
            raise ValueError(
                f"`memory` must have shape (batch, memory_length, {inputs.shape[-1]}), the width of the inputs. "
                f"Received: memory.shape={tuple(memory.shape)}"
            )
        h = self._branch_input(self.self_attention_norm, inputs)
        if memory is not None and self.norm_position == "pre":
            memory = self.self_attention_norm(memory)
        y = self.self_attention_layer(
            h, memory=memory, memory_mask=memory_mask, use_causal_mask=True, window=window, training=training
        )
        x = self._add_branch(self.self_attention_norm, inputs, y, training)
        return self._feed_forward_branch(x, training)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(residual=self.residual, gate_bias=self.gate_bias)
        return config
