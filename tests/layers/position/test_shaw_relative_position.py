import numpy as np
import pytest
from harness import LayerHarness
from reference import dense, multi_head_attention
from reference_memory import shaw_attention

from keras_tfam.layers import MultiHeadAttention, ShawRelativePosition

rng = np.random.default_rng(0)


class TestShawRelativePositionHarness(LayerHarness):
    layer_cls = ShawRelativePosition
    init_kwargs = {"max_distance": 2, "embeddings_initializer": "random_normal"}

    def make_inputs(self):
        return {
            "query": rng.normal(size=(2, 5, 2, 4)).astype("float32"),
            "key": rng.normal(size=(2, 6, 2, 4)).astype("float32"),
            "value": rng.normal(size=(2, 6, 2, 4)).astype("float32"),
        }


class TestAttentionWithShawHarness(LayerHarness):
    layer_cls = MultiHeadAttention
    call_kwargs = {"use_causal_mask": True}

    @property
    def init_kwargs(self):
        return {
            "num_heads": 2,
            "key_dim": 4,
            "position": ShawRelativePosition(3, embeddings_initializer="random_normal"),
        }

    def make_inputs(self):
        return {"query": rng.normal(size=(2, 7, 8)).astype("float32")}


def _projections_layers(layer):
    return layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense


def _projections(layer):
    return [w for dense in _projections_layers(layer) for w in dense.get_weights()]


def _shaw_mha(num_heads=2, key_dim=4, **kwargs):
    return MultiHeadAttention(
        num_heads, key_dim, position=ShawRelativePosition(embeddings_initializer="random_normal", **kwargs)
    )


@pytest.mark.parametrize("offsets", [(0, 0), (5, 2)])
def test_matches_the_papers_equations_with_clipping(offsets):
    # T=6 queries, S=9 keys, k=2: most pairs are clipped, on both sides.
    query_offset, key_offset = offsets
    q, k, v = (rng.normal(size=(2, n, 3, 4)).astype("float32") for n in (6, 9, 9))
    mask = rng.random((2, 6, 9)) > 0.3
    layer = ShawRelativePosition(max_distance=2, embeddings_initializer="random_normal")
    out = layer(q, k, v, attention_mask=mask, query_offset=query_offset, key_offset=key_offset)
    key_table, value_table = (np.asarray(w) for w in layer.get_weights())
    expected = shaw_attention(q, k, v, key_table, value_table, 2, mask, query_offset, key_offset)
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_inside_attention_matches_numpy():
    x = rng.normal(size=(2, 7, 8)).astype("float32")
    layer = _shaw_mha(max_distance=3)
    out = layer(x, use_causal_mask=True)
    key_table, value_table = (np.asarray(w, np.float64) for w in layer.position.get_weights())
    wq, bq, wk, bk, wv, bv, wo, bo = (np.asarray(w, np.float64) for w in _projections(layer))
    heads = lambda a: a.reshape(2, 7, 2, 4)  # noqa: E731
    causal = np.broadcast_to(np.tril(np.ones((7, 7), bool)), (2, 7, 7))
    z = shaw_attention(
        heads(dense(x, wq, bq)), heads(dense(x, wk, bk)), heads(dense(x, wv, bv)), key_table, value_table, 3, causal
    )
    np.testing.assert_allclose(out, dense(z.reshape(2, 7, 8), wo, bo), atol=1e-5)


@pytest.mark.parametrize("use_value_term", [True, False])
def test_zero_tables_equal_vanilla_attention(use_value_term):
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    shaw = MultiHeadAttention(
        2, 4, position=ShawRelativePosition(2, use_value_term=use_value_term, embeddings_initializer="zeros")
    )
    out = shaw(x, use_causal_mask=True)
    weights = _projections(shaw)
    vanilla = MultiHeadAttention(2, 4)
    vanilla(x)
    for projection, source in zip(_projections_layers(vanilla), _projections_layers(shaw)):
        projection.set_weights(source.get_weights())
    np.testing.assert_allclose(out, vanilla(x, use_causal_mask=True), atol=1e-6)
    causal = np.tril(np.ones((1, 6, 6), bool))
    expected = multi_head_attention(x, x, [np.asarray(w, np.float64) for w in weights], 2, 2, causal)
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: max_distance=0"):
        ShawRelativePosition(max_distance=0)
    with pytest.raises(ValueError, match="Received: key_dim=-4"):
        ShawRelativePosition(key_dim=-4)
    with pytest.raises(ValueError, match="needs `key_dim`"):
        ShawRelativePosition().build(None)
