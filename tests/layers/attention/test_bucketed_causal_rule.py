"""LSH and routing attention, causally: chunks counted per bucket, so decoding equals the full pass.

The reference is written from the rule, in NumPy loops: a key's rank is the number of earlier keys
of its bucket, a query's rank the number of earlier keys of the query's bucket; a query sees the
keys of its bucket, at or before its position, whose rank // L is the query's or one less (in any
round); softmax over that union, each key once; LSH's shared QK drops the query's own key unless
nothing else is left.
"""

import keras
import numpy as np
import pytest
from attention_checks import decode_in_steps, dense_weights
from reference import softmax

from keras_tfam.layers import RotaryEmbedding
from keras_tfam.layers.attention.lsh_attention import LSHAttention, lsh_buckets
from keras_tfam.layers.attention.routing_attention import RoutingAttention

rng = np.random.default_rng(7)


def _seen(query_buckets, key_buckets, chunk_length):
    """`(T, T)` union over rounds of the causal per-bucket chunk rule; buckets `(R, T)`."""
    rounds, t = key_buckets.shape
    seen = np.zeros((t, t), bool)
    for r in range(rounds):
        key_rank = [sum(key_buckets[r, i] == key_buckets[r, j] for i in range(j)) for j in range(t)]
        for q in range(t):
            query_rank = sum(key_buckets[r, i] == query_buckets[r, q] for i in range(q))
            for j in range(q + 1):
                if key_buckets[r, j] == query_buckets[r, q] and key_rank[j] // chunk_length in (
                    query_rank // chunk_length,
                    query_rank // chunk_length - 1,
                ):
                    seen[q, j] = True
    return seen


def _attend(q, k, v, seen, exclude_self):
    """Softmax over the seen keys; `(T, H)` per head."""
    if exclude_self:
        others = seen & ~np.eye(len(q), dtype=bool)
        seen = np.where(others.any(-1, keepdims=True), others, seen)
    scores = np.where(seen, q @ k.T / np.sqrt(q.shape[-1]), -np.inf)
    weights = np.where(seen.any(-1, keepdims=True), softmax(np.where(seen.any(-1, keepdims=True), scores, 0.0)), 0.0)
    return weights @ v


def _lsh_reference(layer, x):
    wq, bq, _, _, wv, bv, wo, bo = dense_weights(layer)
    rotations = np.asarray(layer.rotations.value, np.float64)
    heads, h = layer.num_heads, layer.key_dim
    out = np.zeros((x.shape[0], x.shape[1], heads * h))
    for b in range(x.shape[0]):
        q = (x[b] @ wq + bq).reshape(len(x[b]), heads, h)
        v = (x[b] @ wv + bv).reshape(len(x[b]), heads, h)
        for n in range(heads):
            k = q[:, n] / np.sqrt(np.sum(q[:, n] ** 2, -1, keepdims=True) + 1e-6)
            buckets = np.asarray(lsh_buckets(k.astype("float32"), rotations.astype("float32"))).T  # (R, T)
            seen = _seen(buckets, buckets, layer.chunk_length)
            out[b, :, n * h : (n + 1) * h] = _attend(q[:, n], k, v[:, n], seen, exclude_self=True)
    return out @ wo + bo


def _routing_reference(layer, x):
    wq, bq, wk, bk, wv, bv, wo, bo = dense_weights(layer)
    centroids = np.asarray(layer.centroids.value, np.float64)
    heads, h = layer.num_heads, layer.key_dim
    unit = lambda a: a / np.sqrt(np.sum(a**2, -1, keepdims=True) + 1e-6)  # noqa: E731
    out = np.zeros((x.shape[0], x.shape[1], heads * h))
    for b in range(x.shape[0]):
        q = (x[b] @ wq + bq).reshape(len(x[b]), heads, h)
        k = (x[b] @ wk + bk).reshape(len(x[b]), heads, h)
        v = (x[b] @ wv + bv).reshape(len(x[b]), heads, h)
        for n in range(heads):
            query_clusters = np.argmax(unit(q[:, n]) @ unit(centroids[n]).T, -1)[None]
            key_clusters = np.argmax(unit(k[:, n]) @ unit(centroids[n]).T, -1)[None]
            seen = _seen(query_clusters, key_clusters, layer.chunk_length)
            out[b, :, n * h : (n + 1) * h] = _attend(q[:, n], k[:, n], v[:, n], seen, exclude_self=False)
    return out @ wo + bo


@pytest.mark.parametrize("length, num_hashes", [(21, 1), (24, 3)])
def test_lsh_causal_full_pass_matches_the_rule_past_one_chunk(length, num_hashes):
    # 21 is not a multiple of the chunk length: padded and masked, not refused.
    x = rng.normal(size=(2, length, 8)).astype("float32")
    layer = LSHAttention(2, 4, num_buckets=4, num_hashes=num_hashes, chunk_length=4, seed=1)
    out = np.asarray(layer(x, use_causal_mask=True))
    np.testing.assert_allclose(out, _lsh_reference(layer, x), rtol=1e-4, atol=1e-4)


def test_routing_causal_full_pass_matches_the_rule_past_one_chunk():
    x = rng.normal(size=(2, 19, 8)).astype("float32")
    layer = RoutingAttention(2, 4, num_clusters=2, chunk_length=3, seed=2)
    out = np.asarray(layer(x, use_causal_mask=True))
    np.testing.assert_allclose(out, _routing_reference(layer, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "make",
    [
        lambda: LSHAttention(2, 4, num_buckets=4, num_hashes=2, chunk_length=4, seed=3, position=RotaryEmbedding()),
        lambda: RoutingAttention(2, 4, num_key_value_heads=1, num_clusters=3, chunk_length=8, seed=4),
    ],
    ids=["lsh", "routing"],
)
@pytest.mark.parametrize("prefill", [1, 7])
def test_decoding_equals_the_full_pass_with_chunks_shorter_than_the_text(make, prefill):
    # Before: routing with chunk_length=8 decoded 0.022 off its full pass.
    x = rng.normal(size=(2, 26, 8)).astype("float32")
    layer = make()
    full = np.asarray(layer(x, use_causal_mask=True))
    cached, _ = decode_in_steps(layer, x, prefill, layer.init_cache(2, 26))
    np.testing.assert_allclose(cached, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", [LSHAttention, RoutingAttention])
@pytest.mark.parametrize("causal", [True, False])
def test_unknown_length_is_padded_and_masked_as_a_known_one(cls, causal):
    # Before: a length unknown at trace time skipped the chunk-multiple check (another chunk length or
    # a reshape error); a known length not a multiple of the chunk was refused.
    layer = cls(2, 4, chunk_length=4, seed=5)
    x = rng.normal(size=(1, 10, 8)).astype("float32")
    eager = np.asarray(layer(x, use_causal_mask=causal))
    inputs = keras.Input((None, 8))
    model = keras.Model(inputs, layer(inputs, use_causal_mask=causal))
    np.testing.assert_allclose(np.asarray(model(x)), eager, rtol=1e-5, atol=1e-5)
    # Right padding changes nothing for the real tokens.
    padded = np.concatenate([x, rng.normal(size=(1, 3, 8)).astype("float32")], axis=1)
    mask = np.array([[True] * 10 + [False] * 3])
    if causal:
        np.testing.assert_allclose(
            np.asarray(layer(padded, query_mask=mask, use_causal_mask=True))[:, :10], eager, rtol=1e-5, atol=1e-5
        )
