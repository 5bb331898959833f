"""Root mean square layer normalization (Zhang & Sennrich 2019)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_tfam")
class RMSNorm(keras.layers.Layer):
    """Rescales by the root mean square of the features, without centring.

    Implements Zhang & Sennrich 2019: `y = x / sqrt(mean(x^2) + epsilon) * g`
    over the last axis, with a learned gain `g` (initialised to ones). The
    statistic is computed in float32 whatever the input dtype.

    With `scale_offset=1.0` the gain is stored as `g - 1` (Gemma's
    `x * (1 + weight)`, weights initialised to zeros), so its checkpoints
    load as they are.

    Args:
        epsilon: added to the mean square for numerical stability.
        scale_initializer: initializer of the stored gain; default ones, or
            zeros with a `scale_offset` of 1.
        scale_offset: added to the stored gain: `0.0` (the paper) or `1.0`
            (Gemma).

    Call arguments:
        inputs: `(..., D)`.

    Returns:
        `(..., D)` in the layer's compute dtype.

    Examples:
        >>> RMSNorm()(keras.random.normal((2, 5, 16))).shape
        (2, 5, 16)
    """

    def __init__(self, epsilon=1e-6, scale_initializer=None, scale_offset=0.0, **kwargs):
        super().__init__(**kwargs)
        if epsilon < 0:
            raise ValueError(f"`epsilon` must be non-negative. Received: epsilon={epsilon}")
        if scale_offset not in (0.0, 1.0):
            raise ValueError(f"`scale_offset` must be 0.0 or 1.0 (Gemma). Received: scale_offset={scale_offset!r}")
        self.epsilon = epsilon
        self.scale_offset = float(scale_offset)
        default = "zeros" if self.scale_offset else "ones"
        self.scale_initializer = keras.initializers.get(scale_initializer or default)
        self.supports_masking = True

    def build(self, inputs_shape):
        self.scale = self.add_weight(name="scale", shape=(inputs_shape[-1],), initializer=self.scale_initializer)
        self.built = True

    def call(self, inputs):
        x = ops.cast(inputs, "float32")
        mean_square = ops.mean(ops.square(x), axis=-1, keepdims=True)
        scale = ops.cast(self.scale, "float32")
        if self.scale_offset:
            scale = scale + self.scale_offset
        outputs = x * ops.rsqrt(mean_square + self.epsilon) * scale
        return ops.cast(outputs, self.compute_dtype)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            epsilon=self.epsilon,
            scale_offset=self.scale_offset,
            scale_initializer=keras.initializers.serialize(self.scale_initializer),
        )
        return config
