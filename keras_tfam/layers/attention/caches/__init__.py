"""Attention caches: what a decoding attention layer keeps between steps, behind one small interface."""

from keras_tfam.layers.attention.caches.attention_cache import AttentionCache
from keras_tfam.layers.attention.caches.key_value_cache import KeyValueCache
from keras_tfam.layers.attention.caches.recurrent_state_cache import RecurrentStateCache

__all__ = ["AttentionCache", "KeyValueCache", "RecurrentStateCache"]
