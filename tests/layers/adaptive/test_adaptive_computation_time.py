import numpy as np
import pytest
from harness import LayerHarness

from keras_tfam.layers import AdaptiveComputationTime

rng = np.random.default_rng(0)


class TestAdaptiveComputationTimeHarness(LayerHarness):
    layer_cls = AdaptiveComputationTime
    init_kwargs = {"epsilon": 0.05, "ponder_cost_weight": 0.1, "kernel_initializer": "random_normal"}

    def make_inputs(self):
        return {"step_states": rng.normal(size=(2, 4, 5, 8)).astype("float32")}


def numpy_act(states, kernel, bias, epsilon):
    """Graves 2016, section 2, position by position: weights, N and R."""
    p = 1.0 / (1.0 + np.exp(-(states.astype(np.float64) @ kernel + bias)[..., 0]))  # (B, S, T)
    batch, steps, length = p.shape
    weights = np.zeros_like(p)
    count = np.zeros((batch, length))
    remainder = np.zeros((batch, length))
    for b in range(batch):
        for t in range(length):
            total = 0.0
            for n in range(steps):
                if n == steps - 1 or total + p[b, n, t] >= 1.0 - epsilon:
                    weights[b, n, t] = remainder[b, t] = 1.0 - total
                    count[b, t] = n + 1
                    break
                weights[b, n, t] = p[b, n, t]
                total += p[b, n, t]
    return np.einsum("bst,bstd->btd", weights, states), weights, count, remainder


@pytest.mark.parametrize("bias", [-1.0, 0.0, 2.0])
def test_matches_graves_and_adds_the_ponder_cost(bias):
    states = rng.normal(size=(2, 5, 6, 8)).astype("float32")
    padding = np.array([[1] * 6, [1] * 4 + [0] * 2], bool)
    act = AdaptiveComputationTime(
        epsilon=0.1, ponder_cost_weight=0.5, kernel_initializer="random_normal", halting_bias_initializer="zeros"
    )
    act.build(states.shape)
    act.halting_unit.bias.assign([bias])
    outputs, weights, steps = act(states, padding_mask=padding, return_halting=True)
    kernel = np.asarray(act.halting_unit.kernel, np.float64)
    expected, expected_weights, count, remainder = numpy_act(states, kernel, bias, 0.1)
    np.testing.assert_allclose(np.asarray(weights), expected_weights, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(steps), count)
    np.testing.assert_allclose(np.asarray(outputs), expected, atol=1e-5)
    np.testing.assert_allclose(np.asarray(weights).sum(axis=1), 1.0, atol=1e-6)
    cost = 0.5 * (count + remainder)[padding].mean()
    (loss,) = act.losses
    np.testing.assert_allclose(float(np.asarray(loss)), cost, rtol=1e-5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: epsilon=1.0"):
        AdaptiveComputationTime(epsilon=1.0)
    with pytest.raises(ValueError, match="Received: ponder_cost_weight=-0.1"):
        AdaptiveComputationTime(ponder_cost_weight=-0.1)
