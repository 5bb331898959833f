"""Scaled cosine attention (Liu et al. 2022, Swin Transformer V2)."""

import math

import keras
from keras import ops

from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention
from keras_tfam.layers.attention.registry import register_attention

# The multiplier `1 / tau` is at most 100 (`tau >= 0.01`), as the paper.
_MAX_LOG_SCALE = math.log(100.0)


@register_attention("cosine")
@keras.saving.register_keras_serializable(package="keras_tfam")
class CosineAttention(MultiHeadAttention):
    """Softmax attention over cosine similarities with a learned temperature per head (Swin Transformer V2).

    Liu et al. 2022 ("Swin Transformer V2: Scaling Up Capacity and
    Resolution", eq. 2): `Sim(q_i, k_j) = cos(q_i, k_j) / tau + B_ij`, with
    `tau > 0.01` learned per head (here `1 / tau = exp(s)`, `s` initialised
    at `log 10` and clipped at `log 100`, as the reference code) and `B` a
    position bias (any scheme of `MultiHeadAttention`). Cosines are bounded,
    so no query or key can dominate the softmax by its norm alone.

    The kernel is the only thing this kind changes: it normalises the
    heads and scales the queries, then runs `MultiHeadAttention`'s softmax
    kernel. Masks, patterns, windows, caches (ring caches included),
    memory and grouped key/value heads are the base's.

    Args:
        num_heads, key_dim: and the rest of `MultiHeadAttention`'s
            arguments but `scale` (the temperature is learned).
        temperature_initializer: initializer of `s = log(1 / tau)`;
            default `log 10`.

    Examples:
        >>> attention = CosineAttention(num_heads=8, key_dim=64, position=RelativePositionBias(8))
        >>> attention(keras.random.normal((2, 49, 512))).shape
        (2, 49, 512)
    """

    def __init__(self, num_heads, key_dim, temperature_initializer=None, **kwargs):
        if kwargs.get("scale") not in (None, 1.0):
            raise ValueError(
                "CosineAttention learns its temperature per head: it takes no `scale`. "
                f"Received: scale={kwargs['scale']}"
            )
        kwargs["scale"] = 1.0
        super().__init__(num_heads, key_dim, **kwargs)
        self.temperature_initializer = keras.initializers.get(
            temperature_initializer or keras.initializers.Constant(math.log(10.0))
        )

    def build(self, query_shape, value_shape=None, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        self.log_scale = self.add_weight(
            name="log_scale", shape=(self.num_heads,), initializer=self.temperature_initializer
        )

    def attend(self, query, key, value, context):
        """`softmax(cos(q, k) / tau + B) v`: unit heads, queries times `1 / tau`, then the softmax kernel."""

        def unit(x):
            x = ops.cast(x, "float32")
            return x / ops.sqrt(ops.sum(ops.square(x), axis=-1, keepdims=True) + 1e-12)

        multiplier = ops.exp(ops.minimum(ops.cast(self.log_scale, "float32"), _MAX_LOG_SCALE))  # [N]
        query = ops.cast(unit(query) * multiplier[:, None], self.compute_dtype)
        return super().attend(query, ops.cast(unit(key), self.compute_dtype), value, context)

    def get_config(self):
        config = super().get_config()
        del config["scale"]
        config.update(temperature_initializer=keras.initializers.serialize(self.temperature_initializer))
        return config
