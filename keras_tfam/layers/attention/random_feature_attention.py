"""Random feature attention, optionally gated (Peng et al. 2021, RFA)."""

import keras

from keras_tfam.layers.attention.feature_maps.trigonometric_random_features import TrigonometricRandomFeatures
from keras_tfam.layers.attention.linear_attention import LinearAttention
from keras_tfam.layers.attention.registry import register_attention


@register_attention("rfa")
@keras.saving.register_keras_serializable(package="keras_tfam")
class RandomFeatureAttention(LinearAttention):
    """RFA: attention through random Fourier features, with an optional gate (Peng et al. 2021).

    "Random Feature Attention" (ICLR 2021): queries and keys are
    l2-normalised and mapped by `phi(x) = [sin(w . x / sigma),
    cos(w . x / sigma)] / sqrt(m)` (`TrigonometricRandomFeatures(normalize=
    True)`, `sigma` learned per head), then
    `RFA(q) = phi(q) . S / phi(q) . z` with `S = sum phi(k) v^T` and
    `z = sum phi(k)`: `LinearAttention` with that feature map, its causal
    parallel form and O(1) recurrent cache.

    With `gating=True` (RFA-Gate, causal only) a learned scalar gate per
    head and position, `g_t = sigmoid(W_g x_t + b_g)` of the key input
    `x_t`, adds a recency bias: `S_t = g_t S_{t-1} + (1 - g_t) phi(k_t) v_t^T`,
    `z_t = g_t z_{t-1} + (1 - g_t) phi(k_t)`. The parallel form weights term
    `j` by `g_{j+1} ... g_t` (decay matrices in chunks, decayed prefix sums
    across them), equal to the recurrence the cache runs. A gated layer has
    no windowed form (its state already forgets).

    Args:
        num_heads, key_dim: and the rest of `LinearAttention`'s arguments
            (`feature_map` excepted).
        num_features: random frequencies `m` per head (`2m` features).
        gating: RFA-Gate's gated recurrence.
        orthogonal, redraw, seed: of the random features (see
            `PerformerAttention`).

    Call arguments:
        As `LinearAttention`; with `gating`, the attention must be causal
        (`use_causal_mask=True` or a cache) and `window` is refused.

    Returns:
        `(B, T, output_dim)`, or `(outputs, cache)` with a cache.

    Examples:
        >>> attention = RandomFeatureAttention(num_heads=4, key_dim=64, num_features=128, gating=True, seed=0)
        >>> attention(keras.random.normal((2, 1024, 256)), use_causal_mask=True).shape
        (2, 1024, 256)
    """

    example_options = ({"num_features": 8, "seed": 0}, {"num_features": 8, "gating": True, "seed": 1})

    def __init__(
        self, num_heads, key_dim, num_features=128, gating=False, orthogonal=True, redraw=None, seed=None, **kwargs
    ):
        feature_map = TrigonometricRandomFeatures(
            num_features, normalize=True, orthogonal=orthogonal, redraw=redraw, seed=seed, name="phi"
        )
        super().__init__(num_heads, key_dim, feature_map=feature_map, **kwargs)
        self.num_features = num_features
        self.gating = bool(gating)
        self.orthogonal = orthogonal
        self.redraw = redraw
        self.seed = feature_map.seed

    def build(self, query_shape, value_shape=None, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        if self.gating:
            key_shape = key_shape or value_shape or query_shape
            self.gate_dense = keras.layers.Dense(
                self.num_heads, kernel_initializer=self.kernel_initializer, dtype=self.dtype_policy, name="gate"
            )
            self.gate_dense.build(key_shape)

    @property
    def is_gated(self):
        return self.gating

    def _gate_logits(self, key):
        return self.gate_dense(key) if self.gating else None

    def get_config(self):
        config = super().get_config()
        del config["feature_map"]
        config.update(
            num_features=self.num_features,
            gating=self.gating,
            orthogonal=self.orthogonal,
            redraw=self.redraw,
            seed=self.seed,
        )
        return config
