"""Keras' `Dense`, with its bias added where XLA's CPU backend keeps a one-row product fast."""

import keras
from keras import ops

from keras_tfam.utils import is_single_row


@keras.saving.register_keras_serializable(package="keras_tfam")
class Dense(keras.layers.Dense):
    """Keras' `Dense` layer, whose one-row products stay on XLA's multithreaded kernel on a CPU.

    Decoding one sequence multiplies a single row by every weight matrix.
    XLA's CPU backend fuses `matmul + bias` into one "output fusion" exactly
    when the product has one row (a matrix-vector product), and emits that
    fusion as a single-threaded loop: GPT-2 small's per-token products then
    read their weights at 12-15 GB/s instead of the 19-23 GB/s of the
    unfused, multithreaded product on 2 cores (`BENCHMARKS.md`, batch-1
    decoding: +30% tokens/s). So for a one-row input this layer adds the
    bias as `x - (-bias)`, which XLA does not output-fuse. Negation is
    exact, so the result is bit-identical to `x + bias`; inputs of more
    rows, quantized kernels and LoRA take Keras' own path unchanged.

    Args:
        units: output width.
        **kwargs: every other argument of `keras.layers.Dense`
            (`activation`, `use_bias`, initializers, `lora_rank`, `dtype`, ...).

    Examples:
        >>> layer = Dense(4, bias_initializer="ones")
        >>> x = keras.ops.ones((1, 1, 3))
        >>> bool(keras.ops.all(layer(x) == keras.ops.matmul(x, layer.kernel) + layer.bias))
        True
    """

    def call(self, inputs, training=None):
        if self.bias is None or not is_single_row(inputs):
            return super().call(inputs, training=training)
        x = ops.subtract(ops.matmul(inputs, self.kernel), ops.negative(self.bias))
        if self.activation is not None:
            x = self.activation(x)
        return x

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras refuses subclasses unless they opt in; `call` above only changes the float path.
        super().quantize(mode, type_check=False, config=config)
