"""Attention layers: `BaseAttention`'s pipeline and one file per kind, each registering itself.

Importing this package registers every kind (`registry.attention_kinds()`);
a new kind adds its import line here.
"""

from keras_tfam.layers.attention.base_attention import BaseAttention
from keras_tfam.layers.attention.cosine_attention import CosineAttention
from keras_tfam.layers.attention.distance_aware_attention import DistanceAwareAttention
from keras_tfam.layers.attention.linear_attention import LinearAttention
from keras_tfam.layers.attention.linformer_attention import LinformerAttention
from keras_tfam.layers.attention.lsh_attention import LSHAttention
from keras_tfam.layers.attention.memorizing_attention import MemorizingAttention
from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention
from keras_tfam.layers.attention.performer_attention import PerformerAttention
from keras_tfam.layers.attention.random_feature_attention import RandomFeatureAttention
from keras_tfam.layers.attention.routing_attention import RoutingAttention

__all__ = [
    "BaseAttention",
    "CosineAttention",
    "DistanceAwareAttention",
    "LSHAttention",
    "LinearAttention",
    "LinformerAttention",
    "MemorizingAttention",
    "MultiHeadAttention",
    "PerformerAttention",
    "RandomFeatureAttention",
    "RoutingAttention",
]
