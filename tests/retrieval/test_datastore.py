import keras
import numpy as np
import pytest
from harness import LayerHarness

from keras_tfam.retrieval import Datastore

rng = np.random.default_rng(0)
KEYS = rng.normal(size=(12, 4)).astype("float32")
VALUES = rng.integers(0, 7, size=12)


class TestDatastoreHarness(LayerHarness):
    layer_cls = Datastore
    init_kwargs = {"size": 12, "key_dim": 4, "vocabulary_size": 7, "k": 5, "temperature": 2.0, "chunk_size": 5}

    def _layer(self, **overrides):
        layer = super()._layer(**overrides)
        layer.set_entries(KEYS, VALUES)
        return layer

    def make_inputs(self):
        return {"queries": (KEYS[:6].reshape(2, 3, 4) + 0.3 * rng.normal(size=(2, 3, 4))).astype("float32")}


def numpy_p_knn(queries, keys, values, k, temperature, vocabulary_size):
    """Khandelwal et al. eq. 2 with exact squared L2 distances."""
    d = ((queries[..., None, :].astype(np.float64) - keys) ** 2).sum(-1)
    nearest = np.argsort(d, axis=-1)[..., :k]
    nd = np.take_along_axis(d, nearest, axis=-1)
    w = np.exp(-(nd - nd.min(-1, keepdims=True)) / temperature)
    w /= w.sum(-1, keepdims=True)
    p = np.zeros(queries.shape[:-1] + (vocabulary_size,))
    for index in np.ndindex(queries.shape[:-1]):
        for weight, entry in zip(w[index], nearest[index]):
            p[index + (values[entry],)] += weight
    return p


def test_p_knn_matches_numpy():
    keys = rng.normal(size=(40, 6)).astype("float32")
    values = rng.integers(0, 9, size=40)
    datastore = Datastore(40, 6, 9, k=8, temperature=3.0, chunk_size=16)
    datastore.set_entries(keys, values)
    queries = rng.normal(size=(2, 5, 6)).astype("float32")
    p = np.asarray(datastore(queries))
    np.testing.assert_allclose(p, numpy_p_knn(queries, keys, values, 8, 3.0, 9), atol=1e-5)
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
    distances, tokens = datastore.search(queries)
    d = ((queries[..., None, :] - keys) ** 2).sum(-1)
    np.testing.assert_array_equal(np.asarray(tokens), values[np.argsort(d, axis=-1)[..., :8]])


def test_save_load_keeps_the_entries(tmp_path):
    datastore = Datastore(12, 4, 7, k=3)
    datastore.set_entries(KEYS, VALUES)
    inputs = keras.Input((None, 4))
    model = keras.Model(inputs, datastore(inputs))
    queries = rng.normal(size=(1, 3, 4)).astype("float32")
    path = str(tmp_path / "datastore.keras")
    model.save(path)
    np.testing.assert_allclose(keras.saving.load_model(path)(queries), model(queries), atol=1e-6)


def test_bad_arguments():
    with pytest.raises(ValueError, match="datastore is empty.*Received: size=0"):
        Datastore(0, 4, 7)
    with pytest.raises(ValueError, match="Received: k=5, size=4"):
        Datastore(4, 4, 7, k=5)
    with pytest.raises(ValueError, match="Received: temperature=0"):
        Datastore(4, 4, 7, k=2, temperature=0)
    datastore = Datastore(4, 2, 7, k=2)
    with pytest.raises(ValueError, match=r"token ids in \[0, 7\). Received: values in \[0, 9\]"):
        datastore.set_entries(np.zeros((4, 2)), [0, 1, 2, 9])
    with pytest.raises(ValueError, match=r"Received: keys.shape=\(3, 2\)"):
        datastore.set_entries(np.zeros((3, 2)), [0, 1, 2])
