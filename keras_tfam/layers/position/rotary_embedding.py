"""Rotary position embedding (Su et al. 2021, RoFormer)."""

import keras
from keras import ops

from keras_tfam.layers.position.attention_position_scheme import AttentionPositionScheme
from keras_tfam.layers.position.rope_scaling import check_rope_scaling, dynamic_inverse_frequencies, inverse_frequencies

PAIRINGS = ("interleaved", "half")


@keras.saving.register_keras_serializable(package="keras_tfam")
class RotaryEmbedding(AttentionPositionScheme):
    """Rotary position embedding: rotates feature pairs by position-dependent angles.

    Implements RoFormer (Su et al. 2021, eq. 34): pair `i` of a vector at
    position `m` is rotated by the angle `m * theta_i`, with
    `theta_i = max_wavelength ** (-2i / d)`. The dot product of a rotated
    query at position `m` and a rotated key at position `n` then depends on
    the positions only through `m - n`. No weights.

    Args:
        max_wavelength: the base `10000` of the paper.
        scaling_factor: positions are divided by it (linear position
            interpolation, Chen et al. 2023); `1.0` is the paper.
        pairing: which features form a rotated pair. `"interleaved"` pairs
            `(x[2i], x[2i+1])` as in the paper; `"half"` pairs
            `(x[i], x[i + d/2])` as in GPT-NeoX and LLaMA checkpoints.
        scaling: a context-extension rule for the frequencies, as a Hugging
            Face config's `rope_scaling`: `{"type": "linear" | "dynamic" |
            "llama3" | "yarn", "factor": ..., ...}` (see
            `keras_tfam.layers.position.rope_scaling`), or `None`.

    Call arguments:
        inputs: `(B, T, N, H)` with `H` even.
        start_index: absolute position of the first row (the cache update
            index when decoding). Int or scalar int tensor.

    Returns:
        The rotated inputs, same shape and dtype.

    Examples:
        >>> rope = RotaryEmbedding()
        >>> q = rope(keras.random.normal((2, 10, 4, 16)))
    """

    def __init__(self, max_wavelength=10000, scaling_factor=1.0, pairing="interleaved", scaling=None, **kwargs):
        super().__init__(**kwargs)
        if max_wavelength <= 1:
            raise ValueError(f"`max_wavelength` must be greater than 1. Received: max_wavelength={max_wavelength}")
        if scaling_factor <= 0:
            raise ValueError(f"`scaling_factor` must be positive. Received: scaling_factor={scaling_factor}")
        if pairing not in PAIRINGS:
            raise ValueError(f"`pairing` must be one of {PAIRINGS}. Received: pairing={pairing!r}")
        self.max_wavelength = max_wavelength
        self.scaling_factor = scaling_factor
        self.pairing = pairing
        self.scaling = check_rope_scaling(scaling)
        self.built = True

    def _angles(self, length, start_index, dim):
        """`(angles [T, H/2], attention_factor)` of positions `start_index ..`."""
        positions = ops.cast(ops.arange(length), "float32") + ops.cast(start_index, "float32")
        positions = positions / self.scaling_factor
        if self.scaling is not None and self.scaling["type"] == "dynamic":
            # The sequence so far holds `start_index + length` positions (Hugging Face: max(position_ids) + 1).
            seen = ops.cast(start_index, "float32") + ops.cast(length, "float32")
            frequencies = dynamic_inverse_frequencies(float(self.max_wavelength), dim, self.scaling, seen, ops)
            factor = 1.0
        else:
            frequencies, factor = inverse_frequencies(float(self.max_wavelength), dim, self.scaling)
            frequencies = ops.convert_to_tensor(frequencies.astype("float32"))
        return ops.einsum("t,f->tf", positions, frequencies), factor

    def call(self, inputs, start_index=0):
        dim = inputs.shape[-1]
        if len(inputs.shape) != 4 or dim is None or dim % 2:
            raise ValueError(
                "`inputs` must have shape (batch, seq, heads, head_dim) with an even "
                f"head_dim. Received: inputs.shape={tuple(inputs.shape)}"
            )
        shape = ops.shape(inputs)
        angles, factor = self._angles(shape[1], start_index, dim)
        cos = ops.cos(angles)[None, :, None, :]  # [1, T, 1, H/2]
        sin = ops.sin(angles)[None, :, None, :]
        if factor != 1.0:  # YaRN's attention temperature, applied to cos and sin as Hugging Face does
            cos, sin = cos * factor, sin * factor
        x = ops.cast(inputs, "float32")
        if self.pairing == "interleaved":
            pairs = ops.reshape(x, (shape[0], shape[1], shape[2], dim // 2, 2))
            x1, x2 = pairs[..., 0], pairs[..., 1]
            rotated = ops.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
            rotated = ops.reshape(rotated, shape)
        else:
            x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
            rotated = ops.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        return ops.cast(rotated, inputs.dtype)

    def rotate_query_key(self, query, key, query_offset=0, key_offset=0):
        return self(query, start_index=query_offset), self(key, start_index=key_offset)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            max_wavelength=self.max_wavelength,
            scaling_factor=self.scaling_factor,
            pairing=self.pairing,
            scaling=self.scaling,
        )
        return config
