"""Distance-aware self-attention (DA-Transformer, Wu et al. 2021)."""

import keras
from keras import ops

from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention
from keras_tfam.layers.attention.registry import register_attention
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


@register_attention("distance_aware")
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
        num_heads, key_dim: as in `MultiHeadAttention`, and so are
            `value_dim`, `num_key_value_heads`, `output_dim`, `use_bias`,
            `dropout`, `kernel_initializer`, `bias_initializer` and
            `output_kernel_initializer`.
        distance_weight_initializer: initializer of the per-head `w`
            (default zeros: every head starts as plain ReLU attention).
        sharpness_initializer: initializer of the per-head `v` (default
            zeros: coefficients bounded by 2).

    Distances are between absolute positions, so every option of
    `MultiHeadAttention` means the same here: cross-attention (`value`,
    `key`), padding and attention masks, `use_causal_mask`, `window`,
    patterns, a `memory`, and decoding with a KV cache (ring caches
    included), where each cached key keeps its position.

    Call arguments:
        As `MultiHeadAttention`.

    Returns:
        `(B, T, output_dim)`; `(outputs, cache)` with a cache; and the
        weights with `return_attention_scores`.

    Examples:
        >>> attention = DistanceAwareAttention(num_heads=8, key_dim=32)
        >>> attention(keras.random.normal((2, 50, 256))).shape
        (2, 50, 256)
    """

    accepts_position = False
    attention_kernels = ()  # its own scores, not softmax's
    example_options = ({"distance_weight_initializer": "random_normal", "sharpness_initializer": "random_normal"},)

    def __init__(
        self,
        num_heads,
        key_dim,
        distance_weight_initializer="zeros",
        sharpness_initializer="zeros",
        **kwargs,
    ):
        if kwargs.get("position") is not None:
            raise ValueError(
                "DistanceAwareAttention encodes positions through token distances and takes no "
                f"position scheme. Received: position={kwargs['position']!r}"
            )
        super().__init__(num_heads, key_dim, **kwargs)
        self.distance_weight_initializer = keras.initializers.get(distance_weight_initializer)
        self.sharpness_initializer = keras.initializers.get(sharpness_initializer)

    def build(self, query_shape, value_shape=None, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        self.distance_weight = self.add_weight(
            name="distance_weight", shape=(self.num_heads,), initializer=self.distance_weight_initializer
        )
        self.sharpness = self.add_weight(
            name="sharpness", shape=(self.num_heads,), initializer=self.sharpness_initializer
        )

    def attend(self, query, key, value, context):
        """`ReLU(Q K^T) * f(w |i - j|; v)`, normalised by its row sums, at the queries' and keys' absolute positions."""
        key, value = self.repeat_key_value_heads(key), self.repeat_key_value_heads(value)
        scale = self.scale if self.scale is not None else self.key_dim**-0.5
        scores = ops.einsum("btnh,bsnh->bnts", ops.cast(query, "float32") * scale, ops.cast(key, "float32"))
        distance = ops.cast(
            ops.abs(mask_ops.relative_distance(context.query_positions, context.key_positions)), "float32"
        )  # [T, S]
        weight = ops.cast(self.distance_weight, "float32")[:, None, None]
        sharpness = ops.cast(self.sharpness, "float32")[:, None, None]
        coefficients = distance_rescale(weight * distance, sharpness)  # [N, T, S]
        scores = ops.relu(scores) * coefficients[None]
        mask = context.mask()
        if mask is not None:
            mask = ops.cast(mask, "bool")
            scores = ops.where(mask if len(mask.shape) == 4 else ops.expand_dims(mask, 1), scores, 0.0)
        totals = ops.sum(scores, axis=-1, keepdims=True)
        weights = scores / ops.where(totals > 0.0, totals, 1.0)
        dropped = self.dropout_layer(weights, training=context.training) if self.dropout else weights
        outputs = apply_attention_weights(dropped, ops.cast(value, self.compute_dtype))  # [B, T, N, Hv]
        return outputs, weights, None

    def get_config(self):
        config = super().get_config()
        config.update(
            distance_weight_initializer=keras.initializers.serialize(self.distance_weight_initializer),
            sharpness_initializer=keras.initializers.serialize(self.sharpness_initializer),
        )
        return config
