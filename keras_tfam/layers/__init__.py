"""Keras layers: attention, positions, normalization and Transformer blocks."""

from keras_tfam.layers.adaptive.adaptive_computation_time import AdaptiveComputationTime
from keras_tfam.layers.adaptive.universal_transformer import UniversalTransformer
from keras_tfam.layers.attention.distance_aware_attention import DistanceAwareAttention, distance_rescale
from keras_tfam.layers.attention.linear_attention import LinearAttention
from keras_tfam.layers.attention.memorizing_attention import MemorizingAttention
from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention
from keras_tfam.layers.blocks.feed_forward import FeedForward
from keras_tfam.layers.blocks.transformer_decoder_block import TransformerDecoderBlock
from keras_tfam.layers.blocks.transformer_encoder_block import TransformerEncoderBlock
from keras_tfam.layers.embedding.tied_embedding import TiedEmbedding
from keras_tfam.layers.normalization.get_norm import get_norm
from keras_tfam.layers.normalization.rms_norm import RMSNorm
from keras_tfam.layers.normalization.scale_norm import ScaleNorm
from keras_tfam.layers.perceiver.cross_attention_block import CrossAttentionBlock
from keras_tfam.layers.perceiver.perceiver_decoder import PerceiverDecoder
from keras_tfam.layers.perceiver.perceiver_encoder import PerceiverEncoder
from keras_tfam.layers.position.alibi_bias import ALiBiBias, alibi_slopes
from keras_tfam.layers.set.isab import ISAB
from keras_tfam.layers.set.mab import MAB
from keras_tfam.layers.set.pma import PMA
from keras_tfam.layers.set.sab import SAB
from keras_tfam.layers.position.attention_position_scheme import AttentionPositionScheme
from keras_tfam.layers.position.position_embedding import PositionEmbedding
from keras_tfam.layers.position.relative_position_bias import (
    RelativePositionBias,
    relative_position_buckets,
)
from keras_tfam.layers.position.rotary_embedding import RotaryEmbedding
from keras_tfam.layers.position.sinusoidal_position_encoding import SinusoidalPositionEncoding

__all__ = [
    "ALiBiBias",
    "AdaptiveComputationTime",
    "DistanceAwareAttention",
    "MemorizingAttention",
    "UniversalTransformer",
    "distance_rescale",
    "CrossAttentionBlock",
    "PerceiverDecoder",
    "PerceiverEncoder",
    "ISAB",
    "MAB",
    "PMA",
    "SAB",
    "AttentionPositionScheme",
    "FeedForward",
    "LinearAttention",
    "MultiHeadAttention",
    "PositionEmbedding",
    "RMSNorm",
    "RelativePositionBias",
    "RotaryEmbedding",
    "ScaleNorm",
    "SinusoidalPositionEncoding",
    "TiedEmbedding",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
    "alibi_slopes",
    "get_norm",
    "relative_position_buckets",
]
