import numpy as np
import pytest
from block_reference import projection_weights
from harness import LayerHarness
from reference import dense, softmax

from keras_tfam.layers import MemorizingAttention, MultiHeadAttention

rng = np.random.default_rng(0)


def filled_memory(batch, size, kv_heads, head_dim, filled):
    memory = rng.normal(size=(batch, 2, size, kv_heads, head_dim)).astype("float32")
    mask = np.zeros((batch, size), bool)
    mask[:, size - filled :] = True
    return memory, mask


class TestMemorizingAttentionHarness(LayerHarness):
    layer_cls = MemorizingAttention
    init_kwargs = {
        "num_heads": 4,
        "key_dim": 4,
        "num_key_value_heads": 2,
        "memory_size": 10,
        "num_neighbors": 3,
        "gate_initializer": "random_normal",
    }
    call_kwargs = {"use_causal_mask": True}

    def make_inputs(self):
        memory, mask = filled_memory(2, 10, 2, 4, 7)
        return {"query": rng.normal(size=(2, 5, 16)).astype("float32"), "knn_memory": memory, "knn_memory_mask": mask}


def numpy_memorizing(layer, x, memory, memory_mask):
    """Wu et al. 2022: local causal attention + softmax over each head's exact top-k memories, gated."""
    wq, bq, wk, bk, wv, bv, wo, bo = projection_weights(layer)
    gate = np.asarray(layer.gate, np.float64)
    b, t, _ = x.shape
    n, kv, h, k = layer.num_heads, layer.num_key_value_heads, layer.key_dim, layer.num_neighbors
    q = dense(x, wq, bq).reshape(b, t, n, h)
    causal = np.tril(np.ones((1, t, t), bool))
    kk = np.repeat(dense(x, wk, bk).reshape(b, t, kv, h), n // kv, axis=2)
    vv = np.repeat(dense(x, wv, bv).reshape(b, t, kv, h), n // kv, axis=2)
    s = np.einsum("btnh,bsnh->bnts", q, kk) / np.sqrt(h)
    s = np.where(causal[:, None], s, -np.inf)
    local_heads = np.einsum("bnts,bsnh->btnh", softmax(s), vv)
    out = np.empty_like(local_heads)
    g = 1.0 / (1.0 + np.exp(-gate))
    for bi in range(b):
        slots = np.flatnonzero(memory_mask[bi])
        for ni in range(n):
            mk = memory[bi, 0, slots, ni // (n // kv)].astype(np.float64)
            mv = memory[bi, 1, slots, ni // (n // kv)].astype(np.float64)
            for ti in range(t):
                if len(slots) == 0:
                    out[bi, ti, ni] = local_heads[bi, ti, ni]
                    continue
                scores = mk @ q[bi, ti, ni]
                top = np.argsort(-scores)[:k]
                w = softmax(scores[top] / np.sqrt(h))
                out[bi, ti, ni] = g[ni] * (w @ mv[top]) + (1 - g[ni]) * local_heads[bi, ti, ni]
    return dense(out.reshape(b, t, -1), wo, bo)


@pytest.mark.parametrize("filled", [2, 9])
def test_matches_numpy_with_exact_top_k_retrieval(filled):
    x = rng.normal(size=(2, 5, 16)).astype("float32")
    layer = MemorizingAttention(
        4,
        4,
        num_key_value_heads=2,
        memory_size=9,
        num_neighbors=4,
        gate_initializer="random_normal",
        bias_initializer="random_normal",
    )
    memory, mask = filled_memory(2, 9, 2, 4, filled)
    out = np.asarray(layer(x, knn_memory=memory, knn_memory_mask=mask, use_causal_mask=True))
    expected = numpy_memorizing(layer, x, memory, mask)
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_empty_memory_equals_the_local_layer():
    x = rng.normal(size=(2, 6, 16)).astype("float32")
    layer = MemorizingAttention(4, 4, memory_size=8, num_neighbors=2, gate_initializer="ones")
    local = MultiHeadAttention(4, 4)
    local.build(x.shape)
    empty, empty_mask = layer.init_knn_memory(2)
    out = np.asarray(layer(x, knn_memory=empty, knn_memory_mask=empty_mask, use_causal_mask=True))
    local.set_weights(projection_weights(layer))  # all but the gate
    np.testing.assert_array_equal(out, np.asarray(layer(x, use_causal_mask=True)))
    np.testing.assert_allclose(out, np.asarray(local(x, use_causal_mask=True)), atol=1e-6)


def test_memory_is_first_in_first_out_over_segments():
    layer = MemorizingAttention(2, 4, memory_size=5, num_neighbors=5)
    segments = rng.normal(size=(3, 1, 3, 8)).astype("float32")
    memory, mask = layer.init_knn_memory(1)
    layer(segments[0], knn_memory=memory, knn_memory_mask=mask)
    for segment in segments:
        memory, mask = layer.update_knn_memory(memory, mask, segment)
    # The last 5 of the 9 positions remain, oldest first.
    kept = np.concatenate([np.asarray(layer.compute_key_value_cache(s)) for s in segments], axis=2)[:, :, -5:]
    np.testing.assert_allclose(np.asarray(memory), kept, atol=1e-6)
    assert np.asarray(mask).all()
    # With k = memory_size, memory attention is full softmax attention over the memory.
    x = rng.normal(size=(1, 2, 8)).astype("float32")
    out = layer(x, knn_memory=memory, knn_memory_mask=mask, use_causal_mask=True)
    expected = numpy_memorizing(layer, x, np.asarray(memory), np.asarray(mask))
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: num_neighbors=9, memory_size=8"):
        MemorizingAttention(2, 4, memory_size=8, num_neighbors=9)
    with pytest.raises(ValueError, match="Received: memory_size=0"):
        MemorizingAttention(2, 4, memory_size=0)
    with pytest.raises(ValueError, match="Received: key_dim=4, value_dim=8"):
        MemorizingAttention(2, 4, memory_size=8, value_dim=8)
    layer = MemorizingAttention(2, 4, memory_size=8, num_neighbors=2)
    x = np.zeros((1, 3, 8), "float32")
    with pytest.raises(ValueError, match=r"Received: knn_memory.shape=\(1, 2, 6, 2, 4\)"):
        layer(x, knn_memory=np.zeros((1, 2, 6, 2, 4), "float32"), knn_memory_mask=np.zeros((1, 6), bool))
    with pytest.raises(ValueError, match="Received: knn_memory_mask.shape=None"):
        layer(x, knn_memory=np.zeros((1, 2, 8, 2, 4), "float32"))
    # A kNN store passed as `memory` (Transformer-XL's past hidden states) is refused, naming the shape.
    with pytest.raises(ValueError, match=r"past hidden states.*Received: memory.shape=\(1, 2, 8, 2, 4\)"):
        layer(x, memory=np.zeros((1, 2, 8, 2, 4), "float32"))
