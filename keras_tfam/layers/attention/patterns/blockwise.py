"""Blockwise attention pattern (Qiu et al. 2020, BlockBERT)."""

import keras
from keras import ops

from keras_tfam.layers.attention.patterns.attention_pattern import AttentionPattern
from keras_tfam.utils import check_positive_int


@keras.saving.register_keras_serializable(package="keras_tfam")
class Blockwise(AttentionPattern):
    """Queries of block `i` attend to the keys of block `pi(i)` only.

    Blockwise self-attention (Qiu et al. 2020, "Blockwise Self-Attention
    for Long Document Understanding"): the sequence is cut into blocks of
    `block_size` positions and a permutation `pi` of `n` blocks maps each
    query block to the key block it sees (BlockBERT gives heads different
    permutations: combine with `HeadPatterns`). Longer sequences repeat the
    permutation every `n` blocks: block `g * n + k` sees `g * n + pi(k)`.
    The identity permutation is block-diagonal attention. Computed banded
    over the blocks a permutation moves across.

    Args:
        block_size: positions per block (positive int); it must divide the
            sequence length.
        permutation: a permutation of `0 .. n - 1` (list or tuple).

    Example:

    >>> pattern = HeadPatterns([Blockwise(64, [0, 1]), Blockwise(64, [1, 0])])
    """

    def __init__(self, block_size, permutation=(0,)):
        check_positive_int("block_size", block_size)
        permutation = list(permutation)
        if sorted(permutation) != list(range(len(permutation))) or not all(isinstance(k, int) for k in permutation):
            raise ValueError(
                f"`permutation` must be a permutation of 0 .. n - 1. Received: permutation={permutation!r}"
            )
        self.block_size = block_size
        self.permutation = permutation

    @property
    def lookback(self):
        back = [k - target for k, target in enumerate(self.permutation) if target <= k]
        return (max(back) + 1) * self.block_size if back else 1

    @property
    def lookahead(self):
        ahead = [target - k for k, target in enumerate(self.permutation) if target >= k]
        return (max(ahead) + 1) * self.block_size - 1 if ahead else 0

    def _allowed(self, i, j):
        n = len(self.permutation)
        query_block = ops.floor_divide(i, self.block_size)
        target = ops.take(ops.convert_to_tensor(self.permutation, "int32"), ops.mod(query_block, n))
        target = target + ops.floor_divide(query_block, n) * n
        return ops.equal(ops.floor_divide(j, self.block_size), target)

    def check_length(self, length):
        if length % self.block_size:
            raise ValueError(
                f"`block_size`={self.block_size} must divide the sequence length. Received: sequence length {length}"
            )

    def get_config(self):
        return {"block_size": self.block_size, "permutation": list(self.permutation)}
