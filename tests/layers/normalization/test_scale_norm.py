import math

import numpy as np
import pytest
from harness import LayerHarness
from reference import scale_norm

from keras_tfam.layers import ScaleNorm, get_norm

rng = np.random.default_rng(0)


class TestScaleNormHarness(LayerHarness):
    layer_cls = ScaleNorm
    init_kwargs = {"epsilon": 1e-5}

    def make_inputs(self):
        return {"inputs": rng.normal(size=(3, 5, 8)).astype("float32")}


def test_matches_paper_formula_and_initial_gain():
    x = rng.normal(size=(2, 4, 16)).astype("float32")
    x[0, 0] = 1e-8  # below epsilon: divided by epsilon, not by the tiny norm
    layer = ScaleNorm(epsilon=1e-5)
    out = layer(x)
    assert math.isclose(float(np.asarray(layer.scale)), math.sqrt(16), rel_tol=1e-6)
    np.testing.assert_allclose(out, scale_norm(x, math.sqrt(16), 1e-5), rtol=1e-5, atol=1e-6)
    layer.set_weights([np.array(2.5, "float32")])
    np.testing.assert_allclose(layer(x), scale_norm(x, 2.5, 1e-5), rtol=1e-5, atol=1e-6)


def test_bad_epsilon_and_unknown_norm():
    with pytest.raises(ValueError, match="Received: epsilon=0"):
        ScaleNorm(epsilon=0)
    with pytest.raises(ValueError, match="Received: norm='batch'"):
        get_norm("batch", 1e-5)
