"""Linformer: self-attention with keys and values projected along the sequence (Wang et al. 2020)."""

import keras
from keras import ops

from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention
from keras_tfam.layers.position.attention_position_scheme import check_no_score_bias
from keras_tfam.utils import check_positive_int

SHARINGS = ("headwise", "key_value", "none")


@keras.saving.register_keras_serializable(package="keras_tfam")
class LinformerAttention(MultiHeadAttention):
    """Attention over `k` projected positions, in time linear in the sequence (Linformer).

    Wang et al. 2020 ("Linformer: Self-Attention with Linear Complexity"):
    keys and values, `(S, H)` per head, are projected along the sequence by
    learned `(k, n)` matrices `E` and `F` before attention,
    `softmax(Q (E K)^T / sqrt(H)) (F V)`, so the scores are `(T, k)`.
    Sharing (the paper's section 4): `"headwise"` (one `E` and one `F` for
    all heads, the default), `"key_value"` (also `E = F`), or `"none"`
    (per head). Each layer has its own projections (the paper's layerwise
    sharing, one matrix across layers, is not offered).

    **Not causal.** Every projected row mixes all positions, so a query
    sees the future: this is attention for fixed-length encoders.
    `use_causal_mask=True`, a KV cache and `window` are refused, so it is
    not registered for decoder models. Inputs may be shorter than
    `sequence_length` (the first columns of `E`, `F`, as zero padding);
    longer ones are refused. Padded keys are zeroed before the projection.

    Args:
        num_heads, key_dim, value_dim, num_key_value_heads, output_dim,
        use_bias, dropout, position, scale, kernel_initializer,
        bias_initializer, output_kernel_initializer: as in
        `MultiHeadAttention` (`position`: rotary only).
        sequence_length: `n`, the longest key sequence.
        projected_length: `k`, the projected positions.
        sharing: `"headwise"`, `"key_value"` or `"none"`.
        projection_initializer: initializer of `E` and `F`; default
            normal with standard deviation `1 / sqrt(n)` (fairseq's Linformer:
            Xavier with gain `1 / sqrt(2)`, the same scale for `n >> k`).

    Call arguments:
        query: `(B, T, D)`; value: `(B, S, Dv)` with `S <= n` (default:
        `query`); key; padding masks `query_mask`, `value_mask`,
        `key_mask`; `return_attention_scores` (`(B, N, T, k)`);
        `training`. As `MultiHeadAttention`, without causal masks, windows,
        attention masks or caches.

    Returns:
        `(B, T, output_dim)`, or `(outputs, weights)` with
        `return_attention_scores`.

    Example:

    >>> attention = LinformerAttention(num_heads=8, key_dim=64, sequence_length=4096, projected_length=256)
    >>> attention(keras.random.normal((2, 4096, 512))).shape
    (2, 4096, 512)
    """

    def __init__(
        self, num_heads, key_dim, sequence_length, projected_length=256, sharing="headwise",
        projection_initializer=None, **kwargs,
    ):
        super().__init__(num_heads, key_dim, **kwargs)
        check_positive_int("sequence_length", sequence_length)
        check_positive_int("projected_length", projected_length)
        if sharing not in SHARINGS:
            raise ValueError(f"`sharing` must be one of {SHARINGS}. Received: sharing={sharing!r}")
        check_no_score_bias("LinformerAttention", self.position)
        self.sequence_length = sequence_length
        self.projected_length = projected_length
        self.sharing = sharing
        self.projection_initializer = keras.initializers.get(
            projection_initializer or keras.initializers.RandomNormal(stddev=sequence_length**-0.5)
        )

    def build(self, query_shape, value_shape=None, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        shape = (self.projected_length, self.sequence_length)
        if self.sharing == "none":
            shape = (self.num_key_value_heads,) + shape
        self.key_projection = self.add_weight(name="key_projection", shape=shape, initializer=self.projection_initializer)
        self.value_projection = self.key_projection
        if self.sharing != "key_value":
            self.value_projection = self.add_weight(
                name="value_projection", shape=shape, initializer=self.projection_initializer
            )

    def _project_sequence(self, x, projection):
        """`(B, S, K, H)` -> `(B, k, K, H)` through the first `S` columns of `projection`."""
        columns = projection[..., : ops.shape(x)[1]]
        if self.sharing == "none":
            return ops.einsum("kps,bskh->bpkh", columns, x)
        return ops.einsum("ps,bskh->bpkh", columns, x)

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
        if use_causal_mask:
            raise ValueError(
                "LinformerAttention is not causal: each projected key mixes every position. Received: "
                "use_causal_mask=True"
            )
        for name, argument in (("attention_mask", attention_mask), ("window", window), ("cache", cache)):
            if argument is not None:
                raise ValueError(f"LinformerAttention takes padding masks only, no `{name}`. Received: {name}={argument!r}")
        value, key, query_mask, key_padding = self._resolve_inputs(
            query, value, key, query_mask, value_mask, key_mask, None
        )
        length = key.shape[1]
        if length is not None and length > self.sequence_length:
            raise ValueError(
                f"LinformerAttention projects at most sequence_length={self.sequence_length} positions. "
                f"Received: a key sequence of length {length}"
            )
        q = self._split_heads(self.query_dense(query), self.num_heads)  # [B, T, N, H]
        k = self._split_heads(self.key_dense(key), self.num_key_value_heads)  # [B, S, K, H]
        v = self._split_heads(self.value_dense(value), self.num_key_value_heads)  # [B, S, K, Hv]
        if self.position is not None:
            q, k = self.position.rotate_query_key(q, k)
        if key_padding is not None:
            keep = ops.cast(key_padding, k.dtype)[:, :, None, None]
            k, v = k * keep, v * keep
        k = self._project_sequence(k, ops.cast(self.key_projection.value, k.dtype))  # [B, k, K, H]
        v = self._project_sequence(v, ops.cast(self.value_projection.value, v.dtype))  # [B, k, K, Hv]
        outputs, weights = self._compute_attention(q, k, v, None, None, training, return_attention_scores)
        if query_mask is not None:
            outputs = outputs * ops.cast(query_mask, outputs.dtype)[:, :, None, None]
        shape = ops.shape(outputs)
        outputs = self.output_dense(ops.reshape(outputs, (shape[0], shape[1], self.num_heads * self.value_dim)))
        return (outputs, weights) if return_attention_scores else outputs

    def get_config(self):
        config = super().get_config()
        config.update(
            sequence_length=self.sequence_length,
            projected_length=self.projected_length,
            sharing=self.sharing,
            projection_initializer=keras.initializers.serialize(self.projection_initializer),
        )
        return config
