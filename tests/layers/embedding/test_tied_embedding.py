import keras
import numpy as np
import pytest
from harness import LayerHarness

from keras_tfam.layers import TiedEmbedding

rng = np.random.default_rng(0)


class TestTiedEmbeddingHarness(LayerHarness):
    layer_cls = TiedEmbedding
    init_kwargs = {"vocabulary_size": 20, "output_dim": 8}

    def make_inputs(self):
        return {"inputs": rng.integers(0, 20, size=(3, 5)).astype("int32")}


class TestTiedEmbeddingReverseHarness(LayerHarness):
    layer_cls = TiedEmbedding
    init_kwargs = {"vocabulary_size": 20, "output_dim": 8}
    call_kwargs = {"reverse": True}

    def make_inputs(self):
        return {"inputs": rng.normal(size=(3, 5, 8)).astype("float32")}


def test_lookup_and_tied_logits_use_one_matrix():
    layer = TiedEmbedding(20, 8)
    ids = rng.integers(0, 20, size=(2, 4))
    hidden = rng.normal(size=(2, 4, 8)).astype("float32")
    layer.build()
    table = np.asarray(layer.embeddings)
    np.testing.assert_array_equal(layer(ids), table[ids])
    np.testing.assert_allclose(layer(hidden, reverse=True), hidden @ table.T, rtol=1e-5, atol=1e-5)
    assert len(layer.weights) == 1


def test_logits_are_float32_under_mixed_precision():
    layer = TiedEmbedding(20, 8, dtype="mixed_float16")
    out = layer(layer(np.array([[1, 2]])), reverse=True)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"


def test_bad_sizes():
    with pytest.raises(ValueError, match="Received: vocabulary_size=0"):
        TiedEmbedding(0, 8)


def test_ids_outside_the_vocabulary_are_refused():
    layer = TiedEmbedding(7, 4)
    with pytest.raises(ValueError, match=r"Token ids must be in \[0, 7\).*Received: token id -1 at index \(1, 2\)"):
        layer(np.array([[0, 1, 2], [3, 4, -1]]))
    with pytest.raises(ValueError, match=r"Received: token id 7 at index \(0, 0\)"):
        layer(np.array([[7]]))
    np.testing.assert_allclose(layer(np.array([[6]]))[0, 0], layer.embeddings.numpy()[6])
