"""Dilated sliding-window attention pattern (Longformer)."""

import keras
from keras import ops

from keras_tfam.layers.attention.patterns.attention_pattern import AttentionPattern
from keras_tfam.layers.attention.patterns.registry import register_pattern
from keras_tfam.utils import check_positive_int


@register_pattern("dilated_window")
@keras.saving.register_keras_serializable(package="keras_tfam")
class DilatedWindow(AttentionPattern):
    """A sliding window with gaps: `window` keys, `dilation` positions apart.

    Longformer's dilated sliding window (Beltagy et al. 2020, section 3.1):
    query `i` attends to `i + k * dilation` for `|k| < window`, i.e.
    `(i - j) % dilation == 0` and `|i - j| < window * dilation`, a
    receptive field `dilation` times wider for the same number of keys
    (Longformer gives different heads different dilations: combine with
    `HeadPatterns`). `dilation=1` is `SlidingWindow(window)`. Computed
    banded over the `(window - 1) * dilation + 1` positions it spans.

    Args:
        window: keys on each side, the query included (positive int).
        dilation: distance between attended keys (positive int).

    Examples:
        >>> windows = [SlidingWindow(64), DilatedWindow(64, 2), DilatedWindow(64, 4), DilatedWindow(64, 8)]
        >>> pattern = HeadPatterns(windows)
    """

    def __init__(self, window, dilation=2):
        self.window = check_positive_int("window", window)
        self.dilation = check_positive_int("dilation", dilation)

    @property
    def lookback(self):
        return (self.window - 1) * self.dilation + 1

    @property
    def lookahead(self):
        return (self.window - 1) * self.dilation

    def _allowed(self, i, j):
        distance = ops.abs(i - j)
        on_grid = ops.equal(ops.mod(distance, self.dilation), 0)
        return ops.logical_and(on_grid, ops.less(distance, (self.window - 1) * self.dilation + 1))

    def get_config(self):
        return {"window": self.window, "dilation": self.dilation}
