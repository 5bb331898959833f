import numpy as np
import pytest

from keras_tfam.retrieval import nearest_neighbors

rng = np.random.default_rng(0)


def numpy_top_k(queries, keys, k, metric, key_mask=None):
    """Every distance computed, then a full sort: the exact answer."""
    q, keys = np.asarray(queries, np.float64), np.asarray(keys, np.float64)
    if metric == "l2":
        scores = -((q[..., :, None, :] - keys[..., None, :, :]) ** 2).sum(-1)
    else:
        scores = np.einsum("...qd,...nd->...qn", q, keys)
    if key_mask is not None:
        scores = np.where(np.asarray(key_mask)[..., None, :], scores, -np.inf)
    order = np.argsort(-scores, axis=-1, kind="stable")[..., :k]
    best = np.take_along_axis(scores, order, axis=-1)
    return (-best if metric == "l2" else best), order


@pytest.mark.parametrize("metric", ["l2", "inner_product"])
@pytest.mark.parametrize("chunk_size", [None, 7, 64])
def test_shared_keys_exact_top_k_matches_numpy(metric, chunk_size):
    queries = rng.normal(size=(3, 5, 8)).astype("float32")
    keys = rng.normal(size=(50, 8)).astype("float32")
    distances, indices = nearest_neighbors(queries, keys, 10, metric=metric, chunk_size=chunk_size)
    expected_distances, expected_indices = numpy_top_k(queries, keys, 10, metric)
    np.testing.assert_array_equal(np.asarray(indices), expected_indices)
    np.testing.assert_allclose(np.asarray(distances), expected_distances, rtol=1e-5, atol=1e-4)


def test_batched_keys_with_a_mask_match_numpy():
    # One key set per (batch, head), some slots empty: as the Memorizing Transformer's memory.
    queries = rng.normal(size=(2, 3, 4, 6)).astype("float32")
    keys = rng.normal(size=(2, 3, 20, 6)).astype("float32")
    mask = rng.random((2, 1, 20)) > 0.3
    scores, indices = nearest_neighbors(queries, keys, 5, metric="inner_product", key_mask=mask, chunk_size=8)
    expected_scores, expected_indices = numpy_top_k(
        queries, keys, 5, "inner_product", np.broadcast_to(mask, (2, 3, 20))
    )
    np.testing.assert_array_equal(np.asarray(indices), expected_indices)
    np.testing.assert_allclose(np.asarray(scores), expected_scores, rtol=1e-5, atol=1e-5)


def test_fewer_real_keys_than_k_come_back_masked():
    keys = rng.normal(size=(6, 4)).astype("float32")
    mask = np.array([True, False, True, False, False, False])
    distances, indices = nearest_neighbors(keys[:1], keys, 4, key_mask=mask)
    distances, indices = np.asarray(distances)[0], np.asarray(indices)[0]
    assert indices[0] == 0 and distances[0] == pytest.approx(0.0, abs=1e-5)
    assert set(indices[:2]) == {0, 2}
    assert np.all(np.isinf(distances[2:]))


def test_bad_arguments():
    keys = np.zeros((4, 3), "float32")
    with pytest.raises(ValueError, match="at most the number of keys \\(4\\). Received: k=5"):
        nearest_neighbors(np.zeros((1, 3), "float32"), keys, 5)
    with pytest.raises(ValueError, match="no keys to search"):
        nearest_neighbors(np.zeros((1, 3), "float32"), np.zeros((0, 3), "float32"), 1)
    with pytest.raises(ValueError, match="Received: metric='cosine'"):
        nearest_neighbors(np.zeros((1, 3), "float32"), keys, 1, metric="cosine")
    with pytest.raises(ValueError, match="Received: k=0"):
        nearest_neighbors(np.zeros((1, 3), "float32"), keys, 0)
