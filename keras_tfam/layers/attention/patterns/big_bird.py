"""BigBird attention pattern: global + window + random blocks (Zaheer et al. 2020)."""

import keras
import numpy as np
from keras import ops

from keras_tfam.layers.attention.patterns.attention_pattern import AttentionPattern
from keras_tfam.layers.attention.patterns.registry import register_pattern
from keras_tfam.utils import check_non_negative_int, check_positive_int


@register_pattern("big_bird")
@keras.saving.register_keras_serializable(package="keras_tfam")
class BigBird(AttentionPattern):
    """Global, sliding-window and random blocks (Zaheer et al. 2020, "Big Bird").

    The sequence is cut into blocks of `block_size` positions; query block
    `q` attends to key block `k` when either is one of the first
    `num_global_blocks` blocks (global tokens, the paper's BIGBIRD-ITC, here
    the leading blocks), when `|q - k| <= num_window_blocks // 2` (the
    window), or when `k` is one of the `num_random_blocks` random blocks of
    `q`. The random blocks are drawn, without repetition, among the blocks
    that are neither global nor in the window, by a NumPy generator seeded
    with `seed` and `q`: the pattern is reproducible and the same at every
    call. With `causal=True` they are drawn among the earlier blocks only,
    so a query block's random blocks do not depend on the sequence length
    (cached decoding sees the same pattern as a full pass); otherwise among
    all blocks of the sequence. Computed as a dense mask (no block-sparse
    kernel here).

    Args:
        block_size: positions per block (positive int); it must divide the
            sequence length.
        num_random_blocks: `r`, random key blocks per query block.
        num_window_blocks: odd number of blocks of the window, centred on
            the query's (3 in the paper).
        num_global_blocks: leading blocks that are global.
        seed: non-negative int seed of the random blocks.
        causal: draw random blocks among earlier blocks only.

    Examples:
        >>> attention = MultiHeadAttention(12, 64, pattern=BigBird(64, num_random_blocks=3))
    """

    def __init__(self, block_size, num_random_blocks=3, num_window_blocks=3, num_global_blocks=2, seed=0, causal=False):
        block_size = check_positive_int("block_size", block_size)
        num_window_blocks = check_positive_int("num_window_blocks", num_window_blocks)
        if num_window_blocks % 2 == 0:
            raise ValueError(
                "`num_window_blocks` must be odd (the query's block and as many on each side). "
                f"Received: num_window_blocks={num_window_blocks}"
            )
        self.block_size = block_size
        self.num_random_blocks = check_non_negative_int("num_random_blocks", num_random_blocks)
        self.num_window_blocks = num_window_blocks
        self.num_global_blocks = check_non_negative_int("num_global_blocks", num_global_blocks)
        self.seed = check_non_negative_int("seed", seed)
        self.causal = bool(causal)

    def random_blocks(self, num_blocks):
        """The random key blocks of each query block of a `num_blocks`-block sequence: a list of int arrays."""
        half = self.num_window_blocks // 2
        chosen = []
        for query in range(num_blocks):
            if query < self.num_global_blocks:
                chosen.append(np.zeros((0,), int))
                continue
            if self.causal:
                eligible = np.arange(self.num_global_blocks, max(self.num_global_blocks, query - half))
                generator = np.random.default_rng([self.seed, query])
            else:
                eligible = np.array(
                    [k for k in range(self.num_global_blocks, num_blocks) if abs(k - query) > half], int
                )
                generator = np.random.default_rng([self.seed, num_blocks, query])
            count = min(self.num_random_blocks, len(eligible))
            chosen.append(np.sort(generator.choice(eligible, size=count, replace=False)) if count else eligible)
        return chosen

    def block_mask(self, num_blocks):
        """`(num_blocks, num_blocks)` NumPy bool: which key blocks each query block attends."""
        blocks = np.arange(num_blocks)
        table = np.abs(blocks[:, None] - blocks[None, :]) <= self.num_window_blocks // 2
        table[: self.num_global_blocks] = True
        table[:, : self.num_global_blocks] = True
        for query, keys in enumerate(self.random_blocks(num_blocks)):
            table[query, keys] = True
        return table

    @property
    def depends_on_length(self):
        """Non-causal random blocks are drawn among all blocks of the sequence, so they depend on its length."""
        return not self.causal

    def _allowed(self, i, j):
        length = j.shape[-1]
        if length is None:
            raise ValueError(
                "BigBird draws its random blocks for a known number of blocks: the key length must be static. "
                f"Received: key positions of shape {tuple(j.shape)}"
            )
        num_blocks = -(-length // self.block_size)
        table = ops.convert_to_tensor(self.block_mask(num_blocks).reshape(-1))
        query_block = ops.clip(ops.floor_divide(i, self.block_size), 0, num_blocks - 1)
        key_block = ops.clip(ops.floor_divide(j, self.block_size), 0, num_blocks - 1)
        return ops.take(table, query_block * num_blocks + key_block)

    def check_length(self, length):
        if length % self.block_size:
            raise ValueError(
                f"`block_size`={self.block_size} must divide the sequence length. Received: sequence length {length}"
            )

    def get_config(self):
        return {
            "block_size": self.block_size,
            "num_random_blocks": self.num_random_blocks,
            "num_window_blocks": self.num_window_blocks,
            "num_global_blocks": self.num_global_blocks,
            "seed": self.seed,
            "causal": self.causal,
        }
