"""The language-model loss in one pass over the logits, with its gradient written in their dtype."""

import keras
from keras import ops

from keras_tfam.utils import is_integer


@keras.saving.register_keras_serializable(package="keras_tfam")
class TokenCrossEntropy(keras.losses.Loss):
    """Cross-entropy of integer targets under unnormalised logits, computed from them directly.

    The value of `keras.losses.SparseCategoricalCrossentropy(from_logits=True)`:
    `loss = logsumexp(logits) - logits[target]`, the statistics in float32
    under any compute dtype. What differs is what the step keeps and writes
    over the `(B, T, V)` logits, the largest tensor of a language model's
    step: no log-softmax copy is kept for the backward pass, and the gradient
    `softmax(logits) - one_hot(target)` is written once, in the logits' own
    dtype. Compiled by XLA, the forward pass reads the logits twice (their
    maximum, then the sum of exponentials) and the backward pass once.

    Masks and sample weights are applied by `keras.losses.Loss` as usual (a
    padded position weighs 0). Positions whose target is `ignore_class` (as
    in Keras' sparse cross-entropy; -100 in Hugging Face's labels) count for
    nothing: their loss and gradient are 0 and the mean is over the other
    positions (they enter as sample weights, the way Keras weighs a mask; on
    logits that carry a Keras mask as well, the two weights multiply). Any
    other target outside `[0, V)` makes the loss NaN, so a
    wrong vocabulary size shows in the first step instead of training on
    a clamped index.

    Args:
        name: the loss's name.
        reduction: as in `keras.losses.Loss` (`"sum_over_batch_size"`, the
            mean over tokens, by default).
        dtype: dtype Keras converts the inputs to and reduces the loss in
            (float32 by default); the statistics over the vocabulary are
            float32 whatever it is.
        ignore_class: an int target id that is not a token (padding, or
            -100), or `None` (every target is a token).

    Call arguments:
        y_true: int targets `(B, T)` (or `(B, T, 1)`) in `[0, V)`, or
            `ignore_class`.
        y_pred: logits `(B, T, V)`, any float dtype.

    Returns:
        The reduced loss (a scalar by default).

    Example:
        >>> loss = TokenCrossEntropy()
        >>> logits = np.array([[[2.0, 0.5, -1.0], [0.0, 0.0, 3.0]]])
        >>> round(float(loss(np.array([[0, 2]]), logits)), 4)
        0.1681
    """

    def __init__(self, name="token_cross_entropy", reduction="sum_over_batch_size", dtype=None, ignore_class=None):
        if ignore_class is not None and not is_integer(ignore_class):
            raise ValueError(
                f"`ignore_class` must be an int target id or None. Received: ignore_class={ignore_class!r}"
            )
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.ignore_class = None if ignore_class is None else int(ignore_class)

    def __call__(self, y_true, y_pred, sample_weight=None):
        if self.ignore_class is None:
            return super().__call__(y_true, y_pred, sample_weight=sample_weight)
        # The weights Keras gives a mask (`keras.losses.Loss`): a mean is over the valid positions only.
        valid = ops.cast(ops.not_equal(_targets(y_true, y_pred), self.ignore_class), "float32")
        if self.reduction in ("mean", "sum_over_batch_size"):
            valid = valid * ops.divide_no_nan(ops.cast(ops.size(valid), "float32"), ops.sum(valid))
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
            if len(sample_weight.shape) == len(valid.shape) + 1:
                sample_weight = ops.squeeze(sample_weight, axis=-1)
            valid = sample_weight * valid
        return super().__call__(y_true, y_pred, sample_weight=valid)

    def call(self, y_true, y_pred):
        targets = _targets(y_true, y_pred)
        if self.ignore_class is None:
            return _token_cross_entropy(y_pred, targets)
        valid = ops.not_equal(targets, self.ignore_class)
        return ops.where(valid, _token_cross_entropy(y_pred, ops.where(valid, targets, 0)), 0.0)

    def get_config(self):
        return {"name": self.name, "reduction": self.reduction, "dtype": self.dtype, "ignore_class": self.ignore_class}


def _targets(y_true, y_pred):
    """Int32 targets `(B, T)`, from `(B, T)` or `(B, T, 1)`."""
    targets = ops.cast(y_true, "int32")
    if len(targets.shape) == len(y_pred.shape):
        targets = ops.squeeze(targets, axis=-1)
    return targets


@ops.custom_gradient
def _token_cross_entropy(logits, targets):
    """`logsumexp(logits) - logits[target]` per position `(B, T)`, float32."""
    statistics = ops.cast(logits, "float32")
    vocabulary_size = ops.shape(logits)[-1]
    normaliser = ops.logsumexp(statistics, axis=-1)
    in_range = ops.logical_and(ops.greater_equal(targets, 0), ops.less(targets, vocabulary_size))
    picked = ops.squeeze(
        ops.take_along_axis(statistics, ops.expand_dims(ops.where(in_range, targets, 0), -1), axis=-1), axis=-1
    )
    picked = ops.where(in_range, picked, float("nan"))  # a target that is no token: NaN, not a clamped index

    def gradient(*args, upstream=None):
        if upstream is None:
            (upstream,) = args
        probabilities = ops.exp(statistics - ops.expand_dims(normaliser, -1))
        one_hot = ops.one_hot(targets, vocabulary_size, dtype="float32")
        logits_gradient = (probabilities - one_hot) * ops.expand_dims(ops.cast(upstream, "float32"), -1)
        return ops.cast(logits_gradient, logits.dtype), None

    return normaliser - picked, gradient
