"""Base class of attention patterns: which keys each query may attend, as a rule on positions."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_tfam")
class AttentionPattern:
    """A sparse attention pattern: the set of keys each query may attend.

    A pattern is a rule on absolute positions, `allowed(i, j)` for a query
    at `i` and a key at `j` (Child et al. 2019 write it as the sets `A_i`).
    `MultiHeadAttention(pattern=...)` intersects it with its other masks
    (causality, a call-level `window`, padding); the pattern itself is
    usually symmetric and leaves causality to the attention. A key at a
    negative position (an empty cache slot, padding of a block) is never
    attended.

    Two numbers let attention compute a pattern efficiently:

    - `lookback`: every allowed key `j <= i` has `i - j < lookback`, or
      `None` when unbounded. Causal decoding then needs only the last
      `lookback` positions: a ring cache of that many slots.
    - `lookahead`: every allowed key `j >= i` has `j - i <= lookahead`, or
      `None`.

    When both are bounded (sliding, dilated windows, the local part of the
    Sparse Transformer, blockwise) attention runs banded, in `O(T * band)`
    time and memory (`keras_tfam.ops.banded`); otherwise it applies the
    pattern as a dense `(T, S)` mask.

    A pattern that gives each group of heads its own rule (`HeadPatterns`)
    has `head_groups > 1`; its mask has a head axis.

    Subclasses implement `_allowed(i, j)` on broadcast int32 positions and
    `get_config`.

    Args:
        **kwargs: none here; each pattern's constructor takes its rule's
            arguments (`SlidingWindow(window)`, ...).

    Examples:
        >>> class EvenKeys(AttentionPattern):
        ...     # Each query attends the even positions only.
        ...     def _allowed(self, i, j):
        ...         return keras.ops.equal(j % 2, 0)
        ...     def get_config(self):
        ...         return {}
        >>> keras.ops.convert_to_numpy(EvenKeys().mask(np.arange(3), np.arange(4)))[0]
        array([ True, False,  True, False])
    """

    head_groups = 1

    @property
    def lookback(self):
        return None

    @property
    def lookahead(self):
        return None

    @property
    def depends_on_length(self):
        """Whether `allowed(i, j)` depends on the sequence's length (BigBird's non-causal random blocks).

        Such a pattern is defined for a full pass only: a causal call over
        query blocks, or decoding with a cache, cannot know the length the
        full pass would have, so attention refuses the combination.
        """
        return False

    def mask(self, query_positions, key_positions):
        """Boolean `(T, S)` (`(head_groups, T, S)` per head), `True` = may attend.

        Args:
            query_positions: `(T,)` int absolute positions, or `(..., T)`
                (blocks of queries, each with its own keys).
            key_positions: `(S,)` int absolute positions, `-1` for an empty
                slot, or `(..., S)` with the same leading axes.

        Returns:
            `(..., T, S)` boolean, or `(..., head_groups, T, S)`.
        """
        i = ops.expand_dims(ops.cast(query_positions, "int32"), -1)
        j = ops.expand_dims(ops.cast(key_positions, "int32"), -2)
        return ops.logical_and(self._allowed(i, j), ops.greater_equal(j, 0))

    def _allowed(self, i, j):
        """The rule on broadcast int32 query positions `i` `(..., T, 1)` and key positions `j` `(..., 1, S)`."""
        raise NotImplementedError

    def check_length(self, length):
        """Raises a `ValueError` when the pattern is not defined for sequences of `length` (a static int)."""

    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        arguments = ", ".join(f"{name}={value!r}" for name, value in self.get_config().items())
        return f"{type(self).__name__}({arguments})"

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self):
        return hash(repr(self))
