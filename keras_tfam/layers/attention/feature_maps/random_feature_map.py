"""Base class of the random feature maps (Performer, RFA)."""

import keras
from keras import ops

from keras_tfam.layers.attention.feature_maps.feature_map import FeatureMap
from keras_tfam.layers.attention.seeded_draws import SeededDraws, gaussian_matrix
from keras_tfam.utils import check_positive_int

# exp() of larger exponents overflows float32 once summed; key exponents are clipped here.
MAX_EXPONENT = 60.0


@keras.saving.register_keras_serializable(package="keras_tfam")
class RandomFeatureMap(SeededDraws, FeatureMap):
    """A feature map through `num_features` random projections `w_i ~ N(0, I_H)`.

    The projections are a non-trainable `(num_features, H)` weight drawn
    from `seed` (saved with the model), orthogonal in blocks of `H` when
    `orthogonal`, redrawn every `redraw` training calls when set (see
    `SeededDraws`). Subclasses implement `call` with `self.projection`.

    Args:
        num_features: number of random projections `m`.
        orthogonal: orthogonal random features (lower variance).
        redraw: redraw the projections every this many training calls,
            or `None` (never).
        seed: seed of the draws; `None` picks one (kept in the config).

    Examples:
        >>> features = PositiveRandomFeatures(num_features=16, seed=0)  # a RandomFeatureMap
        >>> features(keras.random.normal((2, 5, 4, 8))).shape
        (2, 5, 4, 16)
    """

    def __init__(self, num_features, orthogonal=True, redraw=None, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.num_features = check_positive_int("num_features", num_features)
        self.orthogonal = bool(orthogonal)
        self._init_draws(seed, redraw)

    def build(self, input_shape):
        dim = input_shape[-1]
        self.projection = self._build_draws(
            "projection",
            (self.num_features, dim),
            lambda seed: gaussian_matrix(self.num_features, dim, seed, self.orthogonal),
        )
        self.built = True

    def advance(self, training=None):
        self._current_draw(training)

    def _project(self, x):
        """`x . w_i` for every projection: `(..., H)` -> `(..., m)`."""
        return ops.matmul(x, ops.transpose(self.projection.value))

    def get_config(self):
        config = super().get_config()
        config.update(num_features=self.num_features, orthogonal=self.orthogonal, redraw=self.redraw, seed=self.seed)
        return config
