"""Pooling by multihead attention (Lee et al. 2019)."""

import keras

from keras_tfam.layers.blocks.feed_forward import FeedForward
from keras_tfam.layers.set.mab import MAB
from keras_tfam.utils import check_positive_int


@keras.saving.register_keras_serializable(package="keras_tfam")
class PMA(keras.layers.Layer):
    """`PMA_k(Z) = MAB(S, rFF(Z))` with `k` learned seed vectors `S`.

    Lee et al. 2019, eq. 11: pools a set into `k` vectors;
    permutation-invariant.

    Args:
        num_heads: attention heads.
        num_seeds: number `k` of output vectors.
        intermediate_dim, use_layer_norm, activation: as in `MAB`.

    Call arguments:
        inputs: `(B, n, d)`.
        mask: `(B, n)` padding mask (default: the Keras mask of `inputs`).

    Returns:
        `(B, k, d)`.

    Examples:
        >>> PMA(4, num_seeds=1)(keras.random.normal((2, 100, 32))).shape
        (2, 1, 32)
    """

    def __init__(self, num_heads, num_seeds, intermediate_dim=None, use_layer_norm=True, activation="relu", **kwargs):
        super().__init__(**kwargs)
        check_positive_int("num_seeds", num_seeds)
        self.num_heads = num_heads
        self.num_seeds = num_seeds
        self.intermediate_dim = intermediate_dim
        self.use_layer_norm = use_layer_norm
        self.activation = activation

    def build(self, inputs_shape):
        width = inputs_shape[-1]
        self.seeds = self.add_weight(name="seeds", shape=(self.num_seeds, width), initializer="glorot_uniform")
        self.row_feed_forward = FeedForward(
            self.intermediate_dim or width, activation=self.activation, dtype=self.dtype_policy, name="rff"
        )
        self.row_feed_forward.build(inputs_shape)
        self.pool = MAB(
            self.num_heads,
            intermediate_dim=self.intermediate_dim,
            use_layer_norm=self.use_layer_norm,
            activation=self.activation,
            dtype=self.dtype_policy,
            name="pool",
        )
        self.pool.build((inputs_shape[0], self.num_seeds, width), inputs_shape)
        self.built = True

    def call(self, inputs, mask=None):
        batch = keras.ops.shape(inputs)[0]
        seeds = keras.ops.broadcast_to(
            keras.ops.cast(self.seeds, inputs.dtype)[None], (batch, self.num_seeds, inputs.shape[-1])
        )
        return self.pool(seeds, self.row_feed_forward(inputs), value_mask=mask)

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, inputs_shape):
        return (inputs_shape[0], self.num_seeds, inputs_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            num_seeds=self.num_seeds,
            intermediate_dim=self.intermediate_dim,
            use_layer_norm=self.use_layer_norm,
            activation=self.activation,
        )
        return config
