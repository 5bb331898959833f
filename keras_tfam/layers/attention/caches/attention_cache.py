"""The interface every attention cache implements."""


class AttentionCache:
    """What an attention layer keeps between decoding steps, and the one place that writes it.

    An attention layer declares its cache for a call (`cache_for(window)`);
    the cache object knows the layout of its tensors and is stateless
    itself: the tensors travel through the decoding loop (a nest with the
    batch on axis 0), and every method takes and returns them.

    - `init(batch_size, max_length, dtype, window)`: an empty cache.
    - `resize(cache, max_length)`: the cache grown to `max_length`
      positions (a fixed-size state returns itself).
    - `check(cache)`: a `ValueError` naming the expected layout unless
      `cache` has it.
    - `update(cache, key, value, index, window)`: writes the new positions'
      `(B, T, K, H)` keys and values at absolute position `index`; returns
      `(cache, keys, values, key_positions, state)`: what the queries attend
      to, the absolute position of each key (`-1`: an empty slot), and the
      running state a recurrent kernel continues from (`None` for a cache
      of keys and values).
    - `store(cache, state)`: the cache holding the kernel's new state.
    """

    def init(self, batch_size, max_length, dtype="float32", window=None):
        raise NotImplementedError

    def resize(self, cache, max_length):
        raise NotImplementedError

    def check(self, cache):
        raise NotImplementedError

    def update(self, cache, key, value, index, window=None):
        raise NotImplementedError

    def store(self, cache, state):
        """`cache` with the kernel's new `state`; a cache of keys and values has none and is returned as is."""
        return cache
