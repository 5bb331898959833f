import numpy as np
import pytest
from backend import tensorflow_only
from harness import LayerHarness
from reference import dense, softmax

from keras_tfam.layers import ALiBiBias, LinearAttention, RotaryEmbedding
from keras_tfam.layers.attention.linear_attention import causal_linear_numerator, prefix_sum

rng = np.random.default_rng(0)


class TestCausalLinearAttentionHarness(LayerHarness):
    layer_cls = LinearAttention
    init_kwargs = {"num_heads": 2, "key_dim": 4, "chunk_size": 3, "position": RotaryEmbedding()}
    call_kwargs = {"use_causal_mask": True}

    def make_inputs(self):
        return {"query": rng.normal(size=(2, 7, 8)).astype("float32")}


class TestExpLinearAttentionHarness(LayerHarness):
    layer_cls = LinearAttention
    init_kwargs = {"num_heads": 2, "key_dim": 4, "feature_map": "exp", "num_key_value_heads": 1}

    def make_inputs(self):
        return {
            "query": rng.normal(size=(2, 3, 8)).astype("float32"),
            "value": rng.normal(size=(2, 6, 5)).astype("float32"),
        }


def _projections(layer, query, value):
    wq, bq, wk, bk, wv, bv, wo, bo = [np.asarray(w, np.float64) for w in layer.get_weights()]
    b, t, s, n = query.shape[0], query.shape[1], value.shape[1], layer.num_heads
    q = dense(query, wq, bq).reshape(b, t, n, -1)
    k = dense(value, wk, bk).reshape(b, s, n, -1)
    v = dense(value, wv, bv).reshape(b, s, n, -1)
    return q, k, v, lambda o: dense(o.reshape(b, t, -1), wo, bo)


def elu1(x):
    return np.where(x > 0, x + 1.0, np.exp(x))


@pytest.mark.parametrize("causal", [False, True])
def test_elu_equals_the_direct_quadratic_kernel(causal):
    x = rng.normal(size=(2, 9, 8)).astype("float32")
    layer = LinearAttention(2, 4, chunk_size=4, bias_initializer="random_normal")
    out = np.asarray(layer(x, use_causal_mask=causal))
    q, k, v, project = _projections(layer, x, x)
    kernel = np.einsum("btnh,bsnh->bnts", elu1(q), elu1(k))  # phi(q_t) . phi(k_s)
    if causal:
        kernel = kernel * np.tril(np.ones((9, 9)))
    expected = np.einsum("bnts,bsnv->btnv", kernel, v) / kernel.sum(-1).transpose(0, 2, 1)[..., None]
    np.testing.assert_allclose(out, project(expected), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_exp_is_shen_efficient_attention(causal):
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    layer = LinearAttention(2, 4, feature_map="exp", chunk_size=4)
    out = np.asarray(layer(x, use_causal_mask=causal))
    q, k, v, project = _projections(layer, x, x)
    rho_q = softmax(q, axis=-1)
    if not causal:
        context = np.einsum("bsnh,bsnv->bnhv", softmax(k, axis=1), v)
        expected = np.einsum("btnh,bnhv->btnv", rho_q, context)
    else:
        expected = np.zeros_like(v)
        for t in range(6):
            rho_k = softmax(k[:, : t + 1], axis=1)  # softmax over the positions up to t
            context = np.einsum("bsnh,bsnv->bnhv", rho_k, v[:, : t + 1])
            expected[:, t] = np.einsum("bnh,bnhv->bnv", rho_q[:, t], context)
    np.testing.assert_allclose(out, project(expected), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("feature_map", ["elu", "exp"])
def test_recurrence_equals_parallel_form_step_by_step(feature_map):
    x = rng.normal(size=(2, 11, 16)).astype("float32")
    layer = LinearAttention(
        4, 4, num_key_value_heads=2, feature_map=feature_map, chunk_size=4, position=RotaryEmbedding()
    )
    full = np.asarray(layer(x, use_causal_mask=True))
    cache = layer.init_cache(2)
    out, cache = layer(x[:, :5], cache=cache, cache_update_index=0)  # prefill
    outs = [np.asarray(out)]
    for t in range(5, 11):
        out, cache = layer(x[:, t : t + 1], cache=cache, cache_update_index=t)
        outs.append(np.asarray(out))
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=1e-4, atol=1e-5)
    assert cache.shape == (2, 4, 4, 5)  # O(1) state: independent of the length


def test_chunked_numerator_equals_masked_products():
    q, k = rng.random((2, 2, 10, 3, 4)).astype("float32")
    v = rng.normal(size=(2, 10, 3, 5)).astype("float32")
    numerator, state = causal_linear_numerator(q, k, v, chunk_size=4)
    # float64 reference; float32 sums of up to 40 terms of the data's magnitude.
    q, k, v = (x.astype("float64") for x in (q, k, v))
    expected = np.einsum("btnh,bsnh,ts,bsnv->btnv", q, k, np.tril(np.ones((10, 10))), v)
    expected_state = np.einsum("bsnh,bsnv->bnhv", k, v)
    for got, want in ((numerator, expected), (state, expected_state)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("length", [1, 5, 16, 17, 300])  # one block, ragged, two and three levels
def test_prefix_sum_equals_cumsum(length):
    x = rng.normal(size=(2, length, 3)).astype("float32")
    block = 4 if length < 100 else 16
    np.testing.assert_allclose(prefix_sum(x, axis=1, block=block), np.cumsum(x, axis=1), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(prefix_sum(x, axis=-1), np.cumsum(x, axis=-1), rtol=1e-5, atol=1e-5)


def test_prefix_sum_bad_block():
    with pytest.raises(ValueError, match="Received: block=1"):
        prefix_sum(np.ones((1, 4, 2), "float32"), block=1)


@tensorflow_only
def test_prefix_sum_of_a_dynamic_length_in_a_graph():
    import tensorflow as tf

    summed = tf.function(lambda x: prefix_sum(x, axis=1), input_signature=[tf.TensorSpec((None, None, 2))])
    x = rng.normal(size=(1, 37, 2)).astype("float32")
    np.testing.assert_allclose(summed(x), np.cumsum(x, axis=1), rtol=1e-5, atol=1e-5)


def test_causality_and_padding():
    x = rng.normal(size=(1, 8, 8)).astype("float32")
    layer = LinearAttention(2, 4, chunk_size=3)
    base = np.asarray(layer(x, use_causal_mask=True))
    changed = x.copy()
    changed[:, 5:] += 3.0
    np.testing.assert_allclose(np.asarray(layer(changed, use_causal_mask=True))[:, :5], base[:, :5], atol=1e-6)
    padding = np.array([[1] * 5 + [0] * 3], bool)
    padded = np.asarray(layer(changed, query_mask=padding, value_mask=padding))
    np.testing.assert_allclose(padded[:, :5], np.asarray(layer(x[:, :5]))[:, :5], atol=1e-5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: feature_map='relu'"):
        LinearAttention(2, 4, feature_map="relu")
    with pytest.raises(ValueError, match="cannot add a score bias"):
        LinearAttention(2, 4, position=ALiBiBias(2))
    layer = LinearAttention(2, 4)
    with pytest.raises(ValueError, match="no `attention_mask`"):
        layer(np.zeros((1, 3, 8), "float32"), attention_mask=np.ones((1, 3, 3), bool))
    with pytest.raises(ValueError, match=r"recurrent state.*Received: cache.shape=\(1, 2, 3, 2, 4\)"):
        layer(np.zeros((1, 1, 8), "float32"), cache=np.zeros((1, 2, 3, 2, 4), "float32"), cache_update_index=0)
