"""kNN-augmented attention of the Memorizing Transformer (Wu et al. 2022)."""

import keras
from keras import ops

from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention
from keras_tfam.layers.attention.registry import register_attention
from keras_tfam.retrieval.nearest_neighbors import nearest_neighbors
from keras_tfam.utils import check_positive_int


@register_attention("memorizing", decoder=False)
@keras.saving.register_keras_serializable(package="keras_tfam")
class MemorizingAttention(MultiHeadAttention):
    """Local self-attention plus attention over the top-k of an external memory (Wu et al. 2022).

    The layer attends, as `MultiHeadAttention`, to the current segment
    (`V_local`), and each query also retrieves, per key/value head, its
    `num_neighbors` best keys by inner product from a memory of the (key,
    value) pairs of earlier segments, and attends over those alone
    (`V_mem`, a softmax over the retrieved scores). A learned per-head gate
    `g = sigmoid(b_g)` mixes them: `g * V_mem + (1 - g) * V_local`. A query
    with nothing in memory uses `V_local` alone, so with an empty memory the
    layer is exactly the local attention.

    The kNN memory (`knn_memory`: a store of past keys and values, not
    Transformer-XL's `memory` of past hidden states, which this layer takes
    too, as every attention kind) is a `(B, 2, memory_size, K, H)` tensor in
    the KV-cache layout plus a `(B, memory_size)` boolean mask of the filled
    slots; it is not differentiable (gradients stop at it, as in the paper)
    and is updated first-in first-out by `update_knn_memory` after each
    segment. Retrieval is
    exact (`keras_tfam.retrieval.nearest_neighbors`), where the paper uses
    approximate search. The position scheme, if any, applies to the local
    attention; memory keys carry no position, as in the paper.

    Args:
        num_heads, key_dim: as in `MultiHeadAttention` (values and keys have
            the same size: `value_dim` is `key_dim`), and so are
            `num_key_value_heads`, `output_dim`, `use_bias`, `dropout`,
            `position`, `scale`, `kernel_initializer`, `bias_initializer`
            and `output_kernel_initializer`.
        memory_size: slots `M` of the memory.
        num_neighbors: memories retrieved per query and head, `1 <= k <= M`.
        gate_initializer: initializer of the per-head gate bias `b_g`.

    Call arguments:
        query: `(B, T, D)`; self-attention over the segment.
        knn_memory: `(B, 2, M, K, H)` keys (index 0) and values (index 1),
            or `None` (an empty memory).
        knn_memory_mask: boolean `(B, M)`, `True` = a filled slot; required
            with `knn_memory`.
        The rest as `MultiHeadAttention` (the local attention: masks,
        windows, patterns, Transformer-XL's `memory`, a KV cache).
        query_mask: boolean padding mask `(B, T)`, `True` = real token.
        use_causal_mask: causal local attention (the memory holds only
            earlier segments, so it is visible to every query).
        training: whether dropout is active.

    Returns:
        `(B, T, output_dim)`.

    Examples:
        >>> layer = MemorizingAttention(num_heads=2, key_dim=8, memory_size=64, num_neighbors=4)
        >>> store, filled = layer.init_knn_memory(batch_size=2)
        >>> segments = keras.random.normal((3, 2, 16, 16))  # 3 consecutive segments of (2, 16, 16)
        >>> for segment in segments:
        ...     outputs = layer(segment, knn_memory=store, knn_memory_mask=filled, use_causal_mask=True)
        ...     store, filled = layer.update_knn_memory(store, filled, segment)
        >>> outputs.shape
        (2, 16, 16)
    """

    def __init__(self, num_heads, key_dim, memory_size, num_neighbors=32, gate_initializer="zeros", **kwargs):
        value_dim = kwargs.pop("value_dim", None)
        if value_dim not in (None, key_dim):
            raise ValueError(
                f"The memory holds keys and values of one size: `value_dim` must be `key_dim`. "
                f"Received: key_dim={key_dim}, value_dim={value_dim}"
            )
        super().__init__(num_heads, key_dim, **kwargs)
        check_positive_int("memory_size", memory_size)
        check_positive_int("num_neighbors", num_neighbors)
        if num_neighbors > memory_size:
            raise ValueError(
                "`num_neighbors` must be at most `memory_size`. Received: "
                f"num_neighbors={num_neighbors}, memory_size={memory_size}"
            )
        self.memory_size = memory_size
        self.num_neighbors = num_neighbors
        self.gate_initializer = keras.initializers.get(gate_initializer)

    call_inputs = ("knn_memory", "knn_memory_mask")
    example_options = ({"memory_size": 8, "num_neighbors": 2},)
    supports_attention_scores = False

    def build(self, query_shape, value_shape=None, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        self.gate = self.add_weight(name="gate", shape=(self.num_heads,), initializer=self.gate_initializer)

    def init_knn_memory(self, batch_size, dtype="float32"):
        """An empty memory: `(zeros (B, 2, M, K, H), all-False mask (B, M))`."""
        shape = (batch_size, 2, self.memory_size, self.num_key_value_heads, self.key_dim)
        return ops.zeros(shape, dtype), ops.zeros((batch_size, self.memory_size), "bool")

    def update_knn_memory(self, memory, memory_mask, segment, segment_mask=None):
        """The memory with the keys/values of `segment (B, T, D)` appended, oldest dropped.

        `segment_mask (B, T)` marks real tokens (padding is stored as empty
        slots). Returns `(memory, memory_mask)` of unchanged shapes.
        """
        self._check_memory(memory, memory_mask)
        new = ops.stop_gradient(ops.cast(self.compute_key_value_cache(segment), memory.dtype))
        if segment_mask is None:
            segment_mask = ops.ones(ops.shape(segment)[:2], "bool")
        memory = ops.concatenate([memory, new], axis=2)[:, :, -self.memory_size :]
        memory_mask = ops.concatenate([ops.cast(memory_mask, "bool"), ops.cast(segment_mask, "bool")], axis=1)
        return memory, memory_mask[:, -self.memory_size :]

    # The names of keras_tfam 0.2.
    init_memory = init_knn_memory
    update_memory = update_knn_memory

    def _check_memory(self, memory, memory_mask):
        expected = (2, self.memory_size, self.num_key_value_heads, self.key_dim)
        if len(memory.shape) != 5 or tuple(memory.shape[1:]) != expected:
            raise ValueError(
                f"`knn_memory` must have shape (batch, 2, memory_size={self.memory_size}, num_key_value_heads="
                f"{self.num_key_value_heads}, key_dim={self.key_dim}). Received: knn_memory.shape={tuple(memory.shape)}"
            )
        if memory_mask is None or tuple(memory_mask.shape[1:]) != (self.memory_size,):
            shape = None if memory_mask is None else tuple(memory_mask.shape)
            raise ValueError(
                f"`knn_memory_mask` must have shape (batch, memory_size={self.memory_size}). "
                f"Received: knn_memory_mask.shape={shape}"
            )

    def attend(self, query, key, value, context):
        """The local attention, mixed per head with attention over the kNN memory where a query found one."""
        local, weights, _ = super().attend(query, key, value, context)  # [B, T, N, H]
        knn_memory, knn_memory_mask = context.options.get("knn_memory"), context.options.get("knn_memory_mask")
        if knn_memory is None:
            return local, weights, None
        self._check_memory(knn_memory, knn_memory_mask)
        # Memory keys carry no position: retrieval uses the queries before the position scheme.
        remembered, found = self._attend_memory(context.inputs["query_heads"], knn_memory, knn_memory_mask)
        gate = ops.cast(ops.sigmoid(self.gate), "float32")[:, None]  # [N, 1]
        mixed = gate * remembered + (1.0 - gate) * ops.cast(local, "float32")
        return ops.cast(ops.where(found[..., None], mixed, ops.cast(local, "float32")), local.dtype), None, None

    def _attend_memory(self, query, memory, memory_mask):
        """Softmax attention of `(B, T, N, H)` queries over their retrieved memories.

        Returns float32 `(B, T, N, H)` outputs and a `(B, T, N)` mask of the
        queries that found at least one filled slot.
        """
        memory = ops.stop_gradient(ops.cast(memory, "float32"))
        shape = ops.shape(query)
        batch, length = shape[0], shape[1]
        kv_heads, groups, size = self.num_key_value_heads, self.num_heads // self.num_key_value_heads, self.memory_size
        # Query heads grouped under their key/value head: [B, K, G * T, H].
        grouped = ops.reshape(ops.cast(query, "float32"), (batch, length, kv_heads, groups, self.key_dim))
        grouped = ops.reshape(ops.transpose(grouped, (0, 2, 3, 1, 4)), (batch, kv_heads, groups * length, self.key_dim))
        keys = ops.transpose(memory[:, 0], (0, 2, 1, 3))  # [B, K, M, H]
        values = ops.transpose(memory[:, 1], (0, 2, 1, 3))
        scores, indices = nearest_neighbors(
            grouped, keys, self.num_neighbors, metric="inner_product", key_mask=ops.cast(memory_mask, "bool")[:, None]
        )  # [B, K, G * T, k]
        # Gather the retrieved values from the flattened (B * K * M, H) memory.
        offsets = ops.reshape(ops.arange(batch * kv_heads, dtype="int32") * size, (batch, kv_heads, 1, 1))
        retrieved = ops.take(ops.reshape(values, (-1, self.key_dim)), indices + offsets, axis=0)  # [B, K, GT, k, H]
        found = scores > float("-inf")
        scale = self.scale if self.scale is not None else self.key_dim**-0.5
        weights = ops.softmax(ops.where(found, scores * scale, -1e9), axis=-1)
        weights = ops.where(found, weights, 0.0)
        outputs = ops.sum(weights[..., None] * retrieved, axis=-2)  # [B, K, G * T, H]
        outputs = ops.transpose(ops.reshape(outputs, (batch, kv_heads, groups, length, self.key_dim)), (0, 3, 1, 2, 4))
        outputs = ops.reshape(outputs, (batch, length, self.num_heads, self.key_dim))
        # Neighbours come best first: a query found a filled slot if its first one is.
        any_found = ops.reshape(found[..., 0], (batch, kv_heads, groups, length))
        any_found = ops.reshape(ops.transpose(any_found, (0, 3, 1, 2)), (batch, length, self.num_heads))
        return outputs, any_found

    def get_config(self):
        config = super().get_config()
        config.update(
            memory_size=self.memory_size,
            num_neighbors=self.num_neighbors,
            gate_initializer=keras.initializers.serialize(self.gate_initializer),
        )
        return config
