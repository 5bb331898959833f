import numpy as np
import pytest
from harness import LayerHarness

from keras_tfam.layers import PositionEmbedding

rng = np.random.default_rng(0)


class TestPositionEmbeddingHarness(LayerHarness):
    layer_cls = PositionEmbedding
    init_kwargs = {"sequence_length": 8}

    def make_inputs(self):
        return {"inputs": rng.normal(size=(2, 6, 4)).astype("float32")}


def test_rows_of_the_table_at_the_offset():
    layer = PositionEmbedding(sequence_length=10)
    x = np.zeros((2, 3, 4), "float32")
    layer.build(x.shape)
    table = rng.normal(size=(10, 4)).astype("float32")
    layer.set_weights([table])
    np.testing.assert_array_equal(layer(x)[1], table[:3])
    np.testing.assert_array_equal(layer(x, start_index=6)[0], table[6:9])


def test_too_long_or_bad_length_raises():
    layer = PositionEmbedding(sequence_length=4)
    with pytest.raises(ValueError, match="exceed the 4 positions"):
        layer(np.zeros((1, 5, 2), "float32"))
    with pytest.raises(ValueError, match="Received: sequence_length=0"):
        PositionEmbedding(sequence_length=0)
