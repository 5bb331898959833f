"""GTrXL's GRU-type gating layer (Parisotto et al. 2020)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_tfam")
class GRUGate(keras.layers.Layer):
    """A GRU-style gate that replaces a residual connection `x + y`.

    Implements the gating layer of Parisotto et al. 2020 ("Stabilizing
    Transformers for Reinforcement Learning", section 3.2, GTrXL), with `x`
    the residual stream and `y` the output of the sublayer:

        r = sigmoid(W_r y + U_r x)
        z = sigmoid(W_z y + U_z x - b_g)
        h = tanh(W_g y + U_g (r * x))
        g(x, y) = (1 - z) * x + z * h

    With the gate bias `b_g > 0` the update gate `z` starts near 0, so the
    layer starts near the identity on `x` (the paper: `b_g = 2`, and a block
    that starts as the identity map is what makes GTrXL trainable).

    Args:
        gate_bias: `b_g`.
        kernel_initializer: initializer of the six `(D, D)` matrices.

    Call arguments:
        inputs: `x`, the residual stream `(..., D)`.
        update: `y`, the sublayer's output `(..., D)`.

    Returns:
        `(..., D)`.

    Examples:
        >>> gate, attention = GRUGate(gate_bias=2.0), MultiHeadAttention(4, 8)
        >>> x = keras.random.normal((2, 10, 32))
        >>> gate(x, keras.ops.relu(attention(x))).shape
        (2, 10, 32)
    """

    def __init__(self, gate_bias=2.0, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if not isinstance(gate_bias, (int, float)) or isinstance(gate_bias, bool):
            raise ValueError(f"`gate_bias` must be a number. Received: gate_bias={gate_bias!r}")
        self.gate_bias = gate_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, inputs_shape, update_shape=None):
        dim = inputs_shape[-1]
        if update_shape is not None and update_shape[-1] != dim:
            raise ValueError(
                f"`update` must have the width of `inputs` ({dim}). Received: update.shape={tuple(update_shape)}"
            )

        def matrix(name, columns):
            return self.add_weight(name=name, shape=(dim, columns), initializer=self.kernel_initializer)

        self.update_kernel = matrix("update_kernel", 3 * dim)  # [W_r W_z W_g]
        self.reset_update_kernel = matrix("reset_update_kernel", 2 * dim)  # [U_r U_z]
        self.candidate_kernel = matrix("candidate_kernel", dim)  # U_g
        self.built = True

    def call(self, inputs, update):
        dim = inputs.shape[-1]
        from_update = ops.matmul(update, self.update_kernel)
        from_inputs = ops.matmul(inputs, self.reset_update_kernel)
        reset = ops.sigmoid(from_update[..., :dim] + from_inputs[..., :dim])
        gate = ops.sigmoid(from_update[..., dim : 2 * dim] + from_inputs[..., dim:] - self.gate_bias)
        candidate = ops.tanh(from_update[..., 2 * dim :] + ops.matmul(reset * inputs, self.candidate_kernel))
        return (1.0 - gate) * inputs + gate * candidate

    def compute_output_shape(self, inputs_shape, update_shape=None):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            gate_bias=self.gate_bias,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
