"""ScaleNorm (Nguyen & Salazar 2019)."""

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_tfam")
class ScaleNorm(keras.layers.Layer):
    """Projects each vector onto a sphere of learned radius.

    Implements Nguyen & Salazar 2019 ("Transformers without Tears"):
    `y = g * x / max(||x||_2, epsilon)` over the last axis, with one learned
    scalar `g` initialised to `sqrt(D)`. The norm is computed in float32.

    Args:
        epsilon: lower bound on the norm.

    Call arguments:
        inputs: `(..., D)`.

    Returns:
        `(..., D)` in the layer's compute dtype.

    Examples:
        >>> ScaleNorm()(keras.random.normal((2, 5, 16))).shape
        (2, 5, 16)
    """

    def __init__(self, epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        if epsilon <= 0:
            raise ValueError(f"`epsilon` must be positive. Received: epsilon={epsilon}")
        self.epsilon = epsilon
        self.supports_masking = True

    def build(self, inputs_shape):
        self.scale = self.add_weight(
            name="scale",
            shape=(),
            initializer=keras.initializers.Constant(math.sqrt(inputs_shape[-1])),
        )
        self.built = True

    def call(self, inputs):
        x = ops.cast(inputs, "float32")
        norm = ops.sqrt(ops.sum(ops.square(x), axis=-1, keepdims=True))
        outputs = ops.cast(self.scale, "float32") * x / ops.maximum(norm, self.epsilon)
        return ops.cast(outputs, self.compute_dtype)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(epsilon=self.epsilon)
        return config
