import numpy as np
import pytest
from attention_checks import decode_in_steps, dense_weights
from harness import LayerHarness
from reference import dense

from keras_tfam.layers.attention.random_feature_attention import RandomFeatureAttention

rng = np.random.default_rng(0)


class TestGatedRandomFeatureAttentionHarness(LayerHarness):
    layer_cls = RandomFeatureAttention
    init_kwargs = {"num_heads": 2, "key_dim": 4, "num_features": 6, "gating": True, "seed": 0, "chunk_size": 3}
    call_kwargs = {"use_causal_mask": True}

    def make_inputs(self):
        return {"query": rng.normal(size=(2, 7, 8)).astype("float32")}


def rfa_features(x, w, log_scale):
    """Peng et al. 2021: phi(x) = [sin(w . x), cos(w . x)] / sqrt(m) of l2-normalised, scaled inputs."""
    x = x / np.linalg.norm(x, axis=-1, keepdims=True) * np.exp(log_scale)[:, None]
    projected = x @ w.T
    return np.concatenate([np.sin(projected), np.cos(projected)], -1) / np.sqrt(w.shape[0])


@pytest.mark.parametrize("gating", [False, True])
def test_parallel_form_equals_the_gated_recurrence_of_the_paper(gating):
    x = rng.normal(size=(2, 13, 8)).astype("float32")
    layer = RandomFeatureAttention(
        2, 4, num_features=8, gating=gating, seed=1, chunk_size=4, bias_initializer="random_normal"
    )
    out = np.asarray(layer(x, use_causal_mask=True))
    wq, bq, wk, bk, wv, bv, wo, bo = dense_weights(layer)
    b, t, n = 2, 13, 2
    q, k, v = (dense(x, w, bias).reshape(b, t, n, -1) for w, bias in ((wq, bq), (wk, bk), (wv, bv)))
    w = np.asarray(layer.phi.projection.value, np.float64)
    log_scale = np.asarray(layer.phi.log_scale.value, np.float64)
    phi_q, phi_k = rfa_features(q, w, log_scale), rfa_features(k, w, log_scale)
    gates, keep = np.ones((b, t, n)), np.ones((b, t, n))  # no gate: S_t = S_{t-1} + phi(k_t) v_t^T
    if gating:
        wg, bg = (
            np.asarray(layer.gate_dense.kernel.value, np.float64),
            np.asarray(layer.gate_dense.bias.value, np.float64),
        )
        gates = 1 / (1 + np.exp(-(x @ wg + bg)))
        keep = 1 - gates
    expected = np.zeros_like(v)
    s = np.zeros((b, n, 16, 4))
    z = np.zeros((b, n, 16))
    for step in range(t):  # eq. 7 of the paper, one step at a time
        g, kept = gates[:, step][..., None], keep[:, step][..., None]
        s = g[..., None] * s + kept[..., None] * np.einsum("bnm,bnv->bnmv", phi_k[:, step], v[:, step])
        z = g * z + kept * phi_k[:, step]
        expected[:, step] = (
            np.einsum("bnm,bnmv->bnv", phi_q[:, step], s) / np.einsum("bnm,bnm->bn", phi_q[:, step], z)[..., None]
        )
    np.testing.assert_allclose(out, dense(expected.reshape(b, t, -1), wo, bo), rtol=1e-3, atol=1e-4)


def test_gated_recurrent_cache_equals_the_parallel_form():
    x = rng.normal(size=(2, 70, 8)).astype("float32")  # several chunks and prefix-sum blocks
    layer = RandomFeatureAttention(2, 4, num_features=8, gating=True, seed=0, chunk_size=4)
    full = np.asarray(layer(x, use_causal_mask=True))
    cached, _ = decode_in_steps(layer, x, 60, layer.init_cache(2))
    np.testing.assert_allclose(cached, full, rtol=1e-4, atol=1e-5)


def test_gating_is_causal_only():
    layer = RandomFeatureAttention(2, 4, num_features=4, gating=True)
    x = np.zeros((1, 3, 8), "float32")
    with pytest.raises(ValueError, match="Received: use_causal_mask=False"):
        layer(x)
    with pytest.raises(ValueError, match="Received: window=2"):
        layer(x, use_causal_mask=True, window=2)
