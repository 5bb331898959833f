"""Trigonometric random features (Rahimi & Recht 2007; Performer's SM-trig; RFA)."""

import math

import keras
from keras import ops

from keras_tfam.layers.attention.feature_maps.random_feature_map import MAX_EXPONENT, RandomFeatureMap


@keras.saving.register_keras_serializable(package="keras_tfam")
class TrigonometricRandomFeatures(RandomFeatureMap):
    """Random Fourier features `[sin(w_i . x), cos(w_i . x)]` of the softmax kernel.

    With `normalize=False` (Choromanski et al. 2021, the trigonometric
    softmax estimator): `phi(x) = exp(|x|^2 / 2) / sqrt(m) [sin(w . x),
    cos(w . x)]`, unbiased for `exp(x . y)` since `E[cos(w . (x - y))] =
    exp(-|x - y|^2 / 2)`; heads are scaled by `H^(-1/4)` to estimate
    `exp(q . k / sqrt(H))`. The features take both signs, so the attention
    normaliser can vanish or turn negative, and the error stays large where
    the kernel is small: where `q . k` is very negative, positive features
    (`PositiveRandomFeatures`) are far more accurate.

    With `normalize=True` it is RFA (Peng et al. 2021, "Random Feature
    Attention"): queries and keys are l2-normalised and scaled by a learned
    per-head factor `1 / sigma` (the paper learns the variance of the random
    features), so `exp(|x|^2 / 2)` is the same for every key and cancels:
    `phi(x) = [sin(w . x), cos(w . x)] / sqrt(m)`, bounded.

    Query features drop `exp(|q|^2 / 2)`, constant per query; key exponents
    are clipped at 60.

    Args:
        num_features: number of random frequencies `m` (`2m` features).
        normalize: RFA's normalised inputs with a learned scale.
        orthogonal, redraw, seed: see `RandomFeatureMap`.

    Call arguments:
        inputs: `(B, T, N, H)` query or key heads.
        query: whether `inputs` are queries.

    Returns:
        `(B, T, N, 2m)` float32.

    Examples:
        >>> phi = TrigonometricRandomFeatures(num_features=64, normalize=True, seed=0)
        >>> phi(keras.random.normal((2, 5, 4, 32))).shape
        (2, 5, 4, 128)
    """

    positive = False

    def __init__(self, num_features, normalize=False, orthogonal=True, redraw=None, seed=None, **kwargs):
        super().__init__(num_features, orthogonal=orthogonal, redraw=redraw, seed=seed, **kwargs)
        self.normalize = bool(normalize)

    def build(self, input_shape):
        super().build(input_shape)
        if self.normalize:
            self.log_scale = self.add_weight(
                name="log_scale", shape=(input_shape[-2],), initializer="zeros", autocast=False, dtype="float32"
            )

    def output_dim(self, input_dim):
        return 2 * self.num_features

    def call(self, inputs, query=False):
        x = ops.cast(inputs, "float32")
        if self.normalize:
            norms = ops.sqrt(ops.sum(ops.square(x), axis=-1, keepdims=True) + 1e-12)
            x = x / norms * ops.exp(self.log_scale.value)[:, None]
        else:
            x = x * x.shape[-1] ** -0.25
        projected = self._project(x)
        features = ops.concatenate([ops.sin(projected), ops.cos(projected)], axis=-1) / math.sqrt(self.num_features)
        if not (self.normalize or query):
            features = features * ops.exp(
                ops.minimum(0.5 * ops.sum(ops.square(x), axis=-1, keepdims=True), MAX_EXPONENT)
            )
        return features

    def get_config(self):
        config = super().get_config()
        config.update(normalize=self.normalize)
        return config
