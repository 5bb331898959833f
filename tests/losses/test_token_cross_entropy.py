"""TokenCrossEntropy against the formula (value and gradient, NumPy), Keras' own loss, and `fit`."""

import keras
import numpy as np
import pytest
from backend import gradients
from keras import ops

from keras_tfam.losses import TokenCrossEntropy

RNG = np.random.default_rng(0)
LOGITS = (3 * RNG.normal(size=(2, 5, 11))).astype("float32")
TARGETS = RNG.integers(0, 11, size=(2, 5))


def reference(logits, targets):
    """Per-position loss and d(mean loss)/d logits, from the formula."""
    shifted = logits - logits.max(-1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    one_hot = np.eye(logits.shape[-1])[targets]
    losses = -(one_hot * log_softmax).sum(-1)
    return losses, (np.exp(log_softmax) - one_hot) / targets.size


@pytest.mark.parametrize("target_shape", ["(B, T)", "(B, T, 1)"])
def test_value_and_gradient_are_the_formula(target_shape):
    targets = TARGETS if target_shape == "(B, T)" else TARGETS[..., None]
    loss = TokenCrossEntropy()
    losses, expected_gradient = reference(LOGITS.astype("float64"), TARGETS)
    np.testing.assert_allclose(float(loss(targets, LOGITS)), losses.mean(), rtol=1e-6)
    (gradient,) = gradients(lambda logits: loss(targets, logits), LOGITS)
    np.testing.assert_allclose(gradient, expected_gradient, atol=1e-7)


def test_bfloat16_logits_keep_float32_statistics():
    rounded = np.asarray(ops.convert_to_numpy(ops.cast(ops.cast(LOGITS, "bfloat16"), "float32")))
    loss = TokenCrossEntropy()
    losses, expected_gradient = reference(rounded.astype("float64"), TARGETS)
    np.testing.assert_allclose(float(loss(TARGETS, ops.cast(LOGITS, "bfloat16"))), losses.mean(), rtol=1e-6)
    (gradient,) = gradients(lambda logits: loss(TARGETS, ops.cast(logits, "bfloat16")), LOGITS)
    # The gradient is written in bfloat16: 8 significant bits.
    np.testing.assert_allclose(gradient, expected_gradient, rtol=2**-8, atol=1e-8)


def test_equals_keras_loss_with_masks_and_sample_weights():
    weights = RNG.uniform(size=(2, 5)).astype("float32")
    weights[1, 3:] = 0.0  # padding
    for reduction in ("sum_over_batch_size", "sum", "none"):
        ours, keras_loss = (
            TokenCrossEntropy(reduction=reduction),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction),
        )
        np.testing.assert_allclose(
            ops.convert_to_numpy(ours(TARGETS, LOGITS, sample_weight=weights)),
            ops.convert_to_numpy(keras_loss(TARGETS, LOGITS, sample_weight=weights)),
            rtol=1e-6,
            atol=1e-6,
        )
    (gradient,) = gradients(lambda logits: TokenCrossEntropy()(TARGETS, logits, sample_weight=weights), LOGITS)
    keras_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    (expected,) = gradients(lambda logits: keras_loss(TARGETS, logits, sample_weight=weights), LOGITS)
    np.testing.assert_allclose(gradient, expected, atol=1e-7)
    assert np.all(gradient[1, 3:] == 0)


def test_fit_with_it_is_fit_with_keras_loss_and_it_serializes():
    def trained(loss):
        keras.utils.set_random_seed(1)
        model = keras.Sequential(
            [keras.Input((5,), dtype="int32"), keras.layers.Embedding(11, 8), keras.layers.Dense(11)]
        )
        model.compile(keras.optimizers.Adam(0.05), loss)
        model.fit(TARGETS, np.roll(TARGETS, 1, axis=1), batch_size=2, epochs=3, verbose=0)
        return [ops.convert_to_numpy(w) for w in model.weights]

    for ours, theirs in zip(
        trained(TokenCrossEntropy()), trained(keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ):
        np.testing.assert_allclose(ours, theirs, atol=2e-5)
    restored = keras.losses.deserialize(keras.losses.serialize(TokenCrossEntropy(reduction="sum")))
    assert isinstance(restored, TokenCrossEntropy) and restored.reduction == "sum"


@pytest.mark.parametrize("reduction", ["sum_over_batch_size", "sum", "none"])
def test_ignore_class_is_keras_ignore_class(reduction):
    targets = TARGETS.copy()
    targets[0, 1] = targets[1, 4] = -100  # Hugging Face's "not a label"
    ours = TokenCrossEntropy(reduction=reduction, ignore_class=-100)
    keras_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction, ignore_class=-100)
    np.testing.assert_allclose(
        ops.convert_to_numpy(ours(targets, LOGITS)),
        ops.convert_to_numpy(keras_loss(targets, LOGITS)),
        rtol=1e-6,
        atol=1e-6,
    )
    (gradient,) = gradients(lambda logits: ops.sum(ours(targets, logits)), LOGITS)
    (expected,) = gradients(lambda logits: ops.sum(keras_loss(targets, logits)), LOGITS)
    np.testing.assert_allclose(gradient, expected, rtol=1e-6, atol=1e-7)  # float32 against float32, values up to 1
    assert np.all(gradient[0, 1] == 0) and np.all(gradient[1, 4] == 0)


def test_ignore_class_mean_is_over_the_other_positions():
    targets = TARGETS.copy()
    targets[1, 2:] = 0  # padding id 0 ignored
    valid = targets != 0
    losses, _ = reference(LOGITS.astype("float64"), np.where(valid, targets, 0))
    loss = TokenCrossEntropy(ignore_class=0)
    np.testing.assert_allclose(float(loss(targets, LOGITS)), losses[valid].mean(), rtol=1e-6)


@pytest.mark.parametrize("target", [-1, 11, -100])
def test_a_target_that_is_no_token_makes_the_loss_nan(target):
    targets = TARGETS.copy()
    targets[1, 3] = target
    losses = ops.convert_to_numpy(TokenCrossEntropy(reduction="none")(targets, LOGITS))
    assert np.isnan(losses[1, 3]) and np.isfinite(np.delete(losses.ravel(), 8)).all()
    assert np.isnan(float(TokenCrossEntropy()(targets, LOGITS)))


def test_ignore_class_serializes_and_bad_values_get_one_line():
    restored = keras.losses.deserialize(keras.losses.serialize(TokenCrossEntropy(ignore_class=-100)))
    assert restored.ignore_class == -100
    for bad in (1.5, "pad", True):
        with pytest.raises(
            ValueError, match=r"^`ignore_class` must be an int target id or None\. Received: ignore_class="
        ):
            TokenCrossEntropy(ignore_class=bad)
