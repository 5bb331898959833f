"""A pattern per group of heads (Child et al. 2019; Longformer; BlockBERT)."""

import keras
from keras import ops

from keras_tfam.layers.attention.patterns.pattern_combination import PatternCombination
from keras_tfam.layers.attention.patterns.registry import register_pattern


@register_pattern("per_head")
@keras.saving.register_keras_serializable(package="keras_tfam")
class HeadPatterns(PatternCombination):
    """Head group `g` attends with `patterns[g]`.

    The heads are split into `len(patterns)` equal, consecutive groups:
    with `N` heads and `P` patterns, head `h` uses `patterns[h // (N / P)]`
    (`N` must be a multiple of `P`). This is the Sparse Transformer's
    factorised heads (Child et al. 2019, section 4.3: one subset per head),
    Longformer's per-head dilations and BlockBERT's per-head permutations.

    Args:
        patterns: a non-empty list of `AttentionPattern`s (or their configs),
            each for all heads alike.

    Examples:
        >>> pattern = HeadPatterns([Strided(32, subset=1), Strided(32, subset=2)])
        >>> attention = MultiHeadAttention(8, 64, pattern=pattern)  # heads 0-3: A(1), heads 4-7: A(2)
    """

    def __init__(self, patterns):
        super().__init__(patterns)
        nested = [pattern for pattern in self.patterns if pattern.head_groups > 1]
        if nested:
            raise ValueError(f"`patterns` must each apply to all heads alike. Received: {nested[0]!r}")
        self.head_groups = len(self.patterns)

    def mask(self, query_positions, key_positions):
        return ops.stack([pattern.mask(query_positions, key_positions) for pattern in self.patterns], axis=-3)
