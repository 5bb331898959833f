import numpy as np
import pytest
from harness import LayerHarness
from reference import rms_norm

from keras_tfam.layers import RMSNorm

rng = np.random.default_rng(0)


class TestRMSNormHarness(LayerHarness):
    layer_cls = RMSNorm
    init_kwargs = {"epsilon": 1e-6}

    def make_inputs(self):
        return {"inputs": rng.normal(size=(3, 5, 8)).astype("float32")}


def test_matches_paper_formula():
    x = rng.normal(2.0, 3.0, size=(2, 4, 16)).astype("float32")
    layer = RMSNorm(epsilon=1e-6)
    layer.build(x.shape)
    gain = rng.normal(size=16).astype("float32")
    layer.set_weights([gain])
    np.testing.assert_allclose(layer(x), rms_norm(x, gain, 1e-6), rtol=1e-5, atol=1e-6)


def test_float16_inputs_with_large_values_stay_finite():
    layer = RMSNorm(dtype="mixed_float16")
    x = np.full((1, 2, 64), 300.0, "float16")  # x^2 summed overflows float16
    out = np.asarray(layer(x)).astype("float32")
    np.testing.assert_allclose(out, 1.0, rtol=1e-3)


def test_bad_epsilon():
    with pytest.raises(ValueError, match="Received: epsilon=-1"):
        RMSNorm(epsilon=-1)
