"""A cache of keys and values, a plain buffer or a ring (sliding window)."""

import keras
from keras import ops

from keras_tfam.engine import current_engine
from keras_tfam.layers.attention.caches.attention_cache import AttentionCache
from keras_tfam.ops import masks as mask_ops
from keras_tfam.utils import check_window, static_dim, static_int


class KeyValueCache(AttentionCache):
    """Keys and values of every position, `(B, 2, slots, K, H)` (keys at index 0, values at 1).

    Without a window the cache is a buffer: position `p` lives in slot
    `p`, and writing past the last slot is an error (`resize` grows it).
    With a `window` (or a pattern of bounded `lookback`), only the positions
    a query can still see are kept: a ring of `min(window, lookback)` slots,
    position `p` in slot `p % slots`, O(window) memory and time per token.

    Args:
        num_key_value_heads: `K`.
        key_dim: `H` (values have the same size).
        lookback: a pattern's `lookback` (the ring's size when no window is
            smaller), or `None`.
    """

    def __init__(self, num_key_value_heads, key_dim, lookback=None):
        self.num_key_value_heads = num_key_value_heads
        self.key_dim = key_dim
        self.lookback = lookback

    def ring_window(self, window):
        """The positions the cache must keep: `window` and `lookback`, the smaller; or `None` (all)."""
        if window is None or self.lookback is None:
            return self.lookback if window is None else window
        known = static_int(window)
        return min(known, self.lookback) if known is not None else ops.minimum(window, self.lookback)

    def init(self, batch_size, max_length, dtype="float32", window=None):
        if max_length is None:
            raise ValueError(
                "A cache of keys and values needs `max_length`, the positions it holds. Received: max_length=None"
            )
        slots = max_length
        ring = self.ring_window(check_window(window))
        if ring is not None:
            both_known = isinstance(max_length, int) and isinstance(ring, int)
            slots = min(max_length, ring) if both_known else ops.minimum(max_length, ring)
        dtype = current_engine().cache_dtype(keras.backend.standardize_dtype(dtype))
        return ops.zeros((batch_size, 2, slots, self.num_key_value_heads, self.key_dim), dtype)

    @staticmethod
    def keys_values(cache):
        """The keys and values of `cache`, `(B, slots, K, H)` each, in the cache's float dtype.

        Examples:
            >>> cache = KeyValueCache(2, 4).init(1, 8, "bfloat16")
            >>> keys, values = KeyValueCache.keys_values(cache)
            >>> keras.backend.standardize_dtype(keys.dtype), tuple(values.shape)
            ('bfloat16', (1, 8, 2, 4))
        """
        engine = current_engine()
        return engine.cache_values(cache[:, 0]), engine.cache_values(cache[:, 1])

    def resize(self, cache, max_length):
        """Grows the cache to `max_length` positions; a ring only before it wraps, never past `lookback`."""
        slots = static_dim(cache.shape[2])
        if self.lookback is not None and isinstance(max_length, int):
            if slots is not None and slots >= min(max_length, self.lookback):
                return cache
            max_length = min(max_length, self.lookback)
        if isinstance(max_length, int) and slots is not None and max_length < slots:
            raise ValueError(
                "`resize_cache` only grows a cache. Received: max_length="
                f"{max_length} for a cache of {cache.shape[2]} positions"
            )
        grow = max_length - ops.shape(cache)[2]
        return ops.pad(cache, [[0, 0], [0, 0], [0, grow], [0, 0], [0, 0]])

    def check(self, cache):
        shape = tuple(getattr(cache, "shape", ()))
        if len(shape) != 5 or shape[1] != 2 or shape[3:] != (self.num_key_value_heads, self.key_dim):
            raise ValueError(
                "`cache` must have shape (batch, 2, slots, num_key_value_heads="
                f"{self.num_key_value_heads}, key_dim={self.key_dim}): keys and values, as init_cache makes them. "
                f"Received: cache.shape={shape}"
            )

    def update(self, cache, key, value, index, window=None):
        ring = self.ring_window(window)
        stored = keras.backend.standardize_dtype(cache.dtype)
        engine = current_engine()
        update = ops.cast(ops.stack([key, value], axis=1), engine.cache_value_dtype(stored))  # [B, 2, T, K, H]
        new = static_dim(update.shape[2])
        slots = static_dim(cache.shape[2]) or ops.shape(cache)[2]
        known_index = static_int(index)
        self._check_index(known_index, new, slots, ring)
        fits = known_index is not None and new is not None and isinstance(slots, int) and known_index + new <= slots
        if ring is None or new == 1 or fits:
            # Written in place, then attended (XLA reuses the cache's buffer
            # inside the decoding loop). One new position in a ring replaces
            # the one that just left the window.
            start = index
            if ring is not None and not fits:
                start = known_index % slots if known_index is not None else ops.mod(index, slots)
            cache = ops.slice_update(cache, (0, 0, start, 0, 0), engine.cache_stored(update, stored))
            held = mask_ops.ring_positions(slots, ops.add(index, ops.shape(update)[2]))
            return (cache, *self.keys_values(cache), held, None)
        # Several new positions that may wrap around the ring: a later one
        # would overwrite a key an earlier query still sees, so the queries
        # attend to the old slots and the new keys side by side, and the ring
        # keeps the latest position of each slot.
        length = ops.shape(update)[2]
        cached_keys, cached_values = self.keys_values(cache)
        keys = ops.concatenate([cached_keys, update[:, 0]], axis=1)
        values = ops.concatenate([cached_values, update[:, 1]], axis=1)
        key_positions = ops.concatenate(
            [mask_ops.ring_positions(slots, index), mask_ops.positions(length, index)], axis=0
        )
        held = mask_ops.ring_positions(slots, ops.add(index, length))
        fresh = ops.greater_equal(held, index)
        taken = ops.take(engine.cache_stored(update, stored), ops.clip(held - index, 0, length - 1), axis=2)
        cache = ops.where(fresh[None, None, :, None, None], taken, cache)
        return cache, keys, values, key_positions, None

    @staticmethod
    def _check_index(index, new, slots, ring):
        """Errors for a `cache_update_index` known now that writes outside the cache."""
        if index is None:
            return
        if index < 0:
            raise ValueError(f"`cache_update_index` must be >= 0. Received: cache_update_index={index}")
        if new is None or not isinstance(slots, int) or index + new <= slots:
            return
        if ring is None:
            raise ValueError(
                f"`cache_update_index` {index} with {new} new token(s) writes positions {index}..{index + new - 1}, "
                f"past the {slots} slots of `cache`. Grow the cache with `resize_cache`, or pass `window` to use it "
                f"as a sliding-window (ring) cache. Received: cache_update_index={index}"
            )
        known = static_int(ring)
        if known is not None and slots < known:
            raise ValueError(
                f"A ring cache must hold the whole window once it wraps: {slots} slots for window={known}. "
                f"Received: cache_update_index={index} with {new} new token(s)"
            )
