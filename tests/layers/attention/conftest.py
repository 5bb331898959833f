"""Fixtures that show which named kernel an attention call runs."""

import keras
import pytest

from keras_tfam.layers.attention import multi_head_attention as mha_module
from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention


@pytest.fixture
def kernels_run(monkeypatch):
    """The names `MultiHeadAttention.kernel_for` returns, one per call, in order."""
    names = []
    choose = MultiHeadAttention.kernel_for

    def recorded(self, query, key, context):
        names.append(choose(self, query, key, context))
        return names[-1]

    monkeypatch.setattr(MultiHeadAttention, "kernel_for", recorded)
    return names


@pytest.fixture
def fused_calls(monkeypatch):
    """A fused kernel made available here; returns the query shapes of the calls it ran.

    The fused kernel itself (cuDNN's, JAX on a GPU) runs only on a GPU: `scripts/gpu_bench.sh` checks it
    there against the explicit path. Here `flash_attention_fits` is forced true and the kernel stands in as
    `keras.ops.dot_product_attention(is_causal=True)` computed without a fused kernel.
    """
    calls = []

    def stand_in(query, key, value, scale=None):
        calls.append(tuple(query.shape))
        groups = query.shape[2] // key.shape[2]  # the kernel groups query heads; the stand-in repeats the keys
        key, value = (keras.ops.repeat(x, groups, axis=2) for x in (key, value))
        return keras.ops.dot_product_attention(query, key, value, scale=scale, is_causal=True, flash_attention=False)

    monkeypatch.setattr(mha_module, "flash_attention_fits", lambda query, key: True)
    monkeypatch.setattr(mha_module, "flash_causal_attention", stand_in)
    return calls
