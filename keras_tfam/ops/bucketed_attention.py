"""Attention within buckets of sorted positions: the core of LSH (Reformer) and routing attention.

Queries and keys carry a bucket id per round (an LSH hash, a k-means
cluster). Each round sorts the positions by (bucket, position), cuts the
sorted sequence into chunks of `L`, and lets each chunk of queries attend
to the same chunk and the previous one of keys (Kitaev et al. 2020, eq. 3),
only to keys of its own bucket, under the causal and window rules of the
original positions. Cost per round: `T x 2L` scores instead of `T x T`.
Rounds are combined by their log-sum-exps (Reformer's multi-round LSH).
"""

from keras import ops

_MASKED_SCORE = -1e9
# A token's score with itself when self-attention is discouraged: far below
# any real score but above the masked ones, so a query alone in its bucket
# still attends to itself (Reformer).
SELF_SCORE = -1e5


def bucket_order(buckets):
    """Positions sorted by `(bucket, position)`, and the inverse permutation.

    Args:
        buckets: `(..., T)` int bucket ids.

    Returns:
        `(order, inverse)`, both `(..., T)` int32: `order[s]` is the
        position at sorted slot `s`, `inverse[p]` the slot of position `p`.
    """
    length = ops.shape(buckets)[-1]
    keys = ops.cast(buckets, "int32") * length + ops.arange(length, dtype="int32")
    order = ops.cast(ops.argsort(keys, axis=-1), "int32")
    return order, ops.cast(ops.argsort(order, axis=-1), "int32")


def _gather(x, order):
    """`x (..., T, F)` gathered along `T` by `order (..., T)`."""
    index = ops.broadcast_to(order[..., None], (*ops.shape(order), x.shape[-1]))
    return ops.take_along_axis(ops.broadcast_to(x, (*ops.shape(order), x.shape[-1])), index, axis=-2)


def _chunks(x, chunks, look_back):
    """`(..., T, F)` -> `(..., C, L, F)`, or with `look_back` each chunk then the previous one, `(..., C, 2L, F)`."""
    shape = ops.shape(x)
    x = ops.reshape(x, (*shape[:-2], chunks, -1, x.shape[-1]))
    if look_back:
        x = ops.concatenate([x, ops.roll(x, 1, axis=-3)], axis=-2)
    return x


def chunked_bucket_attention(
    query,
    key,
    value,
    query_buckets,
    key_buckets,
    chunk_length,
    *,
    causal=False,
    window=None,
    key_padding_mask=None,
    exclude_self=False,
    deduplicate=False,
    scale=None,
    dropout=None,
):
    """Attention of each query to the keys of its bucket in its sorted chunk and the previous one.

    Args:
        query, key: `(B, N, T, H)` float32 (same length: self-attention).
        value: `(B, N, T, Hv)`.
        query_buckets, key_buckets: `(B, N, R, T)` int bucket ids in `R`
            rounds. With equal ids (shared-QK hashing), queries and keys share
            one order.
        chunk_length: `L`, a divisor of `T` (or `>= T`: one chunk, which
            then does not look back at itself).
        causal: a query sees keys at positions up to its own.
        window: a query sees keys less than `window` positions away.
        key_padding_mask: `(B, T)` boolean, `True` = real key.
        exclude_self: a query attends to itself only when nothing else is
            left (its score is `SELF_SCORE`).
        deduplicate: with several rounds, a key found in `n` rounds counts
            once (its score lowered by `log n`), so the rounds together are
            attention over the union of what each round sees.
        scale: score multiplier (default `1 / sqrt(H)`).
        dropout: a function applied to the attention weights, or `None`.

    Returns:
        `(B, N, T, Hv)` float32; a query that sees no key in any round gets zeros.
    """
    length = query.shape[2] or ops.shape(query)[2]
    rounds = query_buckets.shape[2]
    chunk_length = min(chunk_length, length) if isinstance(length, int) else ops.minimum(chunk_length, length)
    chunks = length // chunk_length
    look_back = not isinstance(chunks, int) or chunks > 1
    scale = query.shape[-1] ** -0.5 if scale is None else scale

    query_order, query_slots = bucket_order(query_buckets)  # (B, N, R, T)
    shared = key_buckets is query_buckets
    key_order, key_slots = (query_order, query_slots) if shared else bucket_order(key_buckets)

    def by_query(x):  # (B, N, T, F) -> sorted query chunks (B, N, R, C, L, F)
        return _chunks(_gather(x[:, :, None], query_order), chunks, False)

    def by_key(x):  # -> sorted key chunks with the previous one (B, N, R, C, 2L, F)
        return _chunks(_gather(x[:, :, None], key_order), chunks, look_back)

    q, k, v = by_query(query), by_key(key), by_key(value)
    scores = ops.einsum("bnrcqh,bnrckh->bnrcqk", q, k) * scale
    query_positions = ops.reshape(query_order, (*ops.shape(query_order)[:-1], chunks, -1))[..., :, None]
    key_positions = _chunks(key_order[..., None], chunks, look_back)[..., 0][..., None, :]
    same_bucket = ops.equal(
        ops.reshape(_gather(query_buckets[..., None], query_order)[..., 0], ops.shape(query_positions)[:-1])[..., None],
        _chunks(_gather(key_buckets[..., None], key_order), chunks, look_back)[..., 0][..., None, :],
    )
    allowed = same_bucket
    if causal:
        allowed = ops.logical_and(allowed, ops.greater_equal(query_positions, key_positions))
    if window is not None:
        distance = query_positions - key_positions
        allowed = ops.logical_and(allowed, ops.less(distance if causal else ops.abs(distance), window))
    if key_padding_mask is not None:
        padding = ops.broadcast_to(ops.cast(key_padding_mask, "int32")[:, None, None, :, None], (*ops.shape(key_order), 1))
        padding = _chunks(ops.take_along_axis(padding, key_order[..., None], axis=-2), chunks, look_back)[..., 0]
        allowed = ops.logical_and(allowed, ops.cast(padding, "bool")[..., None, :])
    if exclude_self:
        scores = ops.where(ops.equal(query_positions, key_positions), SELF_SCORE, scores)
    if deduplicate and rounds > 1:
        scores = scores - ops.log(_round_counts(query_buckets, key_buckets, query_slots, key_slots, query_order,
                                                key_order, chunk_length, chunks, look_back))
    scores = ops.where(allowed, scores, _MASKED_SCORE)
    # A softmax by hand (rank 6), normalised by the sum rather than through
    # exp(scores - log-sum-exp), which float32 cannot hold exactly near SELF_SCORE.
    highest = ops.max(scores, axis=-1, keepdims=True)
    exponentials = ops.exp(scores - highest)
    sums = ops.sum(exponentials, axis=-1)
    weights = exponentials / sums[..., None]
    log_sums = highest[..., 0] + ops.log(sums)  # (B, N, R, C, L)
    if dropout is not None:
        weights = dropout(weights)
    outputs = ops.einsum("bnrcqk,bnrckv->bnrcqv", weights, v)
    seen = ops.any(allowed, axis=-1)

    # Back to the original order, then the rounds combined by their log-sum-exps.
    def unsort(x):  # (B, N, R, C, L, F) -> (B, N, R, T, F)
        return _gather(ops.reshape(x, (*ops.shape(query_order), x.shape[-1])), query_slots)

    outputs = unsort(outputs)
    seen = unsort(ops.cast(seen, "float32")[..., None])[..., 0] > 0
    if rounds == 1:
        return ops.where(seen[:, :, 0, :, None], outputs[:, :, 0], 0.0)
    log_sums = ops.where(seen, unsort(log_sums[..., None])[..., 0], -1e30)
    round_weights = ops.softmax(log_sums, axis=2)[..., None]  # (B, N, R, T, 1)
    combined = ops.sum(outputs * round_weights, axis=2)
    return ops.where(ops.any(seen, axis=2)[..., None], combined, 0.0)


def _round_counts(query_buckets, key_buckets, query_slots, key_slots, query_order, key_order, chunk_length, chunks,
                  look_back):
    """For each (query, key) pair of each round's chunks: in how many rounds the query sees that key.

    A key is seen in a round when it shares the query's bucket and sits in
    its chunk or the previous one. Returns float32 `(B, N, R, C, L, 2L)`,
    at least 1 (pairs never seen are masked anyway).
    """
    query_places = ops.stack([ops.swapaxes(query_buckets, 2, 3), ops.swapaxes(query_slots // chunk_length, 2, 3)], -1)
    key_places = ops.stack([ops.swapaxes(key_buckets, 2, 3), ops.swapaxes(key_slots // chunk_length, 2, 3)], -1)
    rounds = query_buckets.shape[2]
    # (B, N, T, R * 2) per position -> gathered into each round's chunks.
    query_places = ops.reshape(query_places, (*ops.shape(query_places)[:3], 2 * rounds))
    key_places = ops.reshape(key_places, (*ops.shape(key_places)[:3], 2 * rounds))
    q = _chunks(_gather(query_places[:, :, None], query_order), chunks, False)  # (B, N, R, C, L, 2R)
    k = _chunks(_gather(key_places[:, :, None], key_order), chunks, look_back)  # (B, N, R, C, 2L, 2R)
    q = ops.reshape(q, (*ops.shape(q)[:-1], rounds, 2))[..., None, :, :]  # (B, N, R, C, L, 1, R', 2)
    k = ops.reshape(k, (*ops.shape(k)[:-1], rounds, 2))[..., None, :, :, :]  # (B, N, R, C, 1, 2L, R', 2)
    same_bucket = ops.equal(q[..., 0], k[..., 0])
    near = ops.equal(q[..., 1], k[..., 1])
    if look_back:
        near = ops.logical_or(near, ops.equal(ops.mod(q[..., 1] - 1, chunks), k[..., 1]))
    counts = ops.sum(ops.cast(ops.logical_and(same_bucket, near), "float32"), axis=-1)
    return ops.maximum(counts, 1.0)
