import numpy as np
import pytest
from attention_checks import dense_weights
from harness import LayerHarness
from reference import softmax

from keras_tfam.layers import ALiBiBias, CosineAttention

rng = np.random.default_rng(0)


class TestCosineAttentionHarness(LayerHarness):
    layer_cls = CosineAttention
    init_kwargs = {"num_heads": 2, "key_dim": 4, "num_key_value_heads": 1, "temperature_initializer": "random_normal"}
    call_kwargs = {"use_causal_mask": True}

    def make_inputs(self):
        return {"query": rng.normal(size=(2, 6, 8)).astype("float32")}


def numpy_cosine_attention(layer, x, slopes=None):
    """Liu et al. 2022, eq. 2: softmax(cos(q_i, k_j) / tau + B_ij) v, per head, causal;
    1 / tau = exp(min(s, log 100))."""
    wq, bq, wk, bk, wv, bv, wo, bo = dense_weights(layer)
    n, kv, h = layer.num_heads, layer.num_key_value_heads, layer.key_dim
    b, t, _ = x.shape
    q = (x @ wq + bq).reshape(b, t, n, h)
    k = np.repeat((x @ wk + bk).reshape(b, t, kv, h), n // kv, axis=2)
    v = np.repeat((x @ wv + bv).reshape(b, t, kv, h), n // kv, axis=2)
    unit = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731
    inverse_tau = np.exp(np.minimum(np.asarray(layer.log_scale, np.float64), np.log(100.0)))
    scores = np.einsum("btnh,bsnh->bnts", unit(q), unit(k)) * inverse_tau[None, :, None, None]
    if slopes is not None:
        distance = np.arange(t)[None, :] - np.arange(t)[:, None]
        scores = scores + slopes[None, :, None, None] * distance[None, None]
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    out = np.einsum("bnts,bsnh->btnh", softmax(scores), v).reshape(b, t, n * h)
    return out @ wo + bo


@pytest.mark.parametrize("with_alibi", [False, True])
def test_matches_the_papers_formula(with_alibi):
    x = rng.normal(size=(2, 7, 8)).astype("float32") * 3
    position = ALiBiBias(2) if with_alibi else None
    layer = CosineAttention(2, 4, num_key_value_heads=1, position=position, temperature_initializer="random_normal")
    out = np.asarray(layer(x, use_causal_mask=True))
    slopes = np.asarray(position.slopes, np.float64) if with_alibi else None
    np.testing.assert_allclose(out, numpy_cosine_attention(layer, x, slopes), rtol=1e-4, atol=1e-5)


def test_the_temperature_is_bounded_and_scale_refused():
    layer = CosineAttention(1, 4, temperature_initializer="ones")
    x = rng.normal(size=(1, 3, 4)).astype("float32")
    layer(x)
    layer.log_scale.assign(np.array([10.0], "float32"))  # 1 / tau capped at 100
    np.testing.assert_allclose(np.asarray(layer(x, use_causal_mask=True)), numpy_cosine_attention(layer, x), atol=1e-4)
    with pytest.raises(ValueError, match="takes no `scale`. Received: scale=0.5"):
        CosineAttention(2, 4, scale=0.5)
