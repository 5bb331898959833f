import keras
import numpy as np
import pytest
from backend import build_optimizer
from block_reference import encoder_block
from harness import LayerHarness
from reference import sinusoidal_table

from keras_tfam.layers import AdaptiveComputationTime, TransformerEncoderBlock, UniversalTransformer

rng = np.random.default_rng(0)


def block(**kwargs):
    return TransformerEncoderBlock(2, 16, **kwargs)


class TestFixedStepsHarness(LayerHarness):
    layer_cls = UniversalTransformer
    init_kwargs = {"max_steps": 3}

    def _layer(self, **overrides):
        # A fresh block per layer: the harness builds several layers.
        return UniversalTransformer(block(dtype=overrides.get("dtype")), **{**self.init_kwargs, **overrides})

    def make_inputs(self):
        return {"inputs": rng.normal(size=(2, 5, 8)).astype("float32")}


class TestAdaptiveHarness(TestFixedStepsHarness):
    init_kwargs = {"max_steps": 4}
    call_kwargs = {"use_causal_mask": True}

    def _layer(self, **overrides):
        halting = AdaptiveComputationTime(0.05, 0.01, dtype=overrides.get("dtype"))
        return UniversalTransformer(
            block(dtype=overrides.get("dtype")), halting=halting, **{**self.init_kwargs, **overrides}
        )


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_fixed_steps_equal_a_stack_of_the_same_block(norm_position):
    # Dehghani et al.: h_t = block(h_{t-1} + P_t), P_t = sinusoid(position) + sinusoid(t).
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    padding = np.array([[1] * 6, [1] * 4 + [0] * 2], bool)
    shared = block(norm_position=norm_position, bias_initializer="random_normal")
    ut = UniversalTransformer(shared, max_steps=3)
    out = np.asarray(ut(x, padding_mask=padding))
    positions = sinusoidal_table(6, 8)
    steps = sinusoidal_table(4, 8)
    mask = padding[:, None, :] & padding[:, :, None]
    h = x.astype(np.float64)
    for t in (1, 2, 3):
        h = encoder_block(shared, h + positions + steps[t], mask)
    np.testing.assert_allclose(out, h, atol=2e-5)


def test_act_weights_sum_to_one_and_inference_skips_nothing_it_needs():
    x = rng.normal(size=(3, 7, 8)).astype("float32")
    halting = AdaptiveComputationTime(0.01, 0.01, kernel_initializer="random_normal", halting_bias_initializer="zeros")
    ut = UniversalTransformer(block(), max_steps=6, halting=halting)
    outputs, weights, steps = ut(x, return_halting=True, training=True)
    weights, steps = np.asarray(weights), np.asarray(steps)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-6)
    # Weights after the halting step are zero; before it, the halting probabilities (> 0).
    nonzero = (weights > 0).sum(axis=1)
    np.testing.assert_array_equal(nonzero, steps)
    assert np.all((steps >= 1) & (steps <= 6))
    (ponder,) = ut.losses
    remainder = np.take_along_axis(weights, (steps[:, None] - 1).astype(int), axis=1)[:, 0]
    np.testing.assert_allclose(float(np.asarray(ponder)), 0.01 * (steps + remainder).mean(), rtol=1e-5)
    # Inference (skipping the steps after everything halted) gives the same result.
    again, again_weights, _ = ut(x, return_halting=True, training=False)
    np.testing.assert_allclose(np.asarray(again), np.asarray(outputs), atol=1e-6)
    np.testing.assert_allclose(np.asarray(again_weights), weights, atol=1e-6)


def test_halted_positions_keep_their_state():
    # A large halting bias halts every position after step 1: output = block(x + P_1).
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    halting = AdaptiveComputationTime(0.01, 0.0, halting_bias_initializer=keras.initializers.Constant(20.0))
    ut = UniversalTransformer(block(), max_steps=4, halting=halting)
    outputs, _, steps = ut(x, return_halting=True)
    np.testing.assert_array_equal(np.asarray(steps), 1.0)
    first = ut.block(x + np.asarray(ut.coordinate_embedding(x, 1)))
    np.testing.assert_allclose(np.asarray(outputs), np.asarray(first), atol=1e-5)


def shift_task(batch, length=8, vocabulary=6, seed=0):
    """Each position outputs the token `d` places to its left, `d` in {0, 2} (given as a flag).

    Attention is banded (a position sees itself and its left neighbour), so a
    token moves one place per step: `d = 2` needs at least two steps, `d = 0`
    one.
    """
    r = np.random.default_rng(seed)
    tokens = r.integers(0, vocabulary, size=(batch, length))
    hard = r.random((batch, length)) < 0.5
    hard[:, :2] = False
    targets = np.where(hard, np.roll(tokens, 2, axis=1), tokens)
    return tokens, hard.astype("int32"), targets


def test_positions_halt_later_where_the_task_is_harder():
    keras.utils.set_random_seed(3)
    length, width = 8, 32
    band = np.tril(np.ones((1, length, length), bool)) & ~np.tril(np.ones((1, length, length), bool), -2)
    token_embedding, flag_embedding = keras.layers.Embedding(6, width), keras.layers.Embedding(2, width)
    # The halting unit starts at "use every step" (p = sigmoid(-4)).
    halting = AdaptiveComputationTime(
        0.01, 0.1, halting_bias_initializer=keras.initializers.Constant(-4.0), kernel_initializer="zeros"
    )
    ut = UniversalTransformer(TransformerEncoderBlock(4, 64, norm_position="pre"), max_steps=3, halting=halting)
    tokens_in, flags_in = keras.Input((length,), dtype="int32"), keras.Input((length,), dtype="int32")
    hidden = ut(token_embedding(tokens_in) + flag_embedding(flags_in), attention_mask=band)
    model = keras.Model([tokens_in, flags_in], keras.layers.Dense(6)(hidden))
    tokens, hard, targets = shift_task(2048)
    held_out = shift_task(256, seed=1)

    def accuracy():
        tokens, hard, targets = held_out
        return (np.asarray(model.predict([tokens, hard], verbose=0)).argmax(-1) == targets).mean()

    # Warm-up: the block learns the task with the halting unit frozen (up to 15
    # epochs); then ACT trains too, and the easy positions learn to stop early.
    halting.halting_unit.trainable = False
    model.compile(keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    build_optimizer(model)
    for _ in range(15):
        model.fit([tokens, hard], targets, batch_size=64, epochs=1, verbose=0)
        if accuracy() > 0.97:
            break
    halting.halting_unit.trainable = True
    model.compile(keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    build_optimizer(model)
    model.fit([tokens, hard], targets, batch_size=64, epochs=3, verbose=0)

    assert accuracy() > 0.95
    tokens, hard, _ = held_out
    _, _, steps = ut(token_embedding(tokens) + flag_embedding(hard), attention_mask=band, return_halting=True)
    steps = np.asarray(steps)
    assert steps[hard == 1].mean() > steps[hard == 0].mean() + 0.5
