"""Adaptive attention span (Sukhbaatar et al. 2019)."""

import keras
from keras import ops

from keras_tfam.layers.position.attention_position_scheme import HeadsPositionScheme
from keras_tfam.ops.masks import relative_distance
from keras_tfam.utils import check_positive_int


@keras.saving.register_keras_serializable(package="keras_tfam")
class UnitInterval(keras.constraints.Constraint):
    """Clips a weight to `[0, 1]` after each update (the span fractions)."""

    def __call__(self, w):
        return ops.clip(w, 0.0, 1.0)


def span_mask(distance, spans, ramp):
    """`m_z(x) = clip((R + z - x) / R, 0, 1)` for each head's span `z`.

    Args:
        distance: `(T, S)` query-key distances `x`.
        spans: `(N,)` float32 spans `z`.
        ramp: the ramp length `R`.

    Returns:
        float32 `(N, T, S)`.
    """
    distance = ops.cast(distance, "float32")[None]
    return ops.clip((ramp + spans[:, None, None] - distance) / ramp, 0.0, 1.0)


@keras.saving.register_keras_serializable(package="keras_tfam")
class AdaptiveSpan(HeadsPositionScheme):
    """Each head learns how far back it attends: a soft mask over distances, with an L1 penalty.

    Implements Sukhbaatar et al. 2019 ("Adaptive Attention Span in
    Transformers", eqs. 2-3): head `h` multiplies its attention weights by
    `m_z(x) = clip((R + z_h - x) / R, 0, 1)`, with `x` the distance from
    the query back to the key, and renormalises them,

        a_ij = m_z(i - j) exp(s_ij) / sum_k m_z(i - k) exp(s_ik),

    so keys up to `z_h` back count fully, keys beyond `z_h + R` not at all,
    and the ramp between them makes `z_h` learnable: its gradient is non-zero
    only through keys inside the ramp. The spans are `max_span` times
    weights in `[0, 1]` (as the paper's code: an optimizer step moves a span
    by about `max_span x learning rate` tokens), and `span_penalty * sum_h z_h`
    is added to the model's losses (`add_loss`, once per call of the
    attention), the paper's L1 penalty pulling spans back to what the loss
    needs (its `lambda / M` over `M` heads is `span_penalty`).

    A `reweight` hook of the position-scheme protocol; compose it with a
    scheme that encodes positions (`ComposedPosition`).

    Args:
        num_heads: attention heads `N`.
        max_span: the longest span `S` (tokens).
        ramp: the ramp length `R` (tokens; the paper: 32).
        initial_span: every head's span at initialisation, in
            `[0, max_span]` (the paper's code: 0).
        span_penalty: coefficient of the L1 penalty on the spans (the paper:
            2e-6 over all heads).

    Call arguments:
        As `HeadsPositionScheme`: attention of `(B, T, N, H)` query heads over
        `(B, S, K, H)` keys and values with the span masks.

    Returns:
        `(B, T, N, Hv)`.

    Examples:
        >>> span = AdaptiveSpan(num_heads=8, max_span=512, ramp=32)
        >>> attention = MultiHeadAttention(8, 64, position=ComposedPosition([TransformerXLPosition(8), span]))
    """

    def __init__(self, num_heads, max_span, ramp=32, initial_span=0.0, span_penalty=2e-6, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        check_positive_int("max_span", max_span)
        if not isinstance(ramp, (int, float)) or isinstance(ramp, bool) or ramp <= 0:
            raise ValueError(f"`ramp` must be a positive number of tokens. Received: ramp={ramp!r}")
        if not 0 <= initial_span <= max_span:
            raise ValueError(
                f"`initial_span` must be in [0, max_span={max_span}] (a span is a number of tokens back). "
                f"Received: initial_span={initial_span!r}"
            )
        if span_penalty < 0:
            raise ValueError(f"`span_penalty` must be non-negative. Received: span_penalty={span_penalty!r}")
        self.num_heads = num_heads
        self.max_span = max_span
        self.ramp = ramp
        self.initial_span = initial_span
        self.span_penalty = span_penalty

    def build(self, query_shape=None):
        self.span_fractions = self.add_weight(
            name="span_fractions",
            shape=(self.num_heads,),
            initializer=keras.initializers.Constant(self.initial_span / self.max_span),
            constraint=UnitInterval(),
        )
        self.built = True

    def spans(self):
        """The heads' spans `z` in tokens, float32 `(N,)`."""
        return ops.cast(ops.clip(self.span_fractions, 0.0, 1.0), "float32") * float(self.max_span)

    def reweight(self, weights, query_positions, key_positions):
        spans = self.spans()
        if self.span_penalty and not self.losses:  # once per call, whatever the number of query blocks
            self.add_loss(self.span_penalty * ops.sum(spans))
        mask = span_mask(relative_distance(query_positions, key_positions), spans, self.ramp)  # [N, T, S]
        masked = ops.cast(weights, "float32") * mask[None]
        total = ops.sum(masked, axis=-1, keepdims=True)
        return ops.where(total > 0, masked / ops.where(total > 0, total, 1.0), 0.0)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            max_span=self.max_span,
            ramp=self.ramp,
            initial_span=self.initial_span,
            span_penalty=self.span_penalty,
        )
        return config
