"""Base of the patterns that combine other patterns (union, per head)."""

import keras

from keras_tfam.layers.attention.patterns.attention_pattern import AttentionPattern
from keras_tfam.layers.attention.patterns.registry import get_pattern


class PatternCombination(AttentionPattern):
    """Holds a non-empty list of patterns; bounded only where every one of them is.

    Subclasses (`UnionPattern`, `HeadPatterns`) say how the masks combine.

    Args:
        patterns: a non-empty list of `AttentionPattern`s (or their configs,
            see `get_pattern`).

    Examples:
        >>> union = UnionPattern([SlidingWindow(2), GlobalTokens(1)])  # a PatternCombination
        >>> # A window of 2 either side, and token 0 global: it attends every key and every query attends it.
        >>> keras.ops.convert_to_numpy(union.mask(np.arange(4), np.arange(4))).astype(int)
        array([[1, 1, 1, 1],
               [1, 1, 1, 0],
               [1, 1, 1, 1],
               [1, 0, 1, 1]])
    """

    def __init__(self, patterns):
        if not isinstance(patterns, (list, tuple)) or not patterns:
            raise ValueError(f"`patterns` must be a non-empty list of patterns. Received: patterns={patterns!r}")
        self.patterns = [get_pattern(pattern) for pattern in patterns]

    @property
    def lookback(self):
        return _bound([pattern.lookback for pattern in self.patterns])

    @property
    def lookahead(self):
        return _bound([pattern.lookahead for pattern in self.patterns])

    @property
    def depends_on_length(self):
        return any(pattern.depends_on_length for pattern in self.patterns)

    def check_length(self, length):
        for pattern in self.patterns:
            pattern.check_length(length)

    def get_config(self):
        return {"patterns": [keras.saving.serialize_keras_object(pattern) for pattern in self.patterns]}

    def __repr__(self):
        return f"{type(self).__name__}([{', '.join(repr(pattern) for pattern in self.patterns)}])"


def _bound(values):
    return None if any(value is None for value in values) else max(values)
