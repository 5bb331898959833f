"""A pattern per group of heads (Child et al. 2019; Longformer; BlockBERT)."""

import keras
from keras import ops

from keras_tfam.layers.attention.patterns.attention_pattern import AttentionPattern
from keras_tfam.layers.attention.patterns.union_pattern import _bound


@keras.saving.register_keras_serializable(package="keras_tfam")
class HeadPatterns(AttentionPattern):
    """Head group `g` attends with `patterns[g]`.

    The heads are split into `len(patterns)` equal, consecutive groups:
    with `N` heads and `P` patterns, head `h` uses `patterns[h // (N / P)]`
    (`N` must be a multiple of `P`). This is the Sparse Transformer's
    factorised heads (Child et al. 2019, section 4.3: one subset per head),
    Longformer's per-head dilations and BlockBERT's per-head permutations.

    Args:
        patterns: a non-empty list of `AttentionPattern`s (or their configs),
            each for all heads alike.

    Example:

    >>> pattern = HeadPatterns([Strided(32, subset=1), Strided(32, subset=2)])
    >>> attention = MultiHeadAttention(8, 64, pattern=pattern)  # heads 0-3: A(1), heads 4-7: A(2)
    """

    def __init__(self, patterns):
        from keras_tfam.layers.attention.patterns.registry import get_pattern

        if not isinstance(patterns, (list, tuple)) or not patterns:
            raise ValueError(f"`patterns` must be a non-empty list of patterns. Received: patterns={patterns!r}")
        self.patterns = [get_pattern(pattern) for pattern in patterns]
        nested = [pattern for pattern in self.patterns if pattern.head_groups > 1]
        if nested:
            raise ValueError(f"`patterns` must each apply to all heads alike. Received: {nested[0]!r}")
        self.head_groups = len(self.patterns)

    @property
    def lookback(self):
        return _bound([pattern.lookback for pattern in self.patterns])

    @property
    def lookahead(self):
        return _bound([pattern.lookahead for pattern in self.patterns])

    def mask(self, query_positions, key_positions):
        return ops.stack([pattern.mask(query_positions, key_positions) for pattern in self.patterns], axis=-3)

    def check_length(self, length):
        for pattern in self.patterns:
            pattern.check_length(length)

    def get_config(self):
        return {"patterns": [keras.saving.serialize_keras_object(pattern) for pattern in self.patterns]}

    def __repr__(self):
        return f"HeadPatterns([{', '.join(repr(pattern) for pattern in self.patterns)}])"
