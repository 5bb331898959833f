"""Set attention block (Lee et al. 2019)."""

import keras

from keras_tfam.layers.set.mab import MAB


@keras.saving.register_keras_serializable(package="keras_tfam")
class SAB(MAB):
    """`SAB(X) = MAB(X, X)`: self-attention among the elements of a set.

    Permutation-equivariant (Lee et al. 2019, eq. 8); O(n^2) in the set size.
    Arguments as `MAB`.

    Call arguments:
        inputs: `(B, n, d)`.
        mask: `(B, n)` padding mask (default: the Keras mask of `inputs`).

    Args:
        num_heads: attention heads.
        intermediate_dim: width of the feed-forward layer; default the
            input's.
        use_layer_norm: LayerNorm after each residual (the paper's default).
        activation: of the feed-forward layer.
        **kwargs: the arguments of `keras.layers.Layer`.

    Examples:
        >>> SAB(4)(keras.random.normal((2, 10, 32))).shape
        (2, 10, 32)
    """

    def build(self, inputs_shape):
        super().build(inputs_shape, inputs_shape)

    def call(self, inputs, mask=None):
        return super().call(inputs, inputs, value_mask=mask)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape
