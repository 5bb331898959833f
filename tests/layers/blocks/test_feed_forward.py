import numpy as np
import pytest
from harness import LayerHarness
from reference import dense, gelu, gelu_tanh, silu

from keras_tfam.layers import FeedForward

rng = np.random.default_rng(0)


class TestFeedForwardHarness(LayerHarness):
    layer_cls = FeedForward
    init_kwargs = {"intermediate_dim": 12, "activation": "swiglu", "output_dim": 6}

    def make_inputs(self):
        return {"inputs": rng.normal(size=(2, 5, 8)).astype("float32")}


PLAIN = {"relu": lambda h: np.maximum(h, 0), "gelu": gelu, "gelu_tanh": gelu_tanh}


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "geglu", "swiglu"])
def test_matches_numpy(activation):
    x = rng.normal(size=(2, 3, 8)).astype("float32")
    layer = FeedForward(16, activation=activation, bias_initializer="random_normal")
    out = np.asarray(layer(x))
    if activation in PLAIN:
        (w1, b1), (w2, b2) = layer.intermediate_dense.get_weights(), layer.output_dense.get_weights()
        expected = dense(PLAIN[activation](dense(x, w1, b1)), w2, b2)
    else:
        w, bw = layer.gate_dense.get_weights()
        v, bv = layer.intermediate_dense.get_weights()
        w2, b2 = layer.output_dense.get_weights()
        act = gelu if activation == "geglu" else silu
        expected = dense(act(dense(x, w, bw)) * dense(x, v, bv), w2, b2)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: activation='swish'"):
        FeedForward(8, activation="swish")
    with pytest.raises(ValueError, match="Received: intermediate_dim=0"):
        FeedForward(0)
