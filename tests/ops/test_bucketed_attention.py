import keras
import numpy as np
import pytest
from reference import softmax

from keras_tfam.ops.bucketed_attention import bucket_order, chunked_bucket_attention

rng = np.random.default_rng(0)


def _seen_by(buckets, chunk_length, causal):
    """NumPy reference of what each query sees over all rounds (Kitaev et al. eq. 3, same bucket only).

    buckets `(R, T)`; returns a boolean `(T, T)`: the union over rounds of the keys that share the
    query's bucket and sit in its chunk or the previous one (cyclically) of the round's sorted order.
    """
    rounds, t = buckets.shape
    chunks = t // chunk_length
    seen = np.zeros((t, t), bool)
    for r in range(rounds):
        order = np.lexsort((np.arange(t), buckets[r]))  # by bucket, then position
        chunk_of = np.empty(t, int)
        chunk_of[order] = np.arange(t) // chunk_length
        near = (chunk_of[None, :] == chunk_of[:, None]) | (chunk_of[None, :] == (chunk_of[:, None] - 1) % chunks)
        seen |= near & (buckets[r][:, None] == buckets[r][None, :])
    if causal:
        seen &= np.tril(np.ones((t, t), bool))
    return seen


def test_bucket_order_sorts_by_bucket_then_position():
    buckets = np.array([[2, 0, 1, 0, 2, 1]])
    order, inverse = (np.asarray(a) for a in bucket_order(buckets))
    np.testing.assert_array_equal(order[0], [1, 3, 2, 5, 0, 4])
    np.testing.assert_array_equal(order[0][inverse[0]], np.arange(6))


@pytest.mark.parametrize("causal", [False, True])
def test_rounds_together_are_attention_over_the_union_without_self(causal):
    t, h, rounds = 24, 4, 3
    q, v = rng.normal(size=(2, 1, 2, t, h)).astype("float32")
    buckets = rng.integers(0, 4, size=(1, 2, rounds, t)).astype("int32")
    out = np.asarray(
        chunked_bucket_attention(q, q, v, buckets, buckets, 4, causal=causal, exclude_self=True, deduplicate=True)
    )
    for head in range(2):
        seen = _seen_by(buckets[0, head], 4, causal)
        others = seen & ~np.eye(t, dtype=bool)
        allowed = np.where(others.any(-1, keepdims=True), others, seen)  # self only when alone
        scores = np.where(allowed, q[0, head] @ q[0, head].T / np.sqrt(h), -np.inf)
        np.testing.assert_allclose(out[0, head], softmax(scores) @ v[0, head], rtol=1e-4, atol=1e-5)


def test_separate_query_and_key_buckets_padding_and_unseen_queries():
    t, h = 16, 4
    q, k, v = rng.normal(size=(3, 1, 1, t, h)).astype("float32")
    query_buckets = rng.integers(0, 3, size=(1, 1, 1, t)).astype("int32")
    key_buckets = rng.integers(0, 3, size=(1, 1, 1, t)).astype("int32")
    padding = np.ones((1, t), bool)
    padding[0, -3:] = False
    out = np.asarray(chunked_bucket_attention(q, k, v, query_buckets, key_buckets, 4, key_padding_mask=padding))
    # Reference: queries sorted by their buckets, keys by theirs, chunk i of queries sees chunks i, i-1 of keys.
    slot_q = np.empty(t, int)
    slot_q[np.lexsort((np.arange(t), query_buckets[0, 0, 0]))] = np.arange(t) // 4
    slot_k = np.empty(t, int)
    slot_k[np.lexsort((np.arange(t), key_buckets[0, 0, 0]))] = np.arange(t) // 4
    near = (slot_k[None] == slot_q[:, None]) | (slot_k[None] == (slot_q[:, None] - 1) % 4)
    allowed = near & (query_buckets[0, 0, 0][:, None] == key_buckets[0, 0, 0][None]) & padding[0][None]
    scores = np.where(allowed, q[0, 0] @ k[0, 0].T / 2.0, -np.inf)
    expected = np.where(
        allowed.any(-1, keepdims=True), softmax(np.where(allowed.any(-1, keepdims=True), scores, 0.0)) @ v[0, 0], 0.0
    )
    np.testing.assert_allclose(out[0, 0], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="a graph of unknown lengths (SavedModel export)")
@pytest.mark.parametrize("length", [5, 16])  # shorter than one chunk; two chunks
def test_unknown_length_in_a_graph_equals_the_static_form(length):
    import tensorflow as tf

    q, v = rng.normal(size=(2, 1, 2, length, 4)).astype("float32")
    buckets = rng.integers(0, 3, size=(1, 2, 2, length)).astype("int32")

    def attend(q, v, buckets):
        return chunked_bucket_attention(q, q, v, buckets, buckets, 8, causal=True, exclude_self=True, deduplicate=True)

    graph = tf.function(
        attend,
        input_signature=[
            tf.TensorSpec((None, None, None, 4)),
            tf.TensorSpec((None, None, None, 4)),
            tf.TensorSpec((None, None, 2, None), tf.int32),
        ],
    )
    np.testing.assert_allclose(graph(q, v, buckets), attend(q, v, buckets), rtol=1e-5, atol=1e-6)
