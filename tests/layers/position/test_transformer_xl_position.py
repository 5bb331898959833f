import math

import numpy as np
import pytest
from harness import LayerHarness
from reference import dense, softmax
from reference_memory import sinusoid, transformer_xl_scores

from keras_tfam.layers import MultiHeadAttention, TransformerXLPosition, sinusoid_encoding
from keras_tfam.ops import relative_shift

rng = np.random.default_rng(0)


class TestTransformerXLPositionHarness(LayerHarness):
    layer_cls = TransformerXLPosition
    init_kwargs = {"num_heads": 2, "bias_initializer": "random_normal"}
    # Queries are the last 4 of 7 positions (a segment after 3 memory slots).
    call_kwargs = {"query_offset": 3}

    def make_inputs(self):
        return {
            "query": rng.normal(size=(2, 4, 2, 4)).astype("float32"),
            "key": rng.normal(size=(2, 7, 2, 4)).astype("float32"),
            "value": rng.normal(size=(2, 7, 2, 4)).astype("float32"),
            "attention_mask": np.tril(np.ones((4, 7), bool), k=3)[None].repeat(2, 0),
        }


class TestAttentionWithMemoryHarness(LayerHarness):
    layer_cls = MultiHeadAttention
    call_kwargs = {"use_causal_mask": True}

    @property
    def init_kwargs(self):
        return {"num_heads": 2, "key_dim": 4, "position": TransformerXLPosition(2, bias_initializer="random_normal")}

    def make_inputs(self):
        return {
            "query": rng.normal(size=(2, 5, 8)).astype("float32"),
            "memory": rng.normal(size=(2, 3, 8)).astype("float32"),
        }


@pytest.mark.parametrize("length, keys", [(1, 1), (4, 4), (3, 8), (5, 12)])
def test_relative_shift_equals_a_gather_of_each_pairs_distance(length, keys):
    # Per query, a value for each distance d = 0..S-1: laid out by descending
    # distance (column r holds d = S-1-r), shifted, it must equal the explicit
    # gather table[i, (i + S - T) - j] for every key not after the query.
    table = rng.normal(size=(2, 3, length, keys))
    shifted = np.asarray(relative_shift(table[..., ::-1].astype("float32")))
    for i in range(length):
        for j in range(i + keys - length + 1):
            np.testing.assert_allclose(shifted[..., i, j], table[..., i, (i + keys - length) - j], rtol=1e-6)


def test_relative_shift_of_sinusoid_scores_equals_the_gather_of_r():
    # The paper's use: B + D for all distances, shifted == (q_i + v) . W_R R_{i-j} gathered.
    q = rng.normal(size=(1, 3, 2, 4))
    w_r = rng.normal(size=(8, 8))
    length, keys = 3, 7
    distances = np.arange(keys - 1, -1, -1)
    projected = np.stack([sinusoid(d, 8) @ w_r for d in distances]).reshape(keys, 2, 4)
    scores = np.einsum("btnh,lnh->bntl", q, projected).astype("float32")
    shifted = np.asarray(relative_shift(scores))
    for i in range(length):
        for j in range(i + keys - length + 1):
            r = (sinusoid((i + keys - length) - j, 8) @ w_r).reshape(2, 4)
            np.testing.assert_allclose(shifted[0, :, i, j], np.einsum("nh,nh->n", q[0, i], r), rtol=1e-4, atol=1e-5)


def test_sinusoid_encoding_is_the_papers():
    np.testing.assert_allclose(
        sinusoid_encoding(np.array([0, 3, 17]), 8), np.stack([sinusoid(d, 8) for d in (0, 3, 17)]), atol=1e-6
    )


def _scheme_weights(scheme):
    return (np.asarray(w, np.float64) for w in (scheme.content_bias, scheme.position_bias, scheme.position_kernel))


@pytest.mark.parametrize("order", ["consecutive", "ring"])
def test_score_terms_are_the_papers_b_c_d(order):
    # Queries at 5..8, keys at 2..8 (consecutive: the relative shift) or in a
    # ring cache's slot order (the gather): the same three terms per pair.
    scheme = TransformerXLPosition(2, bias_initializer="random_normal")
    scheme.build((None, None, 2, 4))
    q = rng.normal(size=(2, 4, 2, 4)).astype("float32")
    k = rng.normal(size=(2, 7, 2, 4)).astype("float32")
    query_positions = np.arange(5, 9)
    key_positions = np.arange(2, 9) if order == "consecutive" else np.array([7, 8, 2, 3, 4, 5, 6])
    terms = np.asarray(scheme.score_terms(q, k, query_positions.astype("int32"), key_positions.astype("int32")))
    u, v, w_r = _scheme_weights(scheme)
    expected = transformer_xl_scores(q, k, u, v, w_r, query_positions, key_positions)
    visible = query_positions[:, None] >= key_positions[None, :]
    np.testing.assert_allclose(terms[..., visible], expected[1:].sum(0)[..., visible], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("order", ["consecutive", "shuffled"])
def test_keys_after_their_query_get_their_own_signed_distance(order):
    # Without a causal mask every pair is attended: before, the relative shift gave a key after its
    # query another pair's term and the gather clipped its distance to 0 (0.19 apart on the two paths).
    scheme = TransformerXLPosition(2, bias_initializer="random_normal")
    scheme.build((None, None, 2, 4))
    q = rng.normal(size=(2, 5, 2, 4)).astype("float32")
    k = rng.normal(size=(2, 8, 2, 4)).astype("float32")
    query_positions = np.arange(3, 8)
    key_positions = np.arange(0, 8) if order == "consecutive" else np.array([5, 6, 7, 0, 1, 2, 3, 4])
    terms = np.asarray(scheme.score_terms(q, k, query_positions.astype("int32"), key_positions.astype("int32")))
    expected = transformer_xl_scores(q, k, *_scheme_weights(scheme), query_positions, key_positions)
    np.testing.assert_allclose(terms, expected[1:].sum(0), rtol=1e-4, atol=1e-4)


def test_non_causal_attention_is_the_same_on_both_paths():
    layer = MultiHeadAttention(2, 4, position=TransformerXLPosition(2, bias_initializer="random_normal"))
    x = rng.normal(size=(1, 6, 8)).astype("float32")
    full = np.asarray(layer(x))  # consecutive positions: the relative shift
    # A cache written whole, read back with the keys in slot order: the gather. Not causal: every key seen.
    cached, _ = layer(x, cache=layer.init_cache(1, 9), cache_update_index=0)  # empty slots: not consecutive
    np.testing.assert_allclose(np.asarray(cached), full, rtol=1e-5, atol=1e-5)


def test_one_query_terms_are_the_papers():
    scheme = TransformerXLPosition(2, bias_initializer="random_normal")
    scheme.build((None, None, 2, 4))
    q, k = rng.normal(size=(1, 1, 2, 4)).astype("float32"), rng.normal(size=(1, 5, 2, 4)).astype("float32")
    key_positions = np.array([10, 6, 7, 8, 9])
    terms = np.asarray(scheme.score_terms(q, k, np.array([10], "int32"), key_positions.astype("int32")))
    expected = transformer_xl_scores(q, k, *_scheme_weights(scheme), [10], key_positions)
    np.testing.assert_allclose(terms, expected[1:].sum(0), rtol=1e-4, atol=1e-4)


def test_attention_over_memory_weights_are_the_softmax_of_the_four_terms():
    # A segment of 4 after a memory of 3: queries at 3..6, keys at 0..6.
    x = rng.normal(size=(2, 4, 8)).astype("float32")
    memory = rng.normal(size=(2, 3, 8)).astype("float32")
    layer = MultiHeadAttention(2, 4, position=TransformerXLPosition(2, bias_initializer="random_normal"))
    _, weights = layer(x, memory=memory, use_causal_mask=True, return_attention_scores=True)
    source = np.concatenate([memory, x], axis=1).astype(np.float64)
    wq, bq = (np.asarray(w, np.float64) for w in layer.query_dense.get_weights())
    wk, bk = (np.asarray(w, np.float64) for w in layer.key_dense.get_weights())
    q = dense(x, wq, bq).reshape(2, 4, 2, 4)
    k = dense(source, wk, bk).reshape(2, 7, 2, 4)
    terms = transformer_xl_scores(q, k, *_scheme_weights(layer.position), np.arange(3, 7), np.arange(7))
    scores = terms.sum(0) / math.sqrt(4)
    causal = np.arange(3, 7)[:, None] >= np.arange(7)[None, :]
    expected = softmax(np.where(causal, scores, -np.inf))
    np.testing.assert_allclose(weights, expected, atol=1e-5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: num_heads=0"):
        TransformerXLPosition(0)
    with pytest.raises(ValueError, match="Received: encoding_dim=7"):
        TransformerXLPosition(2, encoding_dim=7)
    layer = MultiHeadAttention(2, 4, position=TransformerXLPosition(2))
    x = np.zeros((2, 3, 8), "float32")
    with pytest.raises(ValueError, match=r"Received: memory.shape=\(2, 3, 6\)"):
        layer(x, memory=np.zeros((2, 3, 6), "float32"))
    with pytest.raises(ValueError, match=r"batch size of the queries \(2\).*Received: memory.shape=\(3, 3, 8\)"):
        layer(x, memory=np.zeros((3, 3, 8), "float32"))
