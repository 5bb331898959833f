"""Performer attention: FAVOR+ (Choromanski et al. 2021)."""

import keras

from keras_tfam.layers.attention.feature_maps.positive_random_features import PositiveRandomFeatures
from keras_tfam.layers.attention.feature_maps.trigonometric_random_features import TrigonometricRandomFeatures
from keras_tfam.layers.attention.linear_attention import LinearAttention
from keras_tfam.layers.attention.registry import register_attention

FEATURES = {"positive": PositiveRandomFeatures, "trigonometric": TrigonometricRandomFeatures}


@register_attention("performer")
@keras.saving.register_keras_serializable(package="keras_tfam")
class PerformerAttention(LinearAttention):
    """Softmax attention estimated with random features, in linear time (Performer).

    Choromanski et al. 2021 ("Rethinking Attention with Performers"):
    `exp(q . k / sqrt(H)) ~ phi(q) . phi(k)` with FAVOR+ positive orthogonal
    random features (`features="positive"`, `PositiveRandomFeatures`) or the
    trigonometric ones (`"trigonometric"`, `TrigonometricRandomFeatures`),
    then `LinearAttention` with that feature map: the causal parallel form
    (chunked prefix sums), the O(1) recurrent cache `(B, N, M, Hv + 1)` and
    the windowed form are LinearAttention's. The random projections are a
    seeded non-trainable weight, shared by the heads, saved with the model,
    and redrawn every `redraw` training calls when set (the paper redraws
    during training).

    Args:
        num_heads, key_dim: and the rest of `LinearAttention`'s arguments
            (`feature_map` excepted).
        num_features: random features `m` per head (the paper: `H log H`).
        features: `"positive"` (FAVOR+) or `"trigonometric"`.
        orthogonal: orthogonal random features (the "O" of FAVOR+).
        redraw: redraw the features every this many training calls, or
            `None` (never).
        seed: seed of the draws; `None` picks one (kept in the config).

    Call arguments:
        As `LinearAttention`.

    Returns:
        `(B, T, output_dim)`, or `(outputs, cache)` with a cache.

    Examples:
        >>> attention = PerformerAttention(num_heads=8, key_dim=64, num_features=256, seed=0)
        >>> attention(keras.random.normal((2, 4096, 512)), use_causal_mask=True).shape
        (2, 4096, 512)
    """

    example_options = ({"num_features": 16, "seed": 0}, {"num_features": 8, "features": "trigonometric", "seed": 1})

    def __init__(
        self,
        num_heads,
        key_dim,
        num_features=256,
        features="positive",
        orthogonal=True,
        redraw=None,
        seed=None,
        **kwargs,
    ):
        if features not in FEATURES:
            raise ValueError(f"`features` must be one of {tuple(FEATURES)}. Received: features={features!r}")
        feature_map = FEATURES[features](num_features, orthogonal=orthogonal, redraw=redraw, seed=seed, name="phi")
        super().__init__(num_heads, key_dim, feature_map=feature_map, **kwargs)
        self.num_features = num_features
        self.features = features
        self.orthogonal = orthogonal
        self.redraw = redraw
        self.seed = feature_map.seed

    def get_config(self):
        config = super().get_config()
        del config["feature_map"]
        config.update(
            num_features=self.num_features,
            features=self.features,
            orthogonal=self.orthogonal,
            redraw=self.redraw,
            seed=self.seed,
        )
        return config
