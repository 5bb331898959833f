import numpy as np
import pytest

from keras_tfam.ops import causal_mask, merge_masks, padding_to_attention_mask, sliding_window_mask


def test_causal_is_lower_triangular():
    np.testing.assert_array_equal(causal_mask(5)[0], np.tril(np.ones((5, 5), bool)))


def test_causal_with_cache_offset_hides_unwritten_slots():
    # Two new queries at positions 3 and 4 over a cache of 8 slots.
    expected = np.zeros((2, 8), bool)
    expected[0, :4] = True
    expected[1, :5] = True
    np.testing.assert_array_equal(causal_mask(2, 8, query_offset=3)[0], expected)


def test_sliding_window():
    i, j = np.meshgrid(np.arange(6), np.arange(6), indexing="ij")
    np.testing.assert_array_equal(sliding_window_mask(6, window=3)[0], (i - j >= 0) & (i - j < 3))
    np.testing.assert_array_equal(sliding_window_mask(6, window=2, causal=False)[0], np.abs(i - j) < 2)
    with pytest.raises(ValueError, match="Received: window=0"):
        sliding_window_mask(6, window=0)


def test_padding_and_merge():
    query = np.array([[1, 1, 0]], bool)
    key = np.array([[1, 0, 1, 1]], bool)
    mask = np.asarray(padding_to_attention_mask(query, key))
    np.testing.assert_array_equal(mask, query[:, :, None] & key[:, None, :])
    np.testing.assert_array_equal(padding_to_attention_mask(None, key), key[:, None, :])
    assert padding_to_attention_mask() is None
    merged = np.asarray(merge_masks(None, mask, causal_mask(3, 4)))
    np.testing.assert_array_equal(merged, mask & np.tril(np.ones((3, 4), bool))[None])
    assert merge_masks(None, None) is None
