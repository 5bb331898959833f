"""Routing attention: online k-means clusters of queries and keys (Roy et al. 2021)."""

import keras
from keras import ops

from keras_tfam.layers.attention.bucketed_attention import BucketedAttention
from keras_tfam.layers.attention.seeded_draws import SeededDraws
from keras_tfam.utils import check_positive_int, check_window


def _unit(x):
    return x / ops.sqrt(ops.sum(ops.square(x), axis=-1, keepdims=True) + 1e-6)


@keras.saving.register_keras_serializable(package="keras_tfam")
class RoutingAttention(SeededDraws, BucketedAttention):
    """Self-attention within clusters learnt by online k-means (Routing Transformer).

    Roy et al. 2021 ("Efficient Content-Based Sparse Attention with Routing
    Transformers"): each head keeps `num_clusters` centroids `mu`; queries
    and keys are routed to the nearest centroid by their unit directions
    (`argmax_c mu_c . x / |mu_c| |x|`), and a query attends only to keys of
    its own cluster. Centroids are not trained by gradients: each training
    call moves them by an exponential moving average toward what was routed
    to them (the paper's eq.: `mu <- decay mu + (1 - decay) / 2 (sum of its
    queries + sum of its keys)`, unit vectors, padding excluded).

    Computed like LSH attention: positions sorted by (cluster, position)
    separately for queries and for keys, cut into chunks of `chunk_length`,
    each chunk of queries attending to the same and the previous chunk of
    keys of its cluster (the paper takes the top `T / C` of each cluster
    instead; both balance the cost, `O(T * chunk_length)`). A query whose
    cluster holds no key it may see (causally) gets zeros. Decoding with a
    KV cache attends to every cached key of the query's cluster.

    Args:
        num_heads, key_dim, value_dim, num_key_value_heads, output_dim,
        use_bias, dropout, position, scale, kernel_initializer,
        bias_initializer, output_kernel_initializer: as in
        `MultiHeadAttention` (`position`: rotary only).
        num_clusters: centroids per head.
        chunk_length: positions per chunk; a sequence longer than it must
            be a multiple of it.
        decay: of the moving average (the paper: 0.999).
        seed: seed of the initial centroids; `None` picks one.

    Call arguments:
        As `MultiHeadAttention` for self-attention: `query` (`value`, if
        given, must be `query`), padding masks, `use_causal_mask`, `window`,
        `cache`, `cache_update_index` (with a cache the attention is
        causal), `training` (centroids move only when `True`). No
        `attention_mask`, no attention scores.

    Returns:
        `(B, T, output_dim)`, or `(outputs, cache)` with a cache.

    Example:

    >>> attention = RoutingAttention(num_heads=4, key_dim=64, num_clusters=16, chunk_length=64)
    >>> attention(keras.random.normal((2, 4096, 256)), use_causal_mask=True).shape
    (2, 4096, 256)
    """

    def __init__(self, num_heads, key_dim, num_clusters=4, chunk_length=64, decay=0.999, seed=None, **kwargs):
        super().__init__(num_heads, key_dim, chunk_length=chunk_length, **kwargs)
        check_positive_int("num_clusters", num_clusters)
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"`decay` must be in [0, 1). Received: decay={decay}")
        self.num_clusters = num_clusters
        self.decay = decay
        self._init_draws(seed, None)

    def build(self, query_shape, value_shape=None, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        shape = (self.num_heads, self.num_clusters, self.key_dim)
        self.centroids = self._build_draws(
            "centroids", shape, lambda seed: _unit(keras.random.normal(shape, seed=seed, dtype="float32"))
        )

    def clusters(self, x):
        """`(B, T, N, H)` heads -> `(B, T, N)` int32 index of the nearest centroid (by angle)."""
        similarity = ops.einsum("btnh,nch->btnc", _unit(ops.cast(x, "float32")), _unit(self.centroids.value))
        return ops.cast(ops.argmax(similarity, axis=-1), "int32")

    def _repeat_kv(self, x):
        groups = self.num_heads // self.num_key_value_heads
        return x if groups == 1 else ops.repeat(x, groups, axis=2)

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        window=None,
        cache=None,
        cache_update_index=None,
        return_attention_scores=False,
        training=None,
    ):
        self._check_call(query, value, key, attention_mask, return_attention_scores)
        if cache is not None:  # MultiHeadAttention's cache, causal; `_compute_attention` below adds the clusters
            return super().call(
                query, query_mask=query_mask, value_mask=value_mask, key_mask=key_mask,
                use_causal_mask=True, window=window, cache=cache, cache_update_index=cache_update_index,
                training=training,
            )
        window = check_window(window)
        _, _, query_mask, key_padding = self._resolve_inputs(query, None, None, query_mask, value_mask, key_mask, None)
        q = self._split_heads(self.query_dense(query), self.num_heads)  # [B, T, N, H]
        k = self._split_heads(self.key_dense(query), self.num_key_value_heads)  # [B, T, K, H]
        v = self._split_heads(self.value_dense(query), self.num_key_value_heads)  # [B, T, K, Hv]
        if self.position is not None:
            q, k = self.position.rotate_query_key(q, k)
        k, v = self._repeat_kv(k), self._repeat_kv(v)
        query_clusters, key_clusters = self.clusters(q), self.clusters(k)  # [B, T, N]
        if training:
            self._move_centroids(q, k, query_clusters, key_clusters, query_mask, key_padding)
        outputs = self._attend_in_chunks(
            q, k, v,
            ops.transpose(query_clusters, (0, 2, 1))[:, :, None],  # [B, N, 1, T]: one round
            ops.transpose(key_clusters, (0, 2, 1))[:, :, None],
            training, causal=use_causal_mask, window=window, key_padding_mask=key_padding,
        )
        return self._output(outputs, query_mask)

    def _move_centroids(self, q, k, query_clusters, key_clusters, query_mask, key_padding):
        """`mu <- decay mu + (1 - decay) / 2 (sum of routed unit queries + keys)` (Roy et al. 2021)."""

        def routed_sums(x, clusters, mask):
            members = ops.one_hot(clusters, self.num_clusters, dtype="float32")  # [B, T, N, C]
            if mask is not None:
                members = members * ops.cast(mask, "float32")[:, :, None, None]
            return ops.einsum("btnc,btnh->nch", members, ops.stop_gradient(_unit(ops.cast(x, "float32"))))

        sums = routed_sums(q, query_clusters, query_mask) + routed_sums(k, key_clusters, key_padding)
        self.centroids.assign(self.decay * self.centroids.value + (1.0 - self.decay) / 2.0 * sums)

    def _compute_attention(self, query, key, value, attention_mask, bias, training, return_attention_scores):
        """Cached decoding: `MultiHeadAttention`'s attention, within the query's cluster."""
        same = ops.equal(self.clusters(query)[:, :, None], self.clusters(self._repeat_kv(key))[:, None])  # [B, T, S, N]
        same = ops.transpose(same, (0, 3, 1, 2))
        mask = same
        if attention_mask is not None:
            rank4 = attention_mask if len(attention_mask.shape) == 4 else ops.expand_dims(attention_mask, 1)
            mask = ops.logical_and(ops.cast(rank4, "bool"), same)
        return super()._compute_attention(query, key, value, mask, bias, training, return_attention_scores)

    def get_config(self):
        config = super().get_config()
        config.update(num_clusters=self.num_clusters, decay=self.decay, seed=self.seed)
        return config
