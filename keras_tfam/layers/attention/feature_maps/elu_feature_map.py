"""The elu + 1 feature map of Katharopoulos et al. 2020."""

import keras
from keras import ops

from keras_tfam.layers.attention.feature_maps.feature_map import FeatureMap


@keras.saving.register_keras_serializable(package="keras_tfam")
class EluFeatureMap(FeatureMap):
    """`phi(x) = elu(x) + 1` ("Transformers are RNNs", Katharopoulos et al. 2020).

    Positive, deterministic, no weights; as many features as the head has
    dimensions. `LinearAttention(feature_map="elu")` uses it.

    Call arguments:
        inputs: `(B, T, N, H)`.
        query: unused (queries and keys share the map).

    Returns:
        `(B, T, N, H)` float32.

    Args:
        **kwargs: the arguments of `keras.layers.Layer` (`name`, `dtype`, ...).

    Examples:
        >>> EluFeatureMap()(keras.random.normal((2, 5, 4, 8))).shape
        (2, 5, 4, 8)
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.built = True

    def output_dim(self, input_dim):
        return input_dim

    def call(self, inputs, query=False):
        return ops.elu(ops.cast(inputs, "float32")) + 1.0
