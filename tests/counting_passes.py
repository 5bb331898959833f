"""A decoding wrapper that counts the passes of the model it wraps (the drafted loops' tests)."""

from keras_tfam.generation import DecodingWrapper


class CountingPasses(DecodingWrapper):
    """Counts the calls of the model it wraps (eagerly, each pass of the loop is a call)."""

    def __init__(self, wrapped):
        self.wrapped, self.passes = wrapped, 0

    def call_with_cache(self, token_ids, cache, index, window=None, **options):
        self.passes += 1
        return self.wrapped.call_with_cache(token_ids, cache, index, window=window, **options)
