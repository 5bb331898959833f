import numpy as np
import pytest
from harness import LayerHarness
from reference import sinusoidal_table

from keras_tfam.layers import SinusoidalPositionEncoding

rng = np.random.default_rng(0)


class TestSinusoidalHarness(LayerHarness):
    layer_cls = SinusoidalPositionEncoding
    mixed_precision_tolerance = 1e-3

    def make_inputs(self):
        return {"inputs": rng.normal(size=(2, 6, 10)).astype("float32")}


@pytest.mark.parametrize("dim", [16, 7])
def test_matches_paper_table(dim):
    x = np.zeros((2, 12, dim), "float32")
    out = np.asarray(SinusoidalPositionEncoding()(x))
    np.testing.assert_allclose(out[0], sinusoidal_table(12, dim), atol=1e-5)
    np.testing.assert_array_equal(out[0], out[1])


def test_start_index_continues_the_table():
    x = np.zeros((1, 3, 8), "float32")
    out = SinusoidalPositionEncoding()(x, start_index=5)
    np.testing.assert_allclose(out[0], sinusoidal_table(8, 8)[5:], atol=1e-5)
