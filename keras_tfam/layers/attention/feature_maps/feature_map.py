"""Base class of the feature maps `phi` of `LinearAttention`."""

import keras


@keras.saving.register_keras_serializable(package="keras_tfam")
class FeatureMap(keras.layers.Layer):
    """A feature map `phi` with `phi(q) . phi(k)` standing for the attention kernel.

    `LinearAttention` computes `phi(Q) (phi(K)^T V) / phi(Q) (phi(K)^T 1)`
    with it, in its causal parallel form, its recurrent cache and its
    windowed form alike. A subclass implements `call` and `output_dim`;
    one whose map is random overrides `advance`, which the attention calls
    once per call (random-feature redraws).

    Query features may drop a factor that is constant per query (a
    numerical stabiliser): it cancels between the numerator and the
    normaliser. Key features may not, since the keys of one sum come from
    different calls (a cache).

    Call arguments:
        inputs: `(B, T, N, H)` query or key heads, float32.
        query: whether `inputs` are queries.

    Returns:
        `(B, T, N, output_dim(H))` float32 features.

    Args:
        **kwargs: the arguments of `keras.layers.Layer` (`name`, `dtype`, ...).

    Examples:
        >>> class Squared(FeatureMap):
        ...     # `phi(x) = x^2`: positive features of the head's size.
        ...     def call(self, inputs, query=True):
        ...         return keras.ops.square(inputs)
        >>> attention = LinearAttention(4, 8, feature_map=Squared())
        >>> attention(keras.random.normal((2, 6, 32)), use_causal_mask=True).shape
        (2, 6, 32)
    """

    # Whether phi(q) . phi(k) >= 0, so the normaliser cannot vanish.
    positive = True

    def output_dim(self, input_dim):
        """The number of features of an `input_dim`-sized head."""
        raise NotImplementedError

    def advance(self, training=None):
        """Called once per attention call: a random map may redraw here."""

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim(input_shape[-1]),)
