"""Linformer: self-attention with keys and values projected along the sequence (Wang et al. 2020)."""

import keras
from keras import ops

from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention
from keras_tfam.layers.attention.registry import register_attention
from keras_tfam.utils import check_positive_int

SHARINGS = ("headwise", "key_value", "none")


@register_attention("linformer", decoder=False)
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
        num_heads, key_dim: as in `MultiHeadAttention`, and so are
            `value_dim`, `num_key_value_heads`, `output_dim`, `use_bias`,
            `dropout`, `position` (rotary only), `scale`,
            `kernel_initializer`, `bias_initializer` and
            `output_kernel_initializer`.
        sequence_length: `n`, the longest key sequence.
        projected_length: `k <= n`, the projected positions.
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

    Examples:
        >>> attention = LinformerAttention(num_heads=8, key_dim=64, sequence_length=4096, projected_length=256)
        >>> attention(keras.random.normal((2, 4096, 512))).shape
        (2, 4096, 512)
    """

    supports_causal = False
    supports_window = False
    supports_cache = False
    supports_attention_mask = False
    supports_pattern = False
    supports_memory = False
    accepts_score_bias = False
    attention_kernels = ()  # dense attention over the projected rows, its own kernel
    example_options = ({"sequence_length": 16, "projected_length": 4}, {"sequence_length": 16, "sharing": "none"})
    refusal_reasons = {
        "use_causal_mask": "it is not causal: each projected key mixes every position",
        "cache": "it is not causal, so it does not decode",
    }

    def __init__(
        self,
        num_heads,
        key_dim,
        sequence_length,
        projected_length=256,
        sharing="headwise",
        projection_initializer=None,
        **kwargs,
    ):
        super().__init__(num_heads, key_dim, **kwargs)
        sequence_length = check_positive_int("sequence_length", sequence_length)
        projected_length = check_positive_int("projected_length", projected_length)
        if sharing not in SHARINGS:
            raise ValueError(f"`sharing` must be one of {SHARINGS}. Received: sharing={sharing!r}")
        if projected_length > sequence_length:
            # k > n: E K still has rank <= n, and the (T, k) scores cost more than plain attention's (T, n).
            raise ValueError(
                f"`projected_length` must be at most `sequence_length`={sequence_length} (Linformer projects "
                f"the n positions to k <= n). Received: projected_length={projected_length}"
            )
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
        self.key_projection = self.add_weight(
            name="key_projection", shape=shape, initializer=self.projection_initializer
        )
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

    def attend(self, query, key, value, context):
        """Keys and values projected along the sequence, then softmax attention over the `k` projected rows."""
        length = key.shape[1]
        if length is not None and length > self.sequence_length:
            raise ValueError(
                f"LinformerAttention projects at most sequence_length={self.sequence_length} positions. "
                f"Received: a key sequence of length {length}"
            )
        if context.key_mask is not None:
            keep = ops.cast(context.key_mask, key.dtype)[:, :, None, None]
            key, value = key * keep, value * keep
        key = self._project_sequence(key, ops.cast(self.key_projection.value, key.dtype))  # [B, k, K, H]
        value = self._project_sequence(value, ops.cast(self.value_projection.value, value.dtype))  # [B, k, K, Hv]
        outputs, weights = self._compute_attention(
            query, key, value, None, None, context.training, context.return_attention_scores
        )
        if context.query_mask is not None:
            outputs = outputs * ops.cast(context.query_mask, outputs.dtype)[:, :, None, None]
        return outputs, weights, None

    def get_config(self):
        config = super().get_config()
        config.update(
            sequence_length=self.sequence_length,
            projected_length=self.projected_length,
            sharing=self.sharing,
            projection_initializer=keras.initializers.serialize(self.projection_initializer),
        )
        return config
