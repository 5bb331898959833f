import numpy as np
import pytest
from attention_checks import decode_in_steps, dense_weights
from harness import LayerHarness
from reference import attention, dense

from keras_tfam.layers import RotaryEmbedding
from keras_tfam.layers.attention.performer_attention import PerformerAttention

rng = np.random.default_rng(0)


class TestPerformerAttentionHarness(LayerHarness):
    layer_cls = PerformerAttention
    init_kwargs = {
        "num_heads": 2,
        "key_dim": 4,
        "num_features": 8,
        "redraw": 1,
        "seed": 0,
        "chunk_size": 3,
        "position": RotaryEmbedding(),
    }
    call_kwargs = {"use_causal_mask": True}

    def make_inputs(self):
        return {"query": rng.normal(size=(2, 7, 8)).astype("float32")}


def _heads(layer, x):
    """q, k, v `(B, T, N, H)` in float64 from the layer's projection weights, and the output projection."""
    wq, bq, wk, bk, wv, bv, wo, bo = dense_weights(layer)
    b, t, n = x.shape[0], x.shape[1], layer.num_heads
    heads = [dense(x, w, bias).reshape(b, t, n, -1) for w, bias in ((wq, bq), (wk, bk), (wv, bv))]
    return heads, lambda o: dense(o.reshape(b, t, -1), wo, bo)


def favor_plus(x, w):
    """Choromanski et al. Lemma 1 on `x / H^(1/4)`: exp(w . x - |x|^2 / 2) / sqrt(m)."""
    x = x / x.shape[-1] ** 0.25
    return np.exp(x @ w.T - 0.5 * np.sum(x**2, -1, keepdims=True)) / np.sqrt(w.shape[0])


@pytest.mark.parametrize("causal", [False, True])
def test_equals_linear_attention_with_favor_plus_features(causal):
    x = rng.normal(size=(2, 9, 8)).astype("float32")
    layer = PerformerAttention(2, 4, num_features=16, seed=3, chunk_size=4, bias_initializer="random_normal")
    out = np.asarray(layer(x, use_causal_mask=causal))
    (q, k, v), project = _heads(layer, x)
    w = np.asarray(layer.phi.projection.value, np.float64)
    kernel = np.einsum("btnm,bsnm->bnts", favor_plus(q, w), favor_plus(k, w))
    if causal:
        kernel = kernel * np.tril(np.ones((9, 9)))
    expected = np.einsum("bnts,bsnv->btnv", kernel, v) / kernel.sum(-1).transpose(0, 2, 1)[..., None]
    np.testing.assert_allclose(out, project(expected), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("features", ["positive", "trigonometric"])
def test_recurrent_cache_equals_the_causal_parallel_form(features):
    x = rng.normal(size=(2, 11, 16)).astype("float32")
    layer = PerformerAttention(
        4,
        4,
        num_features=12,
        features=features,
        num_key_value_heads=2,
        chunk_size=4,
        seed=0,
        position=RotaryEmbedding(),
    )
    full = np.asarray(layer(x, use_causal_mask=True))
    cached, cache = decode_in_steps(layer, x, 5, layer.init_cache(2))  # a prefill of 5, then 6 steps
    np.testing.assert_allclose(cached, full, rtol=1e-4, atol=1e-5)
    assert cache.shape == (2, 4, layer.feature_dim, 5)  # O(1) state of M features


def test_approaches_softmax_attention_as_features_grow():
    """The same projections, features redrawn with 4 seeds: the mean error falls as the features grow."""
    x = rng.normal(size=(1, 32, 16)).astype("float32")
    base = PerformerAttention(2, 8, num_features=8, seed=0, kernel_initializer="random_normal")
    base.build(x.shape)
    (q, k, v), project = _heads(base, x)
    exact = project(attention(q, k, v)[0])
    projections = ("query_dense", "key_dense", "value_dense", "output_dense")
    errors = []
    for m in (8, 64, 512):
        error = 0.0
        for seed in range(4):
            layer = PerformerAttention(2, 8, num_features=m, seed=seed)
            layer.build(x.shape)
            for name in projections:
                getattr(layer, name).set_weights(getattr(base, name).get_weights())
            error += np.abs(np.asarray(layer(x)) - exact).mean() / 4
        errors.append(error)
    assert errors[2] < errors[1] < errors[0]


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: features='relu'"):
        PerformerAttention(2, 4, features="relu")
    with pytest.raises(ValueError, match="Received: num_features=0"):
        PerformerAttention(2, 4, num_features=0)


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.mark.parametrize("causal", [False, True])
def test_keys_of_large_norm_keep_softmax_attention(causal):
    """Keys of norms 10-30 (|k| / H^(1/4) = 6-18): their features, near exp(-|k|^2 / 2), once sank every
    product below the normaliser's epsilon and the outputs were all zeros. Queries of norm 10 point away
    from the keys (q . k very negative, |q + k| small), where FAVOR+ is accurate: it matches softmax.
    """
    h, t = 8, 16
    draws = np.random.default_rng(0)
    direction = _unit(draws.normal(size=h))
    norms = draws.uniform(10, 30, size=(1, t, 1))
    norms[0, 0] = 10.0  # causally too, every query sees a key as long as itself
    k = (_unit(direction + 0.03 * draws.normal(size=(1, t, h))) * norms).astype("float32")
    q = (-10.0 * _unit(direction + 0.03 * draws.normal(size=(1, t, h)))).astype("float32")
    v = draws.normal(size=(1, t, h)).astype("float32")
    layer = PerformerAttention(1, h, num_features=2048, seed=0)
    layer.build(q.shape)
    for name in ("query_dense", "key_dense", "value_dense", "output_dense"):  # heads = inputs
        getattr(layer, name).set_weights([np.eye(h, dtype="float32"), np.zeros(h, "float32")])
    out = np.asarray(layer(q, value=v, key=k, use_causal_mask=causal))
    mask = np.tril(np.ones((1, t, t), bool)) if causal else None
    expected, weights = attention(q[:, :, None], k[:, :, None], v[:, :, None], mask)
    expected = expected[:, :, 0]
    if not causal:
        assert weights.max(-1).mean() < 0.5  # far from one-hot: the weights matter
    assert np.abs(out - expected).max() < 0.03 * np.abs(expected).max()
    if causal:  # the same stabiliser in the recurrent state: decoding equals the full pass
        cache, outs = layer.init_cache(1), []
        for start, stop in [(0, 5)] + [(s, s + 1) for s in range(5, t)]:
            step, cache = layer(
                q[:, start:stop], value=v[:, start:stop], key=k[:, start:stop], cache=cache, cache_update_index=start
            )
            outs.append(np.asarray(step))
        np.testing.assert_allclose(np.concatenate(outs, axis=1), out, rtol=1e-4, atol=1e-5)
