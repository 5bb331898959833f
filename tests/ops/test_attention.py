import keras
import numpy as np
import pytest
from backend import gradients
from reference import attention

from keras_tfam.ops import attention_weights, causal_mask, scaled_dot_product_attention

rng = np.random.default_rng(0)


def _qkv(b=2, t=5, s=7, n=4, k=4, h=8):
    q = rng.normal(size=(b, t, n, h)).astype("float32")
    kk = rng.normal(size=(b, s, k, h)).astype("float32")
    v = rng.normal(size=(b, s, k, h)).astype("float32")
    return q, kk, v


def test_matches_numpy_with_causal_and_padding_masks():
    q, k, v = _qkv(t=6, s=6)
    padding = np.array([[1] * 6, [1] * 4 + [0] * 2], bool)
    mask = np.tril(np.ones((6, 6), bool))[None] & padding[:, None, :]
    expected, expected_weights = attention(q, k, v, mask)
    outputs, weights = scaled_dot_product_attention(q, k, v, mask, return_attention_weights=True)
    np.testing.assert_allclose(outputs, expected, atol=1e-5)
    np.testing.assert_allclose(weights, expected_weights, atol=1e-6)


def test_matches_numpy_cross_attention_with_bias():
    q, k, v = _qkv(t=3, s=9)
    bias = rng.normal(size=(1, 4, 3, 9)).astype("float32")
    expected, _ = attention(q, k, v, bias=bias)
    np.testing.assert_allclose(scaled_dot_product_attention(q, k, v, bias=bias), expected, atol=1e-5)


def test_grouped_query_heads_share_key_value_heads():
    q, k, v = _qkv(n=6, k=2)
    mask = rng.random((2, 5, 7)) > 0.3
    expected, _ = attention(q, k, v, mask)
    np.testing.assert_allclose(scaled_dot_product_attention(q, k, v, mask), expected, atol=1e-5)


def test_custom_scale():
    q, k, v = _qkv()
    # Scale 1/sqrt(H) applied to q*2 equals scale 2/sqrt(H) on q.
    expected, _ = attention(2 * q, k, v)
    outputs = scaled_dot_product_attention(q, k, v, scale=2 / np.sqrt(8))
    np.testing.assert_allclose(outputs, expected, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_fully_masked_rows_give_zeros_not_nan(dtype):
    q, k, v = (keras.ops.cast(a, dtype) for a in _qkv())
    mask = np.ones((2, 5, 7), bool)
    mask[0, 2] = False
    mask[1] = False
    outputs, weights = scaled_dot_product_attention(q, k, v, mask, return_attention_weights=True)
    outputs = keras.ops.convert_to_numpy(keras.ops.cast(outputs, "float32"))
    assert np.all(np.isfinite(outputs))
    assert np.all(outputs[0, 2] == 0) and np.all(outputs[1] == 0)
    assert keras.backend.standardize_dtype(weights.dtype) == "float32"
    np.testing.assert_allclose(np.asarray(weights)[0, :, 0].sum(-1), 1.0, rtol=1e-5)


def test_gradients_finite_through_fully_masked_rows():
    mask = np.zeros((2, 5, 7), bool)
    mask[:, :, :3] = True
    mask[0, 1] = False

    def loss(q, k, v):
        return keras.ops.sum(scaled_dot_product_attention(q, k, v, mask) ** 2)

    for grad in gradients(loss, *_qkv()):
        assert np.all(np.isfinite(grad))


def test_float16_large_scores_do_not_overflow():
    q, k, v = _qkv()
    q16 = keras.ops.cast(q * 60, "float16")
    k16 = keras.ops.cast(k * 60, "float16")
    outputs = scaled_dot_product_attention(q16, k16, keras.ops.cast(v, "float16"), causal_mask(5, 7))
    assert np.all(np.isfinite(keras.ops.convert_to_numpy(outputs).astype("float32")))


def test_weights_sum_to_one_on_unmasked_rows():
    q, k, _ = _qkv()
    weights = np.asarray(attention_weights(q, k, causal_mask(5, 7, query_offset=2)))
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    # Query 0 sits at position 2: keys 3.. are hidden.
    assert np.all(weights[:, :, 0, 3:] == 0)


def test_bad_ranks_and_heads_raise():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"`query` must have rank 4.*Received: query.shape=\(2, 5, 32\)"):
        scaled_dot_product_attention(q.reshape(2, 5, 32), k, v)
    with pytest.raises(ValueError, match="multiple of the number of key/value heads.*query heads=4.*key/value heads=3"):
        scaled_dot_product_attention(q, k[:, :, :3], v[:, :, :3])
    with pytest.raises(ValueError, match="same head_dim"):
        scaled_dot_product_attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match="`attention_mask` must have rank 3"):
        scaled_dot_product_attention(q, k, v, np.ones((7,), bool))
