"""Keras layers: attention, positions, normalization and Transformer blocks."""

from keras_tfam.layers.adaptive.adaptive_computation_time import AdaptiveComputationTime
from keras_tfam.layers.adaptive.universal_transformer import UniversalTransformer
from keras_tfam.layers.attention.base_attention import BaseAttention
from keras_tfam.layers.attention.cosine_attention import CosineAttention
from keras_tfam.layers.attention.distance_aware_attention import DistanceAwareAttention, distance_rescale
from keras_tfam.layers.attention.feature_maps import (
    EluFeatureMap,
    FeatureMap,
    PositiveRandomFeatures,
    RandomFeatureMap,
    TrigonometricRandomFeatures,
)
from keras_tfam.layers.attention.linear_attention import LinearAttention
from keras_tfam.layers.attention.linformer_attention import LinformerAttention
from keras_tfam.layers.attention.lsh_attention import LSHAttention
from keras_tfam.layers.attention.memorizing_attention import MemorizingAttention
from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention
from keras_tfam.layers.attention.performer_attention import PerformerAttention
from keras_tfam.layers.attention.random_feature_attention import RandomFeatureAttention
from keras_tfam.layers.attention.routing_attention import RoutingAttention
from keras_tfam.layers.blocks.feed_forward import FeedForward
from keras_tfam.layers.blocks.gru_gate import GRUGate
from keras_tfam.layers.blocks.reversible_block import ReversibleBlock
from keras_tfam.layers.blocks.reversible_stack import ReversibleStack
from keras_tfam.layers.blocks.transformer_decoder_block import TransformerDecoderBlock
from keras_tfam.layers.blocks.transformer_encoder_block import TransformerEncoderBlock
from keras_tfam.layers.blocks.transformer_xl_block import TransformerXLBlock
from keras_tfam.layers.core.dense import Dense
from keras_tfam.layers.embedding.tied_embedding import TiedEmbedding
from keras_tfam.layers.memory.compressive_memory import CompressiveMemory
from keras_tfam.layers.normalization.get_norm import get_norm
from keras_tfam.layers.normalization.rms_norm import RMSNorm
from keras_tfam.layers.normalization.scale_norm import ScaleNorm
from keras_tfam.layers.perceiver.cross_attention_block import CrossAttentionBlock
from keras_tfam.layers.perceiver.perceiver_decoder import PerceiverDecoder
from keras_tfam.layers.perceiver.perceiver_encoder import PerceiverEncoder
from keras_tfam.layers.position.adaptive_span import AdaptiveSpan, span_mask
from keras_tfam.layers.position.alibi_bias import ALiBiBias, alibi_slopes
from keras_tfam.layers.position.attention_position_scheme import AttentionPositionScheme, HeadsPositionScheme
from keras_tfam.layers.position.composed_position import ComposedPosition
from keras_tfam.layers.position.position_embedding import PositionEmbedding
from keras_tfam.layers.position.relative_position_bias import RelativePositionBias, relative_position_buckets
from keras_tfam.layers.position.rotary_embedding import RotaryEmbedding
from keras_tfam.layers.position.shaw_relative_position import ShawRelativePosition
from keras_tfam.layers.position.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_tfam.layers.position.transformer_xl_position import TransformerXLPosition, sinusoid_encoding
from keras_tfam.layers.set.isab import ISAB
from keras_tfam.layers.set.mab import MAB
from keras_tfam.layers.set.pma import PMA
from keras_tfam.layers.set.sab import SAB

__all__ = [
    "ISAB",
    "MAB",
    "PMA",
    "SAB",
    "ALiBiBias",
    "AdaptiveComputationTime",
    "AdaptiveSpan",
    "AttentionPositionScheme",
    "BaseAttention",
    "ComposedPosition",
    "CompressiveMemory",
    "CosineAttention",
    "CrossAttentionBlock",
    "Dense",
    "DistanceAwareAttention",
    "EluFeatureMap",
    "FeatureMap",
    "FeedForward",
    "GRUGate",
    "HeadsPositionScheme",
    "LSHAttention",
    "LinearAttention",
    "LinformerAttention",
    "MemorizingAttention",
    "MultiHeadAttention",
    "PerceiverDecoder",
    "PerceiverEncoder",
    "PerformerAttention",
    "PositionEmbedding",
    "PositiveRandomFeatures",
    "RMSNorm",
    "RandomFeatureAttention",
    "RandomFeatureMap",
    "RelativePositionBias",
    "ReversibleBlock",
    "ReversibleStack",
    "RotaryEmbedding",
    "RoutingAttention",
    "ScaleNorm",
    "ShawRelativePosition",
    "SinusoidalPositionEncoding",
    "TiedEmbedding",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
    "TransformerXLBlock",
    "TransformerXLPosition",
    "TrigonometricRandomFeatures",
    "UniversalTransformer",
    "alibi_slopes",
    "distance_rescale",
    "get_norm",
    "relative_position_buckets",
    "sinusoid_encoding",
    "span_mask",
]
