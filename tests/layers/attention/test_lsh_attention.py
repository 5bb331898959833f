import math

import numpy as np
import pytest
from attention_checks import decode_in_steps, dense_weights
from harness import LayerHarness
from reference import angular_lsh_collision_probability, dense, softmax

from keras_tfam.layers import ALiBiBias, RotaryEmbedding
from keras_tfam.layers.attention.lsh_attention import LSHAttention

rng = np.random.default_rng(0)


class TestLSHAttentionHarness(LayerHarness):
    layer_cls = LSHAttention
    init_kwargs = {
        "num_heads": 2,
        "key_dim": 4,
        "num_buckets": 4,
        "num_hashes": 2,
        "chunk_length": 4,
        "seed": 0,
        "redraw": 1,
        "position": RotaryEmbedding(),
    }
    call_kwargs = {"use_causal_mask": True}

    def make_inputs(self):
        return {
            "query": rng.normal(size=(2, 8, 8)).astype("float32"),
            "query_mask": np.array([[1] * 8, [1] * 6 + [0] * 2], bool),
        }


def _pairs_at_angle(theta, count, dim, seed):
    directions = np.random.default_rng(seed)
    x = directions.normal(size=(count, dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    z = directions.normal(size=(count, dim))
    z -= np.sum(z * x, axis=1, keepdims=True) * x
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    return x, math.cos(theta) * x + math.sin(theta) * z


@pytest.mark.parametrize("num_buckets", [2, 8])
def test_collision_probability_falls_with_angle_as_the_analytic_curve(num_buckets):
    layer = LSHAttention(1, 16, num_buckets=num_buckets, num_hashes=64, seed=0)
    layer.build((None, None, 16))
    measured = []
    for theta in (0.2, 0.6, 1.0, 1.5, 2.0, 2.6):
        x, y = _pairs_at_angle(theta, 500, 16, seed=int(theta * 10))
        same = np.asarray(layer.buckets(x.astype("float32"))) == np.asarray(layer.buckets(y.astype("float32")))
        per_round = same.mean(axis=0)  # (64,) collision rates, one per random rotation
        rate, standard_error = per_round.mean(), per_round.std() / math.sqrt(per_round.size)
        expected = angular_lsh_collision_probability(theta, num_buckets)
        if num_buckets == 2:  # hyperplane LSH
            np.testing.assert_allclose(expected, 1 - theta / math.pi, atol=2e-3)
        assert abs(rate - expected) < 3 * standard_error + 5e-3, (theta, rate, expected)
        measured.append(rate)
    assert np.all(np.diff(measured) < 0)


def _full_attention_except_self(layer, x, causal):
    """NumPy reference: shared-QK attention over every key but the query's own (unless it is alone)."""
    wq, bq, _, _, wv, bv, wo, bo = dense_weights(layer)
    b, t, n = x.shape[0], x.shape[1], layer.num_heads
    q = dense(x, wq, bq).reshape(b, t, n, -1)
    v = dense(x, wv, bv).reshape(b, t, n, -1)
    k = q / np.sqrt(np.sum(q**2, -1, keepdims=True) + 1e-6)
    scores = np.einsum("btnh,bsnh->bnts", q, k) / math.sqrt(q.shape[-1])
    allowed = np.tril(np.ones((t, t), bool)) if causal else np.ones((t, t), bool)
    others = allowed & ~np.eye(t, dtype=bool)
    allowed = np.where(others.any(-1, keepdims=True), others, allowed)
    weights = softmax(np.where(allowed, scores, -np.inf))
    out = np.einsum("bnts,bsnh->btnh", weights, v)
    return dense(out.reshape(b, t, -1), wo, bo)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_hashes", [1, 3])
def test_one_bucket_is_full_attention_without_self(causal, num_hashes):
    x = rng.normal(size=(2, 12, 16)).astype("float32")
    layer = LSHAttention(2, 8, num_buckets=1, num_hashes=num_hashes, chunk_length=12, bias_initializer="random_normal")
    out = np.asarray(layer(x, use_causal_mask=causal))
    np.testing.assert_allclose(out, _full_attention_except_self(layer, x, causal), rtol=1e-4, atol=1e-5)


def test_more_hash_rounds_approach_full_attention():
    x = rng.normal(size=(1, 64, 16)).astype("float32")
    first = None
    errors = []
    for rounds in (1, 2, 4, 16):
        layer = LSHAttention(2, 8, num_buckets=4, num_hashes=rounds, chunk_length=32, seed=rounds)
        layer.build(x.shape)
        first = first or layer
        for name in ("query_dense", "value_dense", "output_dense"):  # the same projections each time
            getattr(layer, name).set_weights(getattr(first, name).get_weights())
        out = np.asarray(layer(x))
        errors.append(np.abs(out - _full_attention_except_self(layer, x, False)).mean())
    assert errors[0] > errors[1] > errors[2] > errors[3]
    assert errors[3] < 0.1 * errors[0]


def test_cached_decoding_equals_the_parallel_form_in_one_chunk():
    x = rng.normal(size=(2, 16, 16)).astype("float32")
    layer = LSHAttention(2, 8, num_buckets=4, num_hashes=3, chunk_length=16, seed=0, position=RotaryEmbedding())
    full = np.asarray(layer(x, use_causal_mask=True))
    cached, _ = decode_in_steps(layer, x, 6, layer.init_cache(2, 16))
    np.testing.assert_allclose(cached, full, rtol=1e-4, atol=1e-5)


def test_causal_chunks_do_not_see_the_future():
    x = rng.normal(size=(1, 32, 16)).astype("float32")
    layer = LSHAttention(2, 8, num_buckets=4, num_hashes=2, chunk_length=8, seed=0)
    base = np.asarray(layer(x, use_causal_mask=True))
    changed = x.copy()
    changed[:, 20:] += 5.0
    np.testing.assert_allclose(np.asarray(layer(changed, use_causal_mask=True))[:, :20], base[:, :20], atol=1e-5)


def test_bad_input():
    with pytest.raises(ValueError, match="Received: num_buckets=3"):
        LSHAttention(2, 4, num_buckets=3)
    with pytest.raises(ValueError, match="Received: num_buckets=0"):
        LSHAttention(2, 4, num_buckets=0)
    with pytest.raises(ValueError, match="Received: num_key_value_heads=1"):
        LSHAttention(2, 4, num_key_value_heads=1)
    with pytest.raises(ValueError, match="cannot add a score bias"):
        LSHAttention(2, 4, position=ALiBiBias(2))
    with pytest.raises(ValueError, match="LSHAttention cannot apply an attention pattern"):
        LSHAttention(2, 4, pattern={"name": "sliding_window", "window": 4})
    layer = LSHAttention(2, 4, chunk_length=8)
    with pytest.raises(ValueError, match="is self-attention"):
        layer(np.zeros((1, 8, 8), "float32"), np.ones((1, 8, 8), "float32"))
