"""Induced set attention block (Lee et al. 2019)."""

import keras

from keras_tfam.layers.set.mab import MAB
from keras_tfam.utils import check_positive_int


@keras.saving.register_keras_serializable(package="keras_tfam")
class ISAB(keras.layers.Layer):
    """`ISAB_m(X) = MAB(X, H)`, `H = MAB(I, X)` with `m` learned inducing points `I`.

    Lee et al. 2019, eq. 9-10: the set attends through `m` inducing points,
    O(n m) instead of O(n^2), and stays permutation-equivariant.

    Args:
        num_heads: attention heads.
        num_inducing: number `m` of inducing points.
        intermediate_dim, use_layer_norm, activation: as in `MAB`.

    Call arguments:
        inputs: `(B, n, d)`.
        mask: `(B, n)` padding mask (default: the Keras mask of `inputs`).

    Returns:
        `(B, n, d)`.

    Examples:
        >>> ISAB(4, num_inducing=16)(keras.random.normal((2, 100, 32))).shape
        (2, 100, 32)
    """

    def __init__(
        self, num_heads, num_inducing, intermediate_dim=None, use_layer_norm=True, activation="relu", **kwargs
    ):
        super().__init__(**kwargs)
        check_positive_int("num_inducing", num_inducing)
        self.num_heads = num_heads
        self.num_inducing = num_inducing
        self.intermediate_dim = intermediate_dim
        self.use_layer_norm = use_layer_norm
        self.activation = activation
        self.supports_masking = True

    def build(self, inputs_shape):
        width = inputs_shape[-1]
        self.inducing_points = self.add_weight(
            name="inducing_points", shape=(self.num_inducing, width), initializer="glorot_uniform"
        )
        options = dict(
            intermediate_dim=self.intermediate_dim,
            use_layer_norm=self.use_layer_norm,
            activation=self.activation,
            dtype=self.dtype_policy,
        )
        self.induce = MAB(self.num_heads, name="induce", **options)
        self.induce.build((inputs_shape[0], self.num_inducing, width), inputs_shape)
        self.attend = MAB(self.num_heads, name="attend", **options)
        self.attend.build(inputs_shape, (inputs_shape[0], self.num_inducing, width))
        self.built = True

    def call(self, inputs, mask=None):
        batch = keras.ops.shape(inputs)[0]
        points = keras.ops.broadcast_to(
            keras.ops.cast(self.inducing_points, inputs.dtype)[None], (batch, self.num_inducing, inputs.shape[-1])
        )
        hidden = self.induce(points, inputs, value_mask=mask)  # [B, m, d]
        return self.attend(inputs, hidden)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            num_inducing=self.num_inducing,
            intermediate_dim=self.intermediate_dim,
            use_layer_norm=self.use_layer_norm,
            activation=self.activation,
        )
        return config
