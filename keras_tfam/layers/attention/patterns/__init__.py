"""Attention patterns: which keys each query may attend (sparse, local, global, random)."""

# Each pattern file registers its pattern (`registry.register_pattern`); a new pattern adds its line here.
from keras_tfam.layers.attention.patterns.attention_pattern import AttentionPattern
from keras_tfam.layers.attention.patterns.big_bird import BigBird
from keras_tfam.layers.attention.patterns.blockwise import Blockwise
from keras_tfam.layers.attention.patterns.dilated_window import DilatedWindow
from keras_tfam.layers.attention.patterns.fixed import Fixed
from keras_tfam.layers.attention.patterns.global_tokens import GlobalTokens
from keras_tfam.layers.attention.patterns.head_patterns import HeadPatterns
from keras_tfam.layers.attention.patterns.pattern_combination import PatternCombination
from keras_tfam.layers.attention.patterns.registry import PATTERNS, get_pattern, interleave
from keras_tfam.layers.attention.patterns.sliding_window import SlidingWindow
from keras_tfam.layers.attention.patterns.strided import Strided
from keras_tfam.layers.attention.patterns.union_pattern import UnionPattern

__all__ = [
    "PATTERNS",
    "AttentionPattern",
    "BigBird",
    "Blockwise",
    "DilatedWindow",
    "Fixed",
    "GlobalTokens",
    "HeadPatterns",
    "PatternCombination",
    "SlidingWindow",
    "Strided",
    "UnionPattern",
    "get_pattern",
    "interleave",
]
