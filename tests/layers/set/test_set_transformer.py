import keras
import numpy as np
import pytest
from backend import build_optimizer
from harness import LayerHarness
from reference import dense, layer_norm, multi_head_attention

from keras_tfam.layers import ISAB, MAB, PMA, SAB

rng = np.random.default_rng(0)


class TestMABHarness(LayerHarness):
    layer_cls = MAB
    init_kwargs = {"num_heads": 2, "intermediate_dim": 12}

    def make_inputs(self):
        return {
            "query": rng.normal(size=(2, 4, 8)).astype("float32"),
            "value": rng.normal(size=(2, 6, 5)).astype("float32"),
        }


class TestSABHarness(LayerHarness):
    layer_cls = SAB
    init_kwargs = {"num_heads": 2}

    def make_inputs(self):
        return {"inputs": rng.normal(size=(2, 6, 8)).astype("float32")}


class TestISABHarness(LayerHarness):
    layer_cls = ISAB
    init_kwargs = {"num_heads": 2, "num_inducing": 3}

    def make_inputs(self):
        return {
            "inputs": rng.normal(size=(2, 6, 8)).astype("float32"),
            "mask": np.array([[1] * 6, [1] * 4 + [0] * 2], bool),
        }


class TestPMAHarness(LayerHarness):
    layer_cls = PMA
    init_kwargs = {"num_heads": 2, "num_seeds": 2}

    def make_inputs(self):
        return {"inputs": rng.normal(size=(2, 6, 8)).astype("float32")}


def test_mab_matches_the_paper_formula():
    x = rng.normal(size=(2, 4, 8)).astype("float32")
    y = rng.normal(size=(2, 6, 5)).astype("float32")
    layer = MAB(2, intermediate_dim=12)
    out = np.asarray(layer(x, y))
    hidden = x + multi_head_attention(x, y, layer.attention.get_weights(), 2, 2)
    g1, b1 = layer.norm_1.get_weights()
    hidden = layer_norm(hidden, g1, b1, 1e-5)
    (w1, c1), (w2, c2) = (
        layer.feed_forward.intermediate_dense.get_weights(),
        layer.feed_forward.output_dense.get_weights(),
    )
    g2, b2 = layer.norm_2.get_weights()
    expected = layer_norm(hidden + dense(np.maximum(dense(hidden, w1, c1), 0), w2, c2), g2, b2, 1e-5)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layer", [SAB(2), ISAB(2, num_inducing=3)], ids=["SAB", "ISAB"])
def test_equivariant_to_permutations(layer):
    x = rng.normal(size=(2, 7, 8)).astype("float32")
    perm = rng.permutation(7)
    np.testing.assert_allclose(np.asarray(layer(x))[:, perm], layer(x[:, perm]), rtol=1e-5, atol=1e-5)


def test_pma_invariant_to_permutations_and_padding():
    layer = PMA(2, num_seeds=3)
    x = rng.normal(size=(2, 7, 8)).astype("float32")
    perm = rng.permutation(7)
    np.testing.assert_allclose(layer(x), layer(x[:, perm]), rtol=1e-5, atol=1e-5)
    padded = np.concatenate([x, rng.normal(size=(2, 3, 8)).astype("float32")], axis=1)
    mask = np.array([[1] * 7 + [0] * 3] * 2, bool)
    np.testing.assert_allclose(layer(padded, mask=mask), layer(x), rtol=1e-5, atol=1e-5)


@pytest.mark.training
def test_set_transformer_learns_the_maximum_of_a_set():
    """ISAB -> ISAB -> PMA(1) -> Dense on sets of 5..20 numbers in [0, 1].

    Predicting the median gives a mean absolute error of ~0.063; the model must reach < 0.03.
    """
    keras.utils.set_random_seed(0)
    data = np.random.default_rng(1)

    def sets(count):
        lengths = data.integers(5, 21, size=count)
        values = data.random((count, 20, 1)).astype("float32")
        mask = np.arange(20)[None] < lengths[:, None]
        target = np.where(mask[..., None], values, -1).max(axis=(1, 2))
        return values, mask, target

    values = keras.Input((20, 1))
    mask = keras.Input((20,), dtype="bool")
    hidden = keras.layers.Dense(32)(values)
    hidden = ISAB(4, num_inducing=8)(hidden, mask=mask)
    hidden = ISAB(4, num_inducing=8)(hidden, mask=mask)
    pooled = PMA(4, num_seeds=1)(hidden, mask=mask)
    output = keras.layers.Dense(1)(keras.layers.Flatten()(pooled))
    model = keras.Model([values, mask], output)
    model.compile(keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(3e-3, 1024)), "mae", jit_compile=True)
    build_optimizer(model)
    x, m, y = sets(8192)
    model.fit([x, m], y, batch_size=64, epochs=8, verbose=0)
    x, m, y = sets(1024)
    error = float(np.mean(np.abs(model.predict([x, m], verbose=0)[:, 0] - y)))
    assert error < 0.03, error


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: num_inducing=0"):
        ISAB(2, num_inducing=0)
    with pytest.raises(ValueError, match="Received: num_seeds=0"):
        PMA(2, num_seeds=0)
    with pytest.raises(ValueError, match="width=9, num_heads=2"):
        SAB(2)(np.zeros((1, 3, 9), "float32"))
