"""Position-wise feed-forward network, plain and gated."""

import keras
from keras import ops

from keras_tfam.layers.core.dense import Dense
from keras_tfam.utils import check_positive_int

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "geglu", "geglu_tanh", "swiglu")
_GATED = {"geglu": "gelu", "geglu_tanh": "gelu_tanh", "swiglu": "silu"}


def _activate(x, activation):
    if activation == "relu":
        return ops.relu(x)
    if activation in ("gelu", "geglu"):
        return ops.gelu(x, approximate=False)
    if activation in ("gelu_tanh", "geglu_tanh"):
        return ops.gelu(x, approximate=True)
    return ops.silu(x)


@keras.saving.register_keras_serializable(package="keras_tfam")
class FeedForward(keras.layers.Layer):
    """`Dense -> activation -> Dense`, or its gated variant, applied per position.

    The plain form is Vaswani et al. 2017 (`max(0, xW1 + b1) W2 + b2`) with
    ReLU, GELU (Hendrycks & Gimpel 2016) or its tanh approximation (GPT-2).
    The gated forms are Shazeer 2020: GEGLU `(GELU(xW) * xV) W2` (with the
    tanh approximation of GELU: `"geglu_tanh"`, Gemma) and SwiGLU
    `(Swish(xW) * xV) W2`.

    Args:
        intermediate_dim: width of the hidden layer.
        activation: one of `"relu"`, `"gelu"` (exact), `"gelu_tanh"`,
            `"geglu"`, `"geglu_tanh"`, `"swiglu"`.
        output_dim: output width; defaults to the input's last axis.
        dropout: dropout rate on the hidden activations.
        use_bias: whether the dense layers have biases.
        kernel_initializer: initializer of the input projections.
        bias_initializer: initializer of the biases.
        output_kernel_initializer: initializer of the output projection;
            defaults to `kernel_initializer`.

    Call arguments:
        inputs: `(..., D)`.
        training: whether dropout is active.

    Returns:
        `(..., output_dim)`.

    Examples:
        >>> FeedForward(2048, activation="swiglu")(keras.random.normal((2, 5, 512))).shape
        (2, 5, 512)
    """

    def __init__(
        self,
        intermediate_dim,
        activation="gelu",
        output_dim=None,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        output_kernel_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("intermediate_dim", intermediate_dim)
        if activation not in ACTIVATIONS:
            raise ValueError(f"`activation` must be one of {ACTIVATIONS}. Received: activation={activation!r}")
        if output_dim is not None and (not isinstance(output_dim, int) or output_dim < 1):
            raise ValueError(f"`output_dim` must be a positive integer. Received: output_dim={output_dim!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1). Received: dropout={dropout}")
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.output_dim = output_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.output_kernel_initializer = keras.initializers.get(output_kernel_initializer or kernel_initializer)
        self.supports_masking = True

    def _dense(self, units, name, initializer):
        return Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=initializer,
            bias_initializer=self.bias_initializer,
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, inputs_shape):
        self.intermediate_dense = self._dense(self.intermediate_dim, "intermediate", self.kernel_initializer)
        self.intermediate_dense.build(inputs_shape)
        if self.activation in _GATED:
            self.gate_dense = self._dense(self.intermediate_dim, "gate", self.kernel_initializer)
            self.gate_dense.build(inputs_shape)
        self.output_dense = self._dense(self.output_dim or inputs_shape[-1], "output", self.output_kernel_initializer)
        self.output_dense.build(tuple(inputs_shape[:-1]) + (self.intermediate_dim,))
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def call(self, inputs, training=None):
        hidden = self.intermediate_dense(inputs)
        if self.activation in _GATED:
            hidden = _activate(self.gate_dense(inputs), self.activation) * hidden
        else:
            hidden = _activate(hidden, self.activation)
        hidden = self.dropout_layer(hidden, training=training)
        return self.output_dense(hidden)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape[:-1]) + (self.output_dim or inputs_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            intermediate_dim=self.intermediate_dim,
            activation=self.activation,
            output_dim=self.output_dim,
            dropout=self.dropout,
            use_bias=self.use_bias,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
            output_kernel_initializer=keras.initializers.serialize(self.output_kernel_initializer),
        )
        return config
