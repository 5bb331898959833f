import math

import numpy as np
import pytest
from block_reference import projection_weights
from harness import LayerHarness
from reference import dense

from keras_tfam.layers import DistanceAwareAttention, RotaryEmbedding, distance_rescale

rng = np.random.default_rng(0)


class TestDistanceAwareAttentionHarness(LayerHarness):
    layer_cls = DistanceAwareAttention
    init_kwargs = {
        "num_heads": 2,
        "key_dim": 4,
        "num_key_value_heads": 1,
        "distance_weight_initializer": "random_normal",
        "sharpness_initializer": "random_normal",
    }
    call_kwargs = {"use_causal_mask": True}

    def make_inputs(self):
        return {"query": rng.normal(size=(2, 6, 8)).astype("float32")}


def seed_f(x, v):
    """Wu et al. 2021, the learnable sigmoid, written as in the paper."""
    return (1.0 + math.exp(v)) / (1.0 + math.exp(v - x))


def test_distance_function_matches_the_paper_and_its_properties():
    x = np.linspace(-20.0, 20.0, 81)
    for v in (-2.0, 0.0, 1.5):
        f = np.asarray(distance_rescale(x, v))
        np.testing.assert_allclose(f, [seed_f(xi, v) for xi in x], rtol=1e-5)
        assert float(np.asarray(distance_rescale(0.0, v))) == pytest.approx(1.0, abs=1e-6)
        assert np.all(np.diff(f) >= 0.0)  # monotone
        assert np.all((f > 0.0) & (f <= 1.0 + math.exp(v) + 1e-5))  # bounded by 1 + e^v
    # Far outside the usual range: no overflow, no NaN.
    assert np.all(np.isfinite(np.asarray(distance_rescale(np.array([-1e4, 1e4]), 5.0))))


def numpy_da_attention(layer, x, mask):
    """ReLU(Q K^T) * f(w |i - j|; v), divided by the row sum, per head."""
    wq, bq, wk, bk, wv, bv, wo, bo = projection_weights(layer)
    w, v = np.asarray(layer.distance_weight, np.float64), np.asarray(layer.sharpness, np.float64)
    b, t, _ = x.shape
    n, kv = layer.num_heads, layer.num_key_value_heads
    q = dense(x, wq, bq).reshape(b, t, n, -1)
    k = np.repeat(dense(x, wk, bk).reshape(b, t, kv, -1), n // kv, axis=2)
    val = np.repeat(dense(x, wv, bv).reshape(b, t, kv, -1), n // kv, axis=2)
    scores = np.maximum(np.einsum("btnh,bsnh->bnts", q, k), 0.0)  # the 1/sqrt(d) scale cancels
    distance = np.abs(np.arange(t)[:, None] - np.arange(t)[None, :])
    rescaled = np.array([[[seed_f(w[h] * d, v[h]) for d in row] for row in distance] for h in range(n)])
    a = np.where(mask[:, None], scores * rescaled[None], 0.0)
    totals = a.sum(-1, keepdims=True)
    a = np.where(totals > 0, a / np.where(totals > 0, totals, 1.0), 0.0)
    out = np.einsum("bnts,bsnh->btnh", a, val).reshape(b, t, -1)
    return dense(out, wo, bo)


@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_matches_numpy_with_causal_and_padding_masks(num_kv_heads):
    x = rng.normal(size=(2, 7, 16)).astype("float32")
    padding = np.array([[1] * 7, [1] * 5 + [0] * 2], bool)
    layer = DistanceAwareAttention(
        4,
        4,
        num_key_value_heads=num_kv_heads,
        distance_weight_initializer="random_normal",
        sharpness_initializer="random_normal",
    )
    out = np.asarray(layer(x, query_mask=padding, use_causal_mask=True))
    mask = np.tril(np.ones((7, 7), bool))[None] & padding[:, None, :] & padding[:, :, None]
    np.testing.assert_allclose(out, numpy_da_attention(layer, x, mask), atol=1e-5)


def test_weights_are_normalised_and_a_fully_masked_row_is_zero():
    x = rng.normal(size=(1, 5, 8)).astype("float32")
    layer = DistanceAwareAttention(2, 4)
    mask = np.ones((1, 5, 5), bool)
    mask[0, 2] = False
    _, weights = layer(x, attention_mask=mask, return_attention_scores=True)
    totals = np.asarray(weights).sum(-1)[0]
    assert np.all(np.isfinite(np.asarray(weights)))
    np.testing.assert_allclose(totals[:, 2], 0.0)
    rows = np.delete(totals, 2, axis=1)
    # Each row sums to 1 unless ReLU zeroed every score of it.
    assert np.all(np.isclose(rows, 1.0, atol=1e-5) | np.isclose(rows, 0.0))


def test_rejects_a_position_scheme():
    with pytest.raises(ValueError, match="Received: position=<RotaryEmbedding"):
        DistanceAwareAttention(2, 4, position=RotaryEmbedding())
