"""Fixed sinusoidal position encoding (Vaswani et al. 2017, section 3.5)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_tfam")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """The sinusoidal table of "Attention Is All You Need", to add to embeddings.

    `PE(pos, 2i) = sin(pos / max_wavelength^(2i/d))` and
    `PE(pos, 2i+1) = cos(pos / max_wavelength^(2i/d))`. No weights.

    Args:
        max_wavelength: the base `10000` of the paper.

    Call arguments:
        inputs: `(B, T, D)` embeddings; only their shape is used.
        start_index: absolute position of the first row (the cache update
            index when decoding).

    Returns:
        The encoding, `(B, T, D)`, in the layer's compute dtype (computed in
        float32).

    Examples:
        >>> x = keras.random.normal((2, 10, 64))
        >>> x = x + SinusoidalPositionEncoding()(x)
    """

    def __init__(self, max_wavelength=10000, **kwargs):
        super().__init__(**kwargs)
        if max_wavelength <= 1:
            raise ValueError(f"`max_wavelength` must be greater than 1. Received: max_wavelength={max_wavelength}")
        self.max_wavelength = max_wavelength
        self.built = True

    def call(self, inputs, start_index=0):
        if len(inputs.shape) < 2:
            raise ValueError(f"`inputs` must have shape (..., seq, dim). Received: inputs.shape={tuple(inputs.shape)}")
        shape = ops.shape(inputs)
        dim = inputs.shape[-1]
        positions = ops.cast(ops.arange(shape[-2]), "float32") + ops.cast(start_index, "float32")
        pair_index = ops.cast(ops.arange(dim) // 2, "float32")
        inverse_frequencies = ops.power(float(self.max_wavelength), -2.0 * pair_index / dim)
        angles = positions[:, None] * inverse_frequencies[None, :]  # [T, D]
        is_even = ops.equal(ops.arange(dim) % 2, 0)
        encoding = ops.where(is_even[None, :], ops.sin(angles), ops.cos(angles))
        return ops.broadcast_to(ops.cast(encoding, self.compute_dtype), shape)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(max_wavelength=self.max_wavelength)
        return config
