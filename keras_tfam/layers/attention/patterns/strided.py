"""Sparse Transformer strided attention pattern (Child et al. 2019)."""

import keras
from keras import ops

from keras_tfam.layers.attention.patterns.attention_pattern import AttentionPattern
from keras_tfam.layers.attention.patterns.registry import register_pattern
from keras_tfam.utils import check_positive_int, is_integer

SUBSETS = (None, 1, 2)


def check_subset(subset):
    """`subset` as `None`, `1` or `2` (any integer type); a `ValueError` otherwise (`True` and `1.0` too)."""
    if subset is not None and not (is_integer(subset) and subset in SUBSETS):
        raise ValueError(f"`subset` must be one of {SUBSETS} (None: both). Received: subset={subset!r}")
    return None if subset is None else int(subset)


@register_pattern("strided")
@keras.saving.register_keras_serializable(package="keras_tfam")
class Strided(AttentionPattern):
    """The strided pattern of the Sparse Transformer (Child et al. 2019, section 4.2).

    With stride `l`, two subsets of keys: `A(1)`, the previous `l`
    positions (`|i - j| <= l`), and `A(2)`, every `l`-th position
    (`(i - j) % l == 0`). With a causal mask and `l ~ sqrt(n)` every
    query reaches every earlier position in two hops through
    `O(sqrt(n))` keys each. The paper combines the subsets three ways:
    one subset per layer, interleaved (`interleave([Strided(l, subset=1),
    Strided(l, subset=2)], num_layers)`), both in one merged head
    (`subset=None`, the default), or one subset per group of heads
    (`HeadPatterns([Strided(l, subset=1), Strided(l, subset=2)])`).

    `subset=1` is computed banded; the others as a dense mask.

    Args:
        stride: `l`, positive int (the paper: about `sqrt(n)`).
        subset: `1`, `2`, or `None` for their union.

    Examples:
        >>> attention = MultiHeadAttention(4, 8, pattern=Strided(8))
        >>> attention(keras.random.normal((2, 64, 32)), use_causal_mask=True).shape
        (2, 64, 32)
    """

    def __init__(self, stride, subset=None):
        self.stride = check_positive_int("stride", stride)
        self.subset = check_subset(subset)

    @property
    def lookback(self):
        return self.stride + 1 if self.subset == 1 else None

    @property
    def lookahead(self):
        return self.stride if self.subset == 1 else None

    def _allowed(self, i, j):
        distance = i - j
        local = ops.less_equal(ops.abs(distance), self.stride)
        strided = ops.equal(ops.mod(distance, self.stride), 0)
        return {1: local, 2: strided, None: ops.logical_or(local, strided)}[self.subset]

    def get_config(self):
        return {"stride": self.stride, "subset": self.subset}
