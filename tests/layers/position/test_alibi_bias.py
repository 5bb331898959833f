import numpy as np
import pytest
from harness import LayerHarness

from keras_tfam.layers import ALiBiBias, alibi_slopes

rng = np.random.default_rng(0)


class TestALiBiHarness(LayerHarness):
    layer_cls = ALiBiBias
    init_kwargs = {"num_heads": 4}

    def make_inputs(self):
        return {"attention_scores": rng.normal(size=(2, 4, 5, 5)).astype("float32")}


def test_slopes_from_the_paper():
    # Press et al.: for 8 heads, 1/2^1 ... 1/2^8.
    np.testing.assert_allclose(alibi_slopes(8), [2.0**-i for i in range(1, 9)])
    # 16 heads: 1/2^0.5, 1/2^1, ..., 1/2^8.
    np.testing.assert_allclose(alibi_slopes(16), [2.0 ** (-0.5 * i) for i in range(1, 17)], rtol=1e-6)
    # 6 heads (not a power of two): the 4-head slopes, then the odd ones of 8 heads.
    np.testing.assert_allclose(alibi_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])


def test_bias_is_minus_slope_times_distance():
    scores = np.zeros((1, 6, 4, 4), "float32")
    out = np.asarray(ALiBiBias(6)(scores))
    i, j = np.meshgrid(np.arange(4), np.arange(4), indexing="ij")
    expected = -alibi_slopes(6)[:, None, None] * np.abs(i - j)[None]
    np.testing.assert_allclose(out[0], expected, atol=1e-6)
    # Causal rows: softmax-equivalent to the paper's m * (j - i) for j <= i.
    causal = np.tril(np.ones((4, 4), bool))
    np.testing.assert_allclose(out[0][:, causal], (alibi_slopes(6)[:, None, None] * (j - i))[:, causal])


def test_offset_gives_the_same_rows_as_a_full_pass():
    layer = ALiBiBias(4)
    full = np.asarray(layer(np.zeros((1, 4, 8, 8), "float32")))
    tail = np.asarray(layer(np.zeros((1, 4, 3, 8), "float32"), query_offset=5))
    np.testing.assert_allclose(tail, full[:, :, 5:])


def test_bad_heads():
    with pytest.raises(ValueError, match="Received: num_heads=0"):
        ALiBiBias(0)
