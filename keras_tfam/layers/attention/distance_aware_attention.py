"""Distance-aware self-attention (DA-Transformer, Wu et al. 2021)."""

import keras
from keras import ops

from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention
from keras_tfam.ops import masks as mask_ops
from keras_tfam.ops.attention import apply_attention_weights


def distance_rescale(distance, sharpness):
    """The learnable sigmoid of DA-Transformer: `f(x; v) = (1 + e^v) / (1 + e^(v - x))`.

    `f(0) = 1` whatever `v`; `f` increases with `x` from 0 (`x -> -inf`) to
    its bound `1 + e^v` (`x -> +inf`). Computed as `(1 + e^v) * sigmoid(x - v)`,
    which neither overflows nor divides by zero.

    Args:
        distance: weighted distances `x`, any shape.
        sharpness: `v`, broadcastable to `distance`.
    """
    distance = ops.cast(distance, "float32")
    sharpness = ops.cast(sharpness, "float32")
    return (1.0 + ops.exp(sharpness)) * ops.sigmoid(distance - sharpness)


@keras.saving.register_keras_serializable(package="keras_tfam")
class DistanceAwareAttention(MultiHeadAttention):
    """Self-attention re-scaled by real token distances (DA-Transformer, Wu et al. 2021).

    Head `i` weights the relative distance `R_jk = |j - k|` by a learnable
    `w_i` (positive: the head prefers distant tokens, negative: near ones),
    maps it through a learnable sigmoid `f(x; v_i) = (1 + e^v_i) / (1 +
    e^(v_i - x))` (`f(0) = 1`, bounded by `1 + e^v_i`), and multiplies the
    ReLU of the raw scores by it; each row is then divided by its sum:

        A_i = ReLU(Q_i K_i^T) * f(w_i R; v_i),   weights = A_i / sum_k A_i[:, k]

    The distances replace position embeddings, so `position` must be `None`.
    A row whose scores are all zero or masked attends to nothing (zeros).
    The `1/sqrt(d)` scale of the scores cancels in the normalisation; it is
    kept so that half-precision scores stay in range.

    Args:
        num_heads, key_dim, value_dim, num_key_value_heads, output_dim,
        use_bias, dropout, kernel_initializer, bias_initializer,
        output_kernel_initializer: as in `MultiHeadAttention`.
        distance_weight_initializer: initializer of the per-head `w`
            (default zeros: every head starts as plain ReLU attention).
        sharpness_initializer: initializer of the per-head `v` (default
            zeros: coefficients bounded by 2).

    Call arguments:
        query: `(B, T, D)`; self-attention only.
        query_mask: boolean padding mask `(B, T)`, `True` = real token;
            default: the Keras mask of `query`.
        attention_mask: boolean `(B, T, T)`, `True` = may attend.
        use_causal_mask: restrict attention to earlier positions.
        return_attention_scores: also return the `(B, N, T, T)` weights.
        training: whether dropout is active.

    Returns:
        `(B, T, output_dim)`, and the weights with `return_attention_scores`.

    Example:

    >>> attention = DistanceAwareAttention(num_heads=8, key_dim=32)
    >>> attention(keras.random.normal((2, 50, 256))).shape
    (2, 50, 256)
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        distance_weight_initializer="zeros",
        sharpness_initializer="zeros",
        **kwargs,
    ):
        super().__init__(num_heads, key_dim, **kwargs)
        if self.position is not None:
            raise ValueError(
                "DistanceAwareAttention encodes positions through token distances and takes no "
                f"position scheme. Received: position={self.position!r}"
            )
        self.distance_weight_initializer = keras.initializers.get(distance_weight_initializer)
        self.sharpness_initializer = keras.initializers.get(sharpness_initializer)

    def build(self, query_shape):
        super().build(query_shape)
        self.distance_weight = self.add_weight(
            name="distance_weight", shape=(self.num_heads,), initializer=self.distance_weight_initializer
        )
        self.sharpness = self.add_weight(
            name="sharpness", shape=(self.num_heads,), initializer=self.sharpness_initializer
        )

    def call(
        self,
        query,
        query_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
    ):
        _, _, query_mask, key_mask = self._resolve_inputs(query, None, None, query_mask, None, None, None)
        q = self._split_heads(self.query_dense(query), self.num_heads)  # [B, T, N, H]
        k = self._split_heads(self.key_dense(query), self.num_key_value_heads)  # [B, T, K, H]
        v = self._split_heads(self.value_dense(query), self.num_key_value_heads)
        groups = self.num_heads // self.num_key_value_heads
        k = ops.repeat(k, groups, axis=2) if groups > 1 else k
        scale = self.scale if self.scale is not None else self.key_dim**-0.5
        scores = ops.einsum("btnh,bsnh->bnts", ops.cast(q, "float32") * scale, ops.cast(k, "float32"))

        length = ops.shape(query)[1]
        positions = ops.arange(length, dtype="float32")
        distance = ops.abs(positions[:, None] - positions[None, :])  # [T, T]
        weight = ops.cast(self.distance_weight, "float32")[:, None, None]
        sharpness = ops.cast(self.sharpness, "float32")[:, None, None]
        coefficients = distance_rescale(weight * distance, sharpness)  # [N, T, T]
        scores = ops.relu(scores) * coefficients[None]

        mask = mask_ops.merge_masks(
            mask_ops.padding_to_attention_mask(query_mask, key_mask),
            attention_mask,
            mask_ops.causal_mask(length) if use_causal_mask else None,
        )
        if mask is not None:
            scores = ops.where(ops.expand_dims(ops.cast(mask, "bool"), 1), scores, 0.0)
        totals = ops.sum(scores, axis=-1, keepdims=True)
        weights = scores / ops.where(totals > 0.0, totals, 1.0)
        dropped = self.dropout_layer(weights, training=training) if self.dropout else weights
        outputs = apply_attention_weights(dropped, ops.cast(v, self.compute_dtype))  # [B, T, N, Hv]
        shape = ops.shape(outputs)
        outputs = self.output_dense(ops.reshape(outputs, (shape[0], shape[1], self.num_heads * self.value_dim)))
        if return_attention_scores:
            return outputs, weights
        return outputs

    def get_config(self):
        config = super().get_config()
        config.update(
            distance_weight_initializer=keras.initializers.serialize(self.distance_weight_initializer),
            sharpness_initializer=keras.initializers.serialize(self.sharpness_initializer),
        )
        return config
