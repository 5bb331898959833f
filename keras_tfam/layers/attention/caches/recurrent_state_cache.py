"""The running state of a recurrent (linear) attention kernel."""

from keras import ops

from keras_tfam.layers.attention.caches.attention_cache import AttentionCache
from keras_tfam.ops import masks as mask_ops


class RecurrentStateCache(AttentionCache):
    """A fixed-size state `(B, N, M, Hv + 1)` that the kernel continues from: O(1) per token.

    Linear attention's `(S, z)`: `S = sum phi(k) v^T` and `z = sum phi(k)`,
    packed as the last column. It does not grow with the length, and its
    update is the kernel's (`store`).

    Args:
        num_heads: `N`.
        feature_dim: `M`, features per head.
        value_dim: `Hv`.
    """

    def __init__(self, num_heads, feature_dim, value_dim):
        self.num_heads = num_heads
        self.feature_dim = feature_dim
        self.value_dim = value_dim

    def init(self, batch_size, max_length=None, dtype="float32", window=None):
        return ops.zeros((batch_size, self.num_heads, self.feature_dim, self.value_dim + 1), dtype)

    def resize(self, cache, max_length):
        return cache

    def check(self, cache):
        expected = (self.num_heads, self.feature_dim, self.value_dim + 1)
        shape = tuple(getattr(cache, "shape", ()))
        if len(shape) != 4 or shape[1:] != expected:
            raise ValueError(
                f"`cache` must be the recurrent state (batch, {expected[0]}, {expected[1]}, {expected[2]}), as "
                f"init_cache makes it without a window. Received: cache.shape={shape}"
            )

    def update(self, cache, key, value, index, window=None):
        return cache, key, value, mask_ops.positions(ops.shape(key)[1], index), ops.cast(cache, "float32")

    def store(self, cache, state):
        return ops.cast(state, cache.dtype)
