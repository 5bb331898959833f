"""Sliding-window (local) attention pattern."""

import keras
from keras import ops

from keras_tfam.layers.attention.patterns.attention_pattern import AttentionPattern
from keras_tfam.layers.attention.patterns.registry import register_pattern
from keras_tfam.utils import check_positive_int


@register_pattern("sliding_window")
@keras.saving.register_keras_serializable(package="keras_tfam")
class SlidingWindow(AttentionPattern):
    """Each query attends to the keys less than `window` positions away.

    Local attention of the Image Transformer (Parmar et al. 2018, 1D local),
    Longformer's sliding window (Beltagy et al. 2020), the local layers of
    GPT-3 and GPT-Neo and Mistral's sliding window: `|i - j| < window`;
    with a causal mask, `i - window < j <= i` (the query and the
    `window - 1` keys before it). Computed banded, in `O(T * window)`
    time and memory; causal decoding needs a ring cache of `window` slots.

    Args:
        window: positive int.

    Examples:
        >>> attention = MultiHeadAttention(4, 8, pattern=SlidingWindow(16))
        >>> x = keras.random.normal((2, 64, 32))
        >>> attention(x, use_causal_mask=True).shape  # O(T * 16) scores
        (2, 64, 32)
    """

    def __init__(self, window):
        self.window = check_positive_int("window", window)

    @property
    def lookback(self):
        return self.window

    @property
    def lookahead(self):
        return self.window - 1

    def _allowed(self, i, j):
        return ops.less(ops.abs(i - j), self.window)

    def get_config(self):
        return {"window": self.window}
