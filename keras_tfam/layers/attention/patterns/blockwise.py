"""Blockwise attention pattern (Qiu et al. 2020, BlockBERT)."""

import keras
import numpy as np
from keras import ops

from keras_tfam.layers.attention.patterns.attention_pattern import AttentionPattern
from keras_tfam.layers.attention.patterns.registry import register_pattern
from keras_tfam.utils import check_positive_int, is_integer


@register_pattern("blockwise")
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
        block_size: positions per block (positive int).
        permutation: a permutation of `0 .. n - 1` (list or tuple); the
            sequence length must be a multiple of `n * block_size`, whole
            cycles of the permutation (`check_length`).

    Examples:
        >>> pattern = HeadPatterns([Blockwise(64, [0, 1]), Blockwise(64, [1, 0])])
    """

    def __init__(self, block_size, permutation=(0,)):
        self.block_size = check_positive_int("block_size", block_size)
        entries = list(permutation) if isinstance(permutation, (list, tuple, np.ndarray)) else None
        if (
            not entries
            or not all(is_integer(k) for k in entries)
            or sorted(int(k) for k in entries) != list(range(len(entries)))
        ):
            raise ValueError(
                f"`permutation` must be a permutation of 0 .. n - 1 (a list of integers). Received: "
                f"permutation={permutation!r}"
            )
        self.permutation = [int(k) for k in entries]

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
        # A trailing partial cycle would map query blocks past the last key block: rows with no key at all.
        cycle = len(self.permutation) * self.block_size
        if length % cycle:
            raise ValueError(
                f"The permutation of {len(self.permutation)} blocks of `block_size`={self.block_size} repeats every "
                f"{cycle} positions, which must divide the sequence length. Received: sequence length {length}"
            )

    def get_config(self):
        return {"block_size": self.block_size, "permutation": list(self.permutation)}
