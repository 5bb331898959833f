"""ALiBi: attention with linear biases (Press et al. 2022)."""

import math

import keras
import numpy as np
from keras import ops

from keras_tfam.layers.position.attention_position_scheme import AttentionPositionScheme
from keras_tfam.ops.masks import relative_distance
from keras_tfam.utils import check_positive_int


def alibi_slopes(num_heads):
    """Head slopes of Press et al.: a geometric sequence starting at `2^(-8/n)`.

    For `n` a power of two the slopes are `2^(-8i/n)`, `i = 1..n`. Otherwise
    the paper takes the slopes of the closest smaller power of two `p` and
    adds every other slope of `2p` (the reference implementation's rule).
    """

    def power_of_two_slopes(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if num_heads & (num_heads - 1) == 0:
        return np.asarray(power_of_two_slopes(num_heads), dtype="float32")
    closest = 2 ** int(math.floor(math.log2(num_heads)))
    extra = power_of_two_slopes(2 * closest)[0::2][: num_heads - closest]
    return np.asarray(power_of_two_slopes(closest) + extra, dtype="float32")


@keras.saving.register_keras_serializable(package="keras_tfam")
class ALiBiBias(AttentionPositionScheme):
    """Linear distance penalty added to attention scores, one slope per head.

    Implements Press et al. 2022 ("Train Short, Test Long"): head `h` adds
    `-m_h * |i - j|` to the score of query position `i` and key position `j`
    (for causal attention this is the paper's `m_h * (j - i)`). No weights;
    extrapolates to any length.

    Args:
        num_heads: number of attention heads; fixes the slopes.

    Call arguments:
        attention_scores: `(B, N, T, S)` scores.
        query_offset: absolute position of the first query (cache index).

    Returns:
        `attention_scores` plus the bias, float32.

    Examples:
        >>> alibi = ALiBiBias(num_heads=8)
        >>> attention = MultiHeadAttention(8, 64, position=alibi)
    """

    def __init__(self, num_heads, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        self.num_heads = num_heads
        self.slopes = alibi_slopes(num_heads)
        self.built = True

    def attention_bias(self, query_positions, key_positions):
        distance = relative_distance(query_positions, key_positions)
        distance = ops.cast(ops.abs(distance), "float32")
        slopes = ops.convert_to_tensor(self.slopes)[:, None, None]  # [N, 1, 1]
        return ops.expand_dims(-slopes * distance, 0)  # [1, N, T, S]

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads)
        return config
