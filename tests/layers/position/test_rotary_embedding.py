import numpy as np
import pytest
from harness import LayerHarness
from reference import rotary

from keras_tfam.layers import RotaryEmbedding

rng = np.random.default_rng(0)


class TestRotaryHarness(LayerHarness):
    layer_cls = RotaryEmbedding
    mixed_precision_tolerance = 5e-3

    def make_inputs(self):
        return {"inputs": rng.normal(size=(2, 6, 3, 8)).astype("float32")}


def test_matches_paper_rotation():
    x = rng.normal(size=(2, 5, 3, 8)).astype("float32")
    np.testing.assert_allclose(RotaryEmbedding()(x), rotary(x, range(5)), atol=1e-5)
    np.testing.assert_allclose(
        RotaryEmbedding()(x, start_index=7), rotary(x, range(7, 12)), atol=1e-5
    )


def test_half_pairing_is_a_permutation_of_interleaved():
    x = rng.normal(size=(1, 5, 2, 8)).astype("float32")
    # Interleave the halves: feature i pairs with i + d/2 in "half" layout.
    order = np.stack([np.arange(4), np.arange(4) + 4], axis=-1).reshape(-1)
    half = np.asarray(RotaryEmbedding(pairing="half")(x))
    interleaved = np.asarray(RotaryEmbedding()(x[..., order]))
    np.testing.assert_allclose(half[..., order], interleaved, atol=1e-6)


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_dot_product_depends_only_on_relative_position(pairing):
    rope = RotaryEmbedding(pairing=pairing)
    q = rng.normal(size=(1, 1, 1, 16)).astype("float32")
    k = rng.normal(size=(1, 1, 1, 16)).astype("float32")

    def score(m, n):
        return float(np.sum(np.asarray(rope(q, start_index=m)) * np.asarray(rope(k, start_index=n))))

    for m, n in [(0, 3), (5, 8), (40, 43)]:
        np.testing.assert_allclose(score(m, n), score(0, 3), rtol=1e-4)
    assert abs(score(0, 3) - score(0, 4)) > 1e-3


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: pairing='neox'"):
        RotaryEmbedding(pairing="neox")
    with pytest.raises(ValueError, match="even head_dim"):
        RotaryEmbedding()(np.zeros((1, 2, 1, 5), "float32"))
