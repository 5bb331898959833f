import keras
import numpy as np
import pytest
from reference import attention

from keras_tfam.ops import scaled_dot_product_attention
from keras_tfam.ops.banded import band_positions, banded_attention

rng = np.random.default_rng(0)
W = 4


def window_mask(length, window, causal, padding):
    """The sliding window as a NumPy definition: `|i - j| < w` (causal: `0 <= i - j < w`), and padding."""
    i, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
    allowed = (i - j < window) & (i - j >= 0) if causal else np.abs(i - j) < window
    return allowed[None] & padding[:, :, None] & padding[:, None, :]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("length", [1, W - 1, W, W + 1, 3 * W + 5])
def test_banded_equals_dense_masked_attention(causal, length):
    # 4 query heads in 2 groups sharing key/value heads (GQA), padding in row 1.
    q = rng.normal(size=(2, length, 4, 8)).astype("float32")
    k, v = (rng.normal(size=(2, length, 2, 8)).astype("float32") for _ in range(2))
    padding = np.ones((2, length), bool)
    padding[1, length // 2 + 1 :] = False
    out = banded_attention(q, k, v, W, 0 if causal else W - 1, query_mask=padding, key_mask=padding)
    mask = window_mask(length, W, causal, padding)
    expected, _ = attention(q, k, v, mask)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    dense = scaled_dot_product_attention(q, k, v, mask)
    np.testing.assert_allclose(out, dense, atol=1e-5)


def test_float16_inputs_are_finite_and_close():
    length = 3 * W + 5
    q, k, v = (rng.normal(size=(2, length, 4, 8)).astype("float16") * 4 for _ in range(3))
    padding = np.ones((2, length), bool)
    padding[0, 7:] = False  # padded query rows see no key: zeros, never NaN
    out = np.asarray(banded_attention(q, k, v, W, query_mask=padding, key_mask=padding)).astype("float32")
    assert np.all(np.isfinite(out))
    expected, _ = attention(q, k, v, window_mask(length, W, True, padding))
    assert np.max(np.abs(out - expected)) / np.max(np.abs(expected)) < 5e-3
    np.testing.assert_array_equal(out[0, 7:], 0.0)


def test_block_positions_mark_keys_outside_the_sequence():
    queries, keys = band_positions(10, 4, before=1, after=1)
    np.testing.assert_array_equal(queries, np.arange(12).reshape(3, 4))
    np.testing.assert_array_equal(keys[0], [-1] * 4 + list(range(8)))
    np.testing.assert_array_equal(keys[2], [4, 5, 6, 7, 8, 9, -1, -1, -1, -1, -1, -1])


def test_memory_of_the_scores_grows_with_the_band_not_the_square():
    # The attention function sees (B * nb, b, N, H) queries and (B * nb, 2b, K, H) keys.
    seen = {}

    def attend(q, k, v, mask, bias):
        seen["query"], seen["key"], seen["mask"] = q.shape, k.shape, mask.shape
        return scaled_dot_product_attention(q, k, v, mask, bias)

    x = keras.random.normal((1, 1000, 2, 8))
    banded_attention(x, x, x, 16, attend=attend)
    assert seen["query"] == (63, 16, 2, 8) and seen["key"] == (63, 32, 2, 8)
    assert tuple(seen["mask"]) == (63, 16, 32)


def test_bad_arguments():
    x = np.zeros((1, 5, 2, 4), "float32")
    with pytest.raises(ValueError, match="Received: lookback=0, lookahead=0"):
        banded_attention(x, x, x, 0)
    with pytest.raises(ValueError, match=r"share their positions.*key.shape=\(1, 6, 2, 4\)"):
        banded_attention(x, np.zeros((1, 6, 2, 4), "float32"), np.zeros((1, 6, 2, 4), "float32"), 2)
