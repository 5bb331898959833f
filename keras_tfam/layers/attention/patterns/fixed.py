"""Sparse Transformer fixed attention pattern (Child et al. 2019)."""

import keras
from keras import ops

from keras_tfam.layers.attention.patterns.attention_pattern import AttentionPattern
from keras_tfam.layers.attention.patterns.registry import register_pattern
from keras_tfam.layers.attention.patterns.strided import check_subset
from keras_tfam.utils import check_positive_int


@register_pattern("fixed")
@keras.saving.register_keras_serializable(package="keras_tfam")
class Fixed(AttentionPattern):
    """The fixed pattern of the Sparse Transformer (Child et al. 2019, section 4.2).

    Positions are cut into blocks of `l = stride`. `A(1)`: the keys of the
    query's own block (`floor(j / l) == floor(i / l)`); `A(2)`: the last
    `summary` positions of every block (`j % l >= l - summary`), which
    carry their block's information to later blocks. Causally, every query
    reaches every earlier position in two hops through `O(l + c n / l)`
    keys. Subsets and their combinations as for `Strided`.

    `subset=1` is computed banded; the others as a dense mask.

    Args:
        stride: block length `l`, positive int.
        summary: `c`, summary positions per block, in `[1, stride]`
            (the paper: 8 to 32 for `l` = 128).
        subset: `1`, `2`, or `None` for their union.

    Examples:
        >>> attention = MultiHeadAttention(8, 64, pattern=Fixed(128, summary=8))
    """

    def __init__(self, stride, summary=1, subset=None):
        stride = check_positive_int("stride", stride)
        summary = check_positive_int("summary", summary)
        if summary > stride:
            raise ValueError(
                f"`summary` positions are taken from each block of `stride`={stride} positions, so it cannot exceed "
                f"it. Received: summary={summary}"
            )
        self.stride = stride
        self.summary = summary
        self.subset = check_subset(subset)

    @property
    def lookback(self):
        return self.stride if self.subset == 1 else None

    @property
    def lookahead(self):
        return self.stride - 1 if self.subset == 1 else None

    def _allowed(self, i, j):
        same_block = ops.equal(ops.floor_divide(i, self.stride), ops.floor_divide(j, self.stride))
        summary = ops.greater_equal(ops.mod(j, self.stride), self.stride - self.summary)
        summary = ops.broadcast_to(summary, ops.shape(same_block))
        return {1: same_block, 2: summary, None: ops.logical_or(same_block, summary)}[self.subset]

    def get_config(self):
        return {"stride": self.stride, "summary": self.summary, "subset": self.subset}
