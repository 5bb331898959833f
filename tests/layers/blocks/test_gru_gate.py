import numpy as np
import pytest
from harness import LayerHarness
from reference_memory import gru_gate

from keras_tfam.layers import GRUGate

rng = np.random.default_rng(0)


class TestGRUGateHarness(LayerHarness):
    layer_cls = GRUGate
    init_kwargs = {"gate_bias": 1.0}

    def make_inputs(self):
        return {
            "inputs": rng.normal(size=(2, 5, 8)).astype("float32"),
            "update": rng.normal(size=(2, 5, 8)).astype("float32"),
        }


def test_matches_the_papers_gate():
    x, y = rng.normal(size=(2, 3, 6)).astype("float32"), rng.normal(size=(2, 3, 6)).astype("float32")
    gate = GRUGate(gate_bias=2.0)
    out = gate(x, y)
    w, u, u_g = (
        np.asarray(v, np.float64) for v in (gate.update_kernel, gate.reset_update_kernel, gate.candidate_kernel)
    )
    expected = gru_gate(x, y, w[:, :6], u[:, :6], w[:, 6:12], u[:, 6:], w[:, 12:], u_g, 2.0)
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_large_gate_bias_is_the_identity():
    # The same weights, a growing gate bias: the update gate closes, g(x, y) -> x.
    x, y = rng.normal(size=(16, 8)).astype("float32"), rng.normal(size=(16, 8)).astype("float32")
    weights = None
    deviations = []
    for bias in (0.0, 2.0, 20.0):
        gate = GRUGate(gate_bias=bias)
        gate(x, y)
        weights = weights or gate.get_weights()
        gate.set_weights(weights)
        deviations.append(np.abs(np.asarray(gate(x, y)) - x))
    assert np.all(deviations[0] >= deviations[1]) and np.all(deviations[1] >= deviations[2])
    assert deviations[2].max() < 1e-4


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: gate_bias='high'"):
        GRUGate(gate_bias="high")
    with pytest.raises(ValueError, match=r"Received: update.shape=\(2, 4\)"):
        GRUGate()(np.zeros((2, 3), "float32"), np.zeros((2, 4), "float32"))
