"""Exact k-nearest-neighbour search: a batched matmul, then top-k (chunked over the keys)."""

from keras import ops

from keras_tfam.utils import check_positive_int

METRICS = ("l2", "inner_product")


def _chunk_scores(queries, keys, metric, key_mask):
    """Scores where larger is nearer: `q.k` or `2 q.k - |k|^2` (= `|q|^2 - |q - k|^2`)."""
    if len(keys.shape) == 2:
        products = ops.matmul(queries, ops.transpose(keys))  # [..., Q, n]
    else:
        products = ops.matmul(queries, ops.swapaxes(keys, -1, -2))
    if metric == "l2":
        products = 2.0 * products - ops.expand_dims(ops.sum(ops.square(keys), axis=-1), -2)
    if key_mask is not None:
        products = ops.where(ops.expand_dims(ops.cast(key_mask, "bool"), -2), products, float("-inf"))
    return products


def nearest_neighbors(queries, keys, k, metric="l2", key_mask=None, chunk_size=None):
    """The exact `k` nearest keys of every query, nearest first.

    Brute force, as kNN-LM's exact search (Khandelwal et al. 2020) and the
    Memorizing Transformer's exact variant (Wu et al. 2022): one matmul of the
    queries against the keys and a top-k. With `chunk_size` the keys are
    searched in chunks whose top-k are merged, so the score matrix stays
    `(Q, chunk_size)` whatever the number of keys.

    Args:
        queries: `(..., Q, D)`.
        keys: `(N, D)`, shared by every query, or `(..., N, D)` with the
            leading axes of `queries` (one key set per batch row / head).
        k: neighbours per query, `1 <= k <= N`.
        metric: `"l2"` (squared Euclidean distance, smallest first) or
            `"inner_product"` (largest first).
        key_mask: boolean `(N,)` or `(..., N)`, `True` = a real key. Masked
            keys are never preferred to a real one; when fewer than `k` keys
            are real, the rest of the result is masked entries with distance
            `+inf` (`"l2"`) or score `-inf` (`"inner_product"`).
        chunk_size: keys per chunk (static `N` needed); default: all at once.

    Returns:
        `(distances (..., Q, k) float32, indices (..., Q, k) int32)`; for
        `"inner_product"` the first tensor holds the scores `q . k`.

    Examples:
        >>> keys = np.random.rand(1000, 16).astype("float32")
        >>> distances, indices = nearest_neighbors(keys[:3], keys, k=8)
        >>> keras.ops.convert_to_numpy(indices)[:, 0]  # each key is its own nearest
        array([0, 1, 2], dtype=int32)
    """
    if metric not in METRICS:
        raise ValueError(f"`metric` must be one of {METRICS}. Received: metric={metric!r}")
    check_positive_int("k", k)
    num_keys = keys.shape[-2]
    if num_keys == 0:
        raise ValueError(f"There are no keys to search. Received: keys.shape={tuple(keys.shape)}")
    if num_keys is not None and k > num_keys:
        raise ValueError(f"`k` must be at most the number of keys ({num_keys}). Received: k={k}")
    if chunk_size is not None:
        check_positive_int("chunk_size", chunk_size)
        if num_keys is None:
            raise ValueError("`chunk_size` needs a static number of keys. Received: keys.shape=(..., None, D)")
    queries = ops.cast(queries, "float32")
    keys = ops.cast(keys, "float32")
    bounds = [(0, None)]
    if chunk_size is not None:
        bounds = [(start, min(start + chunk_size, num_keys)) for start in range(0, num_keys, chunk_size)]
    best_scores = best_indices = None
    for start, stop in bounds:
        mask = None if key_mask is None else key_mask[..., start:stop]
        scores = _chunk_scores(queries, keys[..., start:stop, :], metric, mask)
        scores, indices = ops.top_k(scores, min(k, scores.shape[-1] or k))
        indices = ops.cast(indices, "int32") + start
        if best_scores is not None:
            # Merge with the best so far: the top-k of the union of two top-k sets.
            scores = ops.concatenate([best_scores, scores], axis=-1)
            indices = ops.concatenate([best_indices, indices], axis=-1)
            scores, order = ops.top_k(scores, min(k, scores.shape[-1]))
            indices = ops.take_along_axis(indices, order, axis=-1)
        best_scores, best_indices = scores, indices
    if metric == "l2":
        # |q - k|^2 = |q|^2 - (2 q.k - |k|^2); rounding can take it just below 0.
        query_norms = ops.expand_dims(ops.sum(ops.square(queries), axis=-1), -1)
        return ops.maximum(query_norms - best_scores, 0.0), best_indices
    return best_scores, best_indices
