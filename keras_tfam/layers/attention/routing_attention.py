"""Routing attention: online k-means clusters of queries and keys (Roy et al. 2021)."""

import keras
from keras import ops

from keras_tfam.layers.attention.bucketed_attention import BucketedAttention
from keras_tfam.layers.attention.registry import register_attention
from keras_tfam.layers.attention.seeded_draws import SeededDraws
from keras_tfam.utils import check_positive_int


def _unit(x):
    return x / ops.sqrt(ops.sum(ops.square(x), axis=-1, keepdims=True) + 1e-6)


@register_attention("routing")
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

    Chunked like LSH attention (`BucketedAttention`): not causal,
    positions sorted by (cluster, position) separately for queries and for
    keys, cut into chunks of `chunk_length`, each chunk of queries
    attending to the same and the previous chunk of keys of its cluster
    (`O(T * chunk_length)`; the paper takes the top `T / C` of each cluster
    instead). Causally (and when decoding), a query sees the keys of its
    cluster in its chunk and the previous one, chunks counted inside the
    cluster, so decoding equals the full pass; queries and keys have
    clusters of their own, so this runs as a dense mask, `O(T^2)`. A
    query whose cluster holds no key it may see gets zeros.

    Args:
        num_heads, key_dim: as in `MultiHeadAttention`, and so are
            `value_dim`, `num_key_value_heads`, `output_dim`, `use_bias`,
            `dropout`, `position` (rotary only), `scale`,
            `kernel_initializer`, `bias_initializer` and
            `output_kernel_initializer`.
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

    Examples:
        >>> attention = RoutingAttention(num_heads=4, key_dim=64, num_clusters=16, chunk_length=64)
        >>> attention(keras.random.normal((2, 4096, 256))).shape  # chunked: O(T * chunk_length)
        (2, 4096, 256)
    """

    example_options = ({"num_clusters": 3, "chunk_length": 4, "seed": 0},)

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

    @property
    def num_bucket_ids(self):
        return self.num_clusters

    def clusters(self, x):
        """`(B, T, N, H)` heads -> `(B, T, N)` int32 index of the nearest centroid (by angle)."""
        similarity = ops.einsum("btnh,nch->btnc", _unit(ops.cast(x, "float32")), _unit(self.centroids.value))
        return ops.cast(ops.argmax(similarity, axis=-1), "int32")

    def assign_buckets(self, query, key, context):
        query_clusters, key_clusters = self.clusters(query), self.clusters(key)  # [B, T, N]
        if context.training and not context.cached:
            self._move_centroids(query, key, query_clusters, key_clusters, context.query_mask, context.key_mask)
        # [B, N, 1, T]: one round
        return ops.transpose(query_clusters, (0, 2, 1))[:, :, None], ops.transpose(key_clusters, (0, 2, 1))[:, :, None]

    def _move_centroids(self, q, k, query_clusters, key_clusters, query_mask, key_padding):
        """`mu <- decay mu + (1 - decay) / 2 (sum of routed unit queries + keys)` (Roy et al. 2021)."""

        def routed_sums(x, clusters, mask):
            members = ops.one_hot(clusters, self.num_clusters, dtype="float32")  # [B, T, N, C]
            if mask is not None:
                members = members * ops.cast(mask, "float32")[:, :, None, None]
            return ops.einsum("btnc,btnh->nch", members, ops.stop_gradient(_unit(ops.cast(x, "float32"))))

        sums = routed_sums(q, query_clusters, query_mask) + routed_sums(k, key_clusters, key_padding)
        self.centroids.assign(self.decay * self.centroids.value + (1.0 - self.decay) / 2.0 * sums)

    def get_config(self):
        config = super().get_config()
        config.update(num_clusters=self.num_clusters, decay=self.decay, seed=self.seed)
        return config
