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
        padding = ops.broadcast_to(
            ops.cast(key_padding_mask, "int32")[:, None, None, :, None], (*ops.shape(key_order), 1)
        )
        padding = _chunks(ops.take_along_axis(padding, key_order[..., None], axis=-2), chunks, look_back)[..., 0]
        allowed = ops.logical_and(allowed, ops.cast(padding, "bool")[..., None, :])
    if exclude_self:
        scores = ops.where(ops.equal(query_positions, key_positions), SELF_SCORE, scores)
    if deduplicate and rounds > 1:
        scores = scores - ops.log(
            _round_counts(
                query_buckets,
                key_buckets,
                query_slots,
                key_slots,
                query_order,
                key_order,
                chunk_length,
                chunks,
                look_back,
            )
        )
    return _attend_and_combine(scores, allowed, v, query_order, query_slots, rounds, dropout)


def _attend_and_combine(scores, allowed, value, order, slots, rounds, dropout):
    """Each round's chunked softmax, back to position order, the rounds combined by their log-sum-exps.

    `scores`, `allowed`: `(B, N, R, C, L, K)`; `value`: `(B, N, R, C, K, Hv)`;
    `order`, `slots`: `(B, N, R, P)` sorting permutation and its inverse.
    Returns `(B, N, P, Hv)` float32; a query that sees no key gets zeros.
    """
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
    outputs = ops.einsum("bnrcqk,bnrckv->bnrcqv", weights, value)
    seen = ops.any(allowed, axis=-1)

    # Back to the original order, then the rounds combined by their log-sum-exps.
    def unsort(x):  # (B, N, R, C, L, F) -> (B, N, R, P, F)
        return _gather(ops.reshape(x, (*ops.shape(order), x.shape[-1])), slots)

    outputs = unsort(outputs)
    seen = unsort(ops.cast(seen, "float32")[..., None])[..., 0] > 0
    if rounds == 1:
        return ops.where(seen[:, :, 0, :, None], outputs[:, :, 0], 0.0)
    log_sums = ops.where(seen, unsort(log_sums[..., None])[..., 0], -1e30)
    round_weights = ops.softmax(log_sums, axis=2)[..., None]  # (B, N, R, P, 1)
    combined = ops.sum(outputs * round_weights, axis=2)
    return ops.where(ops.any(seen, axis=2)[..., None], combined, 0.0)


def _round_counts(
    query_buckets, key_buckets, query_slots, key_slots, query_order, key_order, chunk_length, chunks, look_back
):
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


# ---------------------------------------------------------------------------------------------------------------
# Causal bucketed attention: chunks counted per bucket, so decoding computes what the full pass does.
#
# Sorting the whole sequence and cutting it into chunks (above) makes the keys a query sees depend on
# the buckets of *later* tokens: a later token of an earlier bucket shifts every chunk boundary after
# it. A causal model trained that way cannot be decoded token by token. Causally, chunks are counted
# inside each bucket instead: a key's rank is the number of earlier keys of its bucket, a query's rank
# the number of earlier keys of the query's bucket, chunk = rank // L, and a query sees the keys of its
# bucket in its chunk and the previous one (and never a later position). Both ranks depend on the past
# only, so the full pass and cached decoding see the same keys. When the sequence fits in one chunk
# this is every earlier key of the bucket, as before.


def bucket_ranks(buckets, positions, valid=None):
    """Ranks for the causal rule: for each key, the number of earlier valid keys of its bucket.

    Args:
        buckets: `(B, N, R, S)` int bucket of each key in each round.
        positions: `(S,)` int absolute positions (`-1`: an empty cache slot, never counted).
        valid: `(B, S)` boolean, `False` for padding (never counted), or `None`.

    Returns:
        `(B, N, R, S)` int32.
    """
    return _earlier_in_bucket(buckets, positions, buckets, positions, valid)


def _earlier_in_bucket(query_buckets, query_positions, key_buckets, key_positions, valid):
    """`(B, N, R, T)`: for each query, the valid keys of the query's bucket at positions before it."""
    same = ops.equal(query_buckets[..., :, None], key_buckets[..., None, :])  # (B, N, R, T, S)
    key_positions = ops.cast(key_positions, "int32")
    earlier = ops.logical_and(
        ops.less(key_positions[None, :], ops.cast(query_positions, "int32")[:, None]),
        ops.greater_equal(key_positions, 0)[None, :],
    )  # (T, S)
    counted = ops.logical_and(same, earlier)
    if valid is not None:
        counted = ops.logical_and(counted, ops.cast(valid, "bool")[:, None, None, None, :])
    return ops.sum(ops.cast(counted, "int32"), axis=-1)


def causal_bucket_rule(query_buckets, query_positions, key_buckets, key_positions, chunk_length, valid=None):
    """Which keys each query sees under the causal per-bucket chunk rule, over all rounds.

    Args:
        query_buckets: `(B, N, R, T)` int; key_buckets: `(B, N, R, S)` int.
        query_positions: `(T,)`; key_positions: `(S,)` (`-1`: empty slot).
        chunk_length: `L`.
        valid: `(B, S)` boolean key padding, or `None`.

    Returns:
        Boolean `(B, N, T, S)`: the union over rounds of the keys of the
        query's bucket, at or before its position, whose chunk is the
        query's or the previous one.
    """
    key_ranks = bucket_ranks(key_buckets, key_positions, valid)
    query_ranks = _earlier_in_bucket(query_buckets, query_positions, key_buckets, key_positions, valid)
    query_chunks = ops.floor_divide(query_ranks, chunk_length)[..., :, None]
    key_chunks = ops.floor_divide(key_ranks, chunk_length)[..., None, :]
    near = ops.logical_or(ops.equal(key_chunks, query_chunks), ops.equal(key_chunks, query_chunks - 1))
    same = ops.equal(query_buckets[..., :, None], key_buckets[..., None, :])
    key_positions = ops.cast(key_positions, "int32")
    causal = ops.logical_and(
        ops.less_equal(key_positions[None, :], ops.cast(query_positions, "int32")[:, None]),
        ops.greater_equal(key_positions, 0)[None, :],
    )
    allowed = ops.any(ops.logical_and(same, near), axis=2)  # (B, N, T, S)
    allowed = ops.logical_and(allowed, causal)
    if valid is not None:
        allowed = ops.logical_and(allowed, ops.cast(valid, "bool")[:, None, None, :])
    return allowed


def causal_chunked_bucket_attention(
    query,
    key,
    value,
    buckets,
    chunk_length,
    *,
    num_buckets,
    window=None,
    key_padding_mask=None,
    exclude_self=False,
    scale=None,
    dropout=None,
):
    """Causal attention under `causal_bucket_rule` with queries and keys in one order (shared QK), in chunks.

    Positions are sorted by (bucket, position) and padded to a multiple of
    `L` (padding sorts last, in bucket `num_buckets`, and is never seen).
    Within a bucket the sorted index minus the bucket's first index is the
    rank, so the keys a query may see lie in its sorted chunk and the two
    before it: `T x 3L` scores per round instead of `T x T`. Rounds are
    combined by their log-sum-exps, each key counted once (a key seen in
    `n` rounds has its score lowered by `log n`): attention over the union.

    Args:
        query, key: `(B, N, T, H)` float32; value: `(B, N, T, Hv)`.
        buckets: `(B, N, R, T)` int in `[0, num_buckets)`.
        chunk_length: `L`.
        num_buckets: the number of buckets (padding takes the next id).
        window: a query sees keys less than `window` positions back, or `None`.
        key_padding_mask: `(B, T)` boolean, `True` = real key (padding is not counted in ranks).
        exclude_self: a query attends to itself only when nothing else is left.
        scale: default `1 / sqrt(H)`.
        dropout: a function applied to the weights, or `None`.

    Returns:
        `(B, N, T, Hv)` float32; a query that sees no key gets zeros.
    """
    shape = ops.shape(query)
    length = shape[2]
    rounds = buckets.shape[2]
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    padded = (length + chunk_length - 1) // chunk_length * chunk_length
    extra = padded - length
    buckets = ops.cast(buckets, "int32")
    if key_padding_mask is not None:  # padding keys join the padding bucket: never seen, never counted
        buckets = ops.where(ops.cast(key_padding_mask, "bool")[:, None, None, :], buckets, num_buckets)
    buckets = ops.pad(buckets, [[0, 0], [0, 0], [0, 0], [0, extra]], constant_values=num_buckets)
    query, key, value = (ops.pad(x, [[0, 0], [0, 0], [0, extra], [0, 0]]) for x in (query, key, value))
    chunks = padded // chunk_length
    order, slots = bucket_order(buckets)  # (B, N, R, P)
    sorted_buckets = ops.take_along_axis(buckets, order, axis=-1)
    # The first sorted index of each bucket: the count of positions in lower buckets.
    counts = ops.sum(ops.one_hot(buckets, num_buckets + 1, dtype="int32"), axis=-2)  # (B, N, R, nb + 1)
    starts = ops.cumsum(counts, axis=-1) - counts
    ranks = ops.arange(padded, dtype="int32") - ops.take_along_axis(starts, sorted_buckets, axis=-1)
    rank_chunks = ops.floor_divide(ranks, chunk_length)  # (B, N, R, P), in sorted order

    def by_query(x):  # (B, N, R, P, F) sorted -> (B, N, R, C, L, F)
        return ops.reshape(x, (*ops.shape(x)[:-2], chunks, chunk_length, x.shape[-1]))

    def by_key(x):  # -> each chunk after the two before it: (B, N, R, C, 3L, F); chunks before the first are absent
        x = by_query(x)
        return ops.concatenate([ops.roll(x, 2, axis=-3), ops.roll(x, 1, axis=-3), x], axis=-2)

    def sort(x):  # (B, N, P, F) -> (B, N, R, P, F)
        return _gather(x[:, :, None], order)

    positions = ops.cast(order[..., None], "int32")  # sorted position of each slot, (B, N, R, P, 1)
    facts = ops.concatenate([positions, sorted_buckets[..., None], rank_chunks[..., None]], axis=-1)
    query_facts, key_facts = by_query(facts), by_key(facts)  # (B, N, R, C, L | 3L, 3)
    chunk_index = ops.arange(chunks, dtype="int32")[:, None]
    lag = ops.repeat(ops.array([2, 1, 0], "int32"), chunk_length)[None, :]
    present = ops.greater_equal(chunk_index - lag, 0)  # (C, 3L): not wrapped around from the end
    q_pos, q_bucket, q_chunk = (query_facts[..., i][..., :, None] for i in range(3))
    k_pos, k_bucket, k_chunk = (key_facts[..., i][..., None, :] for i in range(3))
    allowed = ops.logical_and(ops.equal(q_bucket, k_bucket), ops.less(q_bucket, num_buckets))
    allowed = ops.logical_and(allowed, ops.logical_or(ops.equal(k_chunk, q_chunk), ops.equal(k_chunk, q_chunk - 1)))
    allowed = ops.logical_and(allowed, ops.less_equal(k_pos, q_pos))
    allowed = ops.logical_and(allowed, present[:, None, :])
    if window is not None:
        allowed = ops.logical_and(allowed, ops.less(q_pos - k_pos, window))

    q, k, v = by_query(sort(query)), by_key(sort(key)), by_key(sort(value))
    scores = ops.einsum("bnrcqh,bnrckh->bnrcqk", q, k) * scale
    if exclude_self:
        scores = ops.where(ops.equal(q_pos, k_pos), SELF_SCORE, scores)
    if rounds > 1:
        scores = scores - ops.log(_causal_round_counts(buckets, rank_chunks, slots, order, by_query, by_key))
    combined = _attend_and_combine(scores, allowed, v, order, slots, rounds, dropout)
    return combined[:, :, :length]


def _causal_round_counts(buckets, rank_chunks, slots, order, by_query, by_key):
    """For each (query, key) pair of each round's chunks: in how many rounds the rule lets the query see the key.

    Returns float32 `(B, N, R, C, L, 3L)`, at least 1.
    """
    rounds = buckets.shape[2]
    # (bucket, rank chunk) of every position in every round, in position order: (B, N, P, R, 2).
    chunk_by_position = ops.take_along_axis(rank_chunks, slots, axis=-1)
    places = ops.stack([ops.swapaxes(buckets, 2, 3), ops.swapaxes(chunk_by_position, 2, 3)], -1)
    places = ops.reshape(places, (*ops.shape(places)[:3], 2 * rounds))
    sorted_places = _gather(places[:, :, None], order)  # (B, N, R, P, 2R)
    q = by_query(sorted_places)
    k = by_key(sorted_places)
    q = ops.reshape(q, (*ops.shape(q)[:-1], rounds, 2))[..., :, None, :, :]  # (B, N, R, C, L, 1, R', 2)
    k = ops.reshape(k, (*ops.shape(k)[:-1], rounds, 2))[..., None, :, :, :]  # (B, N, R, C, 1, 3L, R', 2)
    same = ops.equal(q[..., 0], k[..., 0])
    near = ops.logical_or(ops.equal(k[..., 1], q[..., 1]), ops.equal(k[..., 1], q[..., 1] - 1))
    counts = ops.sum(ops.cast(ops.logical_and(same, near), "float32"), axis=-1)
    return ops.maximum(counts, 1.0)
