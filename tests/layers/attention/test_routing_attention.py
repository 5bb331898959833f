import numpy as np
import pytest
from attention_checks import decode_in_steps, dense_weights
from harness import LayerHarness
from reference import dense, softmax

from keras_tfam.layers import RotaryEmbedding
from keras_tfam.layers.attention.routing_attention import RoutingAttention

rng = np.random.default_rng(0)


class TestRoutingAttentionHarness(LayerHarness):
    layer_cls = RoutingAttention
    init_kwargs = {
        "num_heads": 4,
        "key_dim": 4,
        "num_key_value_heads": 2,
        "num_clusters": 2,
        "chunk_length": 4,
        "seed": 0,
        "position": RotaryEmbedding(),
    }
    call_kwargs = {"use_causal_mask": True}

    def make_inputs(self):
        return {"query": rng.normal(size=(2, 8, 16)).astype("float32")}


def _unit(x):
    return x / np.sqrt(np.sum(x**2, -1, keepdims=True) + 1e-6)


def _clusters(x, centroids):
    """Nearest centroid by angle, (B, T, N, H) x (N, C, H) -> (B, T, N)."""
    return np.argmax(np.einsum("btnh,nch->btnc", _unit(x), _unit(centroids)), axis=-1)


def test_one_chunk_is_attention_within_each_cluster():
    x = rng.normal(size=(2, 12, 16)).astype("float32")
    layer = RoutingAttention(2, 8, num_clusters=3, chunk_length=12, seed=0, bias_initializer="random_normal")
    out = np.asarray(layer(x, use_causal_mask=True))
    wq, bq, wk, bk, wv, bv, wo, bo = dense_weights(layer)
    q, k, v = (dense(x, w, b).reshape(2, 12, 2, -1) for w, b in ((wq, bq), (wk, bk), (wv, bv)))
    centroids = np.asarray(layer.centroids.value, np.float64)
    same = _clusters(q, centroids)[:, :, None] == _clusters(k, centroids)[:, None]  # (B, T, S, N)
    allowed = np.transpose(same, (0, 3, 1, 2)) & np.tril(np.ones((12, 12), bool))
    scores = np.where(allowed, np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(8), -np.inf)
    weights = np.nan_to_num(softmax(np.where(allowed.any(-1, keepdims=True), scores, 0.0)) * allowed)
    expected = dense(np.einsum("bnts,bsnh->btnh", weights, v).reshape(2, 12, -1), wo, bo)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_every_query_attends_only_within_its_cluster():
    # One head whose values are the one-hot positions and whose output projection is the identity:
    # the layer's output row t is query t's attention weights over the 32 positions.
    t, d = 32, 8
    layer = RoutingAttention(1, 32, num_clusters=4, chunk_length=8, seed=2, use_bias=False, output_dim=t)
    inputs = np.concatenate([rng.normal(size=(1, t, d)), np.eye(t)[None]], axis=-1).astype("float32")
    layer.build(inputs.shape)
    kernel = rng.normal(size=(d + t, 32)).astype("float32")
    kernel[d:] = 0.0  # queries and keys from the random features only
    layer.query_dense.kernel.assign(kernel)
    layer.key_dense.kernel.assign(np.roll(kernel, 3, axis=1))
    layer.value_dense.kernel.assign(np.concatenate([np.zeros((d, t)), np.eye(t)]).astype("float32"))
    layer.output_dense.kernel.assign(np.eye(t, dtype="float32"))
    weights = np.asarray(layer(inputs, use_causal_mask=True))[0]  # (T queries, T keys)
    q = (inputs[0] @ kernel)[None, :, None]
    k = (inputs[0] @ np.roll(kernel, 3, axis=1))[None, :, None]
    centroids = np.asarray(layer.centroids.value)
    same = _clusters(q, centroids)[0, :, 0][:, None] == _clusters(k, centroids)[0, :, 0][None, :]
    attended = weights > 1e-6
    assert attended.any()
    assert not np.any(attended & ~same)  # only within the cluster
    assert not np.any(attended & ~np.tril(np.ones((t, t), bool)))  # and causal
    np.testing.assert_allclose(weights.sum(-1)[attended.any(-1)], 1.0, rtol=1e-5)


def test_centroids_move_toward_the_data():
    x = rng.normal(size=(4, 16, 8)).astype("float32")
    layer = RoutingAttention(2, 4, num_clusters=3, chunk_length=16, decay=0.9, seed=0)
    layer(x)
    wq, bq, wk, bk, *_ = dense_weights(layer)
    q, k = dense(x, wq, bq).reshape(4, 16, 2, 4), dense(x, wk, bk).reshape(4, 16, 2, 4)
    before = np.asarray(layer.centroids.value, np.float64)
    layer(x, training=True)
    # The paper's update: mu <- decay mu + (1 - decay) / 2 (sum of routed unit queries + keys).
    expected = 0.9 * before
    for vectors in (q, k):
        routed = np.eye(3)[_clusters(vectors, before)]  # (B, T, N, C)
        expected += 0.05 * np.einsum("btnc,btnh->nch", routed, _unit(vectors))
    np.testing.assert_allclose(layer.centroids.value, expected, rtol=1e-4, atol=1e-5)

    def fit(centroids):  # mean cosine of each routed vector with its centroid
        vectors = np.concatenate([q, k], axis=1)
        similarity = np.einsum("btnh,nch->btnc", _unit(vectors), _unit(centroids))
        return similarity.max(-1).mean()

    fits = [fit(before), fit(np.asarray(layer.centroids.value))]
    for _ in range(10):
        layer(x, training=True)
    fits.append(fit(np.asarray(layer.centroids.value)))
    assert fits[0] < fits[1] < fits[2]
    layer(x)  # inference leaves them
    assert fits[2] == fit(np.asarray(layer.centroids.value))


def test_cached_decoding_equals_the_parallel_form_in_one_chunk():
    x = rng.normal(size=(2, 16, 16)).astype("float32")
    layer = RoutingAttention(4, 4, num_key_value_heads=2, num_clusters=3, chunk_length=16, seed=0)
    full = np.asarray(layer(x, use_causal_mask=True))
    cached, _ = decode_in_steps(layer, x, 6, layer.init_cache(2, 16))
    np.testing.assert_allclose(cached, full, rtol=1e-4, atol=1e-5)


def test_bad_input():
    with pytest.raises(ValueError, match="Received: num_clusters=0"):
        RoutingAttention(2, 4, num_clusters=0)
    with pytest.raises(ValueError, match="Received: decay=1.0"):
        RoutingAttention(2, 4, decay=1.0)
    with pytest.raises(ValueError, match="RoutingAttention cannot apply an attention pattern"):
        RoutingAttention(2, 4, pattern={"name": "sliding_window", "window": 4})
    with pytest.raises(ValueError, match="RoutingAttention takes no `attention_mask`"):
        RoutingAttention(2, 4)(np.zeros((1, 3, 8), "float32"), attention_mask=np.ones((1, 3, 3), bool))
