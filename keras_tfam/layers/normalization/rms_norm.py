"""Root mean square layer normalization (Zhang & Sennrich 2019)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_tfam")
class RMSNorm(keras.layers.Layer):
    """Rescales by the root mean square of the features, without centring.

    Implements Zhang & Sennrich 2019: `y = x / sqrt(mean(x^2) + epsilon) * g`
    over the last axis, with a learned gain `g` (initialised to ones). The
    statistic is computed in float32 whatever the input dtype.

    Args:
        epsilon: added to the mean square for numerical stability.
        scale_initializer: initializer of the gain `g`.

    Call arguments:
        inputs: `(..., D)`.

    Returns:
        `(..., D)` in the layer's compute dtype.

    Example:

    >>> RMSNorm()(keras.random.normal((2, 5, 16))).shape
    (2, 5, 16)
    """

    def __init__(self, epsilon=1e-6, scale_initializer="ones", **kwargs):
        super().__init__(**kwargs)
        if epsilon < 0:
            raise ValueError(f"`epsilon` must be non-negative. Received: epsilon={epsilon}")
        self.epsilon = epsilon
        self.scale_initializer = keras.initializers.get(scale_initializer)
        self.supports_masking = True

    def build(self, inputs_shape):
        self.scale = self.add_weight(
            name="scale", shape=(inputs_shape[-1],), initializer=self.scale_initializer
        )
        self.built = True

    def call(self, inputs):
        x = ops.cast(inputs, "float32")
        mean_square = ops.mean(ops.square(x), axis=-1, keepdims=True)
        outputs = x * ops.rsqrt(mean_square + self.epsilon) * ops.cast(self.scale, "float32")
        return ops.cast(outputs, self.compute_dtype)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            epsilon=self.epsilon,
            scale_initializer=keras.initializers.serialize(self.scale_initializer),
        )
        return config
