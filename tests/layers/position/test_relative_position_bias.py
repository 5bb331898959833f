import numpy as np
import pytest
from harness import LayerHarness
from reference import t5_bucket

from keras_tfam.layers import RelativePositionBias, relative_position_buckets

rng = np.random.default_rng(0)


class TestRelativePositionBiasHarness(LayerHarness):
    layer_cls = RelativePositionBias
    init_kwargs = {"num_heads": 3, "num_buckets": 8, "max_distance": 16, "embeddings_initializer": "random_normal"}

    def make_inputs(self):
        return {"attention_scores": rng.normal(size=(2, 3, 5, 6)).astype("float32")}


@pytest.mark.parametrize("bidirectional", [True, False])
def test_buckets_match_t5(bidirectional):
    distances = np.arange(-300, 300)
    buckets = np.asarray(relative_position_buckets(distances, bidirectional, 32, 128))
    expected = [t5_bucket(int(d), bidirectional, 32, 128) for d in distances]
    np.testing.assert_array_equal(buckets, expected)


def test_known_bucket_values():
    # Bidirectional, 32 buckets, max distance 128 (T5 defaults).
    d = np.array([0, 1, 7, 8, 20, 128, 1000, -1, -20])
    np.testing.assert_array_equal(relative_position_buckets(d, True, 32, 128), [0, 1, 7, 8, 10, 15, 15, 17, 26])


def test_bias_looks_up_the_bucket_of_each_pair():
    layer = RelativePositionBias(num_heads=2, num_buckets=8, max_distance=20, bidirectional=False)
    layer.build()
    table = rng.normal(size=(8, 2)).astype("float32")
    layer.set_weights([table])
    out = np.asarray(layer(np.zeros((1, 2, 4, 6), "float32"), query_offset=2))
    for i in range(4):
        for j in range(6):
            bucket = t5_bucket(i + 2 - j, False, 8, 20)
            np.testing.assert_allclose(out[0, :, i, j], table[bucket])


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: num_buckets=2"):
        RelativePositionBias(2, num_buckets=2)
    with pytest.raises(ValueError, match="Received: max_distance=4"):
        RelativePositionBias(2, num_buckets=32, max_distance=4)
