"""Feature maps of `LinearAttention`: deterministic (elu) and random (Performer, RFA)."""

from keras_tfam.layers.attention.feature_maps.elu_feature_map import EluFeatureMap
from keras_tfam.layers.attention.feature_maps.feature_map import FeatureMap
from keras_tfam.layers.attention.feature_maps.positive_random_features import PositiveRandomFeatures
from keras_tfam.layers.attention.feature_maps.random_feature_map import RandomFeatureMap
from keras_tfam.layers.attention.feature_maps.trigonometric_random_features import TrigonometricRandomFeatures

__all__ = [
    "EluFeatureMap",
    "FeatureMap",
    "PositiveRandomFeatures",
    "RandomFeatureMap",
    "TrigonometricRandomFeatures",
]
