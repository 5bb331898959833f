"""Which calls `MultiHeadAttention(attention_kernel="auto")` hands to a fused (flash) kernel, and that they get
the same attention.

Where `flash_attention_fits` is false, the `fused_calls` fixture (conftest.py) forces it true and stands the
kernel in: the tests check which calls are dispatched, and that what they pass (scale, grouped heads,
rotated queries and keys) gives Vaswani et al.'s attention (NumPy).
"""

import keras
import numpy as np
import pytest
from reference import attention, dense, multi_head_attention, rotary

from keras_tfam.layers import ALiBiBias, MultiHeadAttention, RotaryEmbedding
from keras_tfam.layers.attention import multi_head_attention as mha_module
from keras_tfam.models import GPT2LM
from keras_tfam.ops.attention import flash_attention_fits

rng = np.random.default_rng(0)


def test_no_fused_kernel_without_a_gpu():
    x = keras.ops.ones((1, 4, 2, 8), "bfloat16")
    assert not flash_attention_fits(x, x)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_plain_causal_self_attention_is_fused_and_matches_numpy(fused_calls, num_kv_heads):
    x = rng.normal(size=(2, 6, 16)).astype("float32")
    layer = MultiHeadAttention(4, 4, num_key_value_heads=num_kv_heads, bias_initializer="random_normal")
    out = layer(x, use_causal_mask=True)
    assert fused_calls == [(2, 6, 4, 4)]
    expected = multi_head_attention(
        x,
        x,
        [np.asarray(w, np.float64) for w in layer.get_weights()],
        4,
        num_kv_heads,
        np.tril(np.ones((6, 6), bool))[None],
    )
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_rotary_heads_are_fused_after_their_rotation(fused_calls):
    x = rng.normal(size=(1, 5, 8)).astype("float32")
    layer = MultiHeadAttention(2, 4, num_key_value_heads=1, use_bias=False, position=RotaryEmbedding())
    out = layer(x, use_causal_mask=True)
    assert len(fused_calls) == 1
    wq, wk, wv, wo = (np.asarray(w, np.float64) for w in layer.get_weights())
    q = rotary(dense(x, wq).reshape(1, 5, 2, 4), range(5))
    k = rotary(dense(x, wk).reshape(1, 5, 1, 4), range(5))
    heads, _ = attention(q, k, dense(x, wv).reshape(1, 5, 1, 4), np.tril(np.ones((5, 5), bool))[None])
    np.testing.assert_allclose(out, dense(heads.reshape(1, 5, 8), wo), atol=1e-5)


@pytest.mark.parametrize(
    "init, call",
    [
        ({}, {"query_mask": np.array([[1, 1, 1, 0]], bool)}),  # padding
        ({}, {"window": 2}),  # a window
        ({}, {"attention_mask": np.tril(np.ones((1, 4, 4), bool))}),  # a mask of the caller's
        ({}, {"return_attention_scores": True}),  # the weights asked for
        ({"position": "alibi"}, {}),  # a score bias
        ({"dropout": 0.5}, {"training": True}),  # dropout on the weights
        ({}, {"use_causal_mask": False}),  # not causal
    ],
    ids=["padding", "window", "attention_mask", "scores", "alibi", "dropout", "bidirectional"],
)
def test_what_the_fused_kernel_cannot_compute_keeps_the_explicit_path(fused_calls, init, call):
    if init.get("position") == "alibi":
        init = {"position": ALiBiBias(2)}
    layer = MultiHeadAttention(2, 4, **init)
    layer(rng.normal(size=(1, 4, 8)).astype("float32"), **{"use_causal_mask": True, **call})
    assert fused_calls == []


def test_a_gpt2_training_pass_is_fused_and_unchanged(fused_calls, monkeypatch):
    model = GPT2LM(vocabulary_size=48, num_layers=2, num_heads=2, hidden_dim=16, max_sequence_length=16, dropout=0.0)
    ids = rng.integers(0, 48, size=(2, 9)).astype("int32")
    fused = np.asarray(model(ids, training=True))
    assert len(fused_calls) == 2  # both layers
    monkeypatch.setattr(mha_module, "flash_attention_fits", lambda query, key: False)
    np.testing.assert_allclose(fused, np.asarray(model(ids, training=True)), atol=1e-5)
