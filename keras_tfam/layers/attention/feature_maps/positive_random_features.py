"""FAVOR+ positive random features (Choromanski et al. 2021, Performer)."""

import math

import keras
from keras import ops

from keras_tfam.layers.attention.feature_maps.random_feature_map import MAX_EXPONENT, RandomFeatureMap


@keras.saving.register_keras_serializable(package="keras_tfam")
class PositiveRandomFeatures(RandomFeatureMap):
    """Positive random features of the softmax kernel (FAVOR+, Performer).

    Choromanski et al. 2021 ("Rethinking Attention with Performers"), Lemma 1:
    `phi(x) = exp(w_i . x - |x|^2 / 2) / sqrt(m)` for `i = 1..m` gives an
    unbiased estimator `E[phi(x) . phi(y)] = exp(x . y)`, with positive
    features, so the attention normaliser never vanishes, and a variance
    that goes to zero where `exp(x . y)` does. Heads are scaled by
    `H^(-1/4)` first, so `phi(q) . phi(k)` estimates the softmax kernel
    `exp(q . k / sqrt(H))`. Orthogonal `w_i` (the default) lower the error.

    Stabilised for float32 without a maximum over keys (the reference
    implementation subtracts one per call), so that a full pass and
    token-by-token decoding, whose running state sums the keys of many
    calls, weigh every key alike. A key exponent `w_i . k - |k|^2 / 2` never
    exceeds a bound that depends on `w_i` only, `|w_i|^2 / 2` (reached at
    `k = w_i`), and key exponents are clipped at 60 (float32 range). Query
    features are rescaled by a factor constant per query, which cancels in
    attention: the one that puts the largest product `phi(q)_i phi(k)_i`
    any key could reach at `e^60`. Keys of large norm, whose features are
    near `exp(-|k|^2 / 2)`, then stay far above the attention's `epsilon`
    (rescaling queries to a largest feature of 1 sank them below it: all-zero
    outputs). Only a query whose keys all lie ~70 nats below that bound
    still gets zeros; that needs a maximum over keys kept in the state.

    Args:
        num_features: `m` (Performer uses `H log H`, 256 for `H = 64`).
        orthogonal, redraw, seed: see `RandomFeatureMap`.

    Call arguments:
        inputs: `(B, T, N, H)` query or key heads.
        query: whether `inputs` are queries.

    Returns:
        `(B, T, N, m)` float32, positive.

    Examples:
        >>> phi = PositiveRandomFeatures(num_features=256, seed=0)
        >>> phi(keras.random.normal((2, 5, 4, 64))).shape
        (2, 5, 4, 256)
    """

    def output_dim(self, input_dim):
        return self.num_features

    def call(self, inputs, query=False):
        x = ops.cast(inputs, "float32") * inputs.shape[-1] ** -0.25
        exponent = self._project(x) - 0.5 * ops.sum(ops.square(x), axis=-1, keepdims=True)
        if query:
            # Bound of each key exponent: max over k of w_i . k - |k|^2 / 2, and the clip below.
            bound = ops.minimum(0.5 * ops.sum(ops.square(self.projection.value), axis=-1), MAX_EXPONENT)  # (m,)
            largest = ops.max(exponent + bound, axis=-1, keepdims=True)  # largest product exponent, per query
            exponent = exponent - ops.stop_gradient(largest - MAX_EXPONENT)
        else:
            exponent = ops.minimum(exponent, MAX_EXPONENT)
        return ops.exp(exponent) / math.sqrt(self.num_features)
