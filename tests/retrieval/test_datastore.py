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


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_key_is_refused_naming_its_row(bad):
    keys = rng.normal(size=(6, 3)).astype("float32")
    keys[4, 1] = bad  # its distances would be NaN, and every query's p_kNN with them
    datastore = Datastore(6, 3, 5, k=2)
    with pytest.raises(ValueError) as error:
        datastore.set_entries(keys, [0, 1, 2, 3, 4, 0])
    message = str(error.value)
    assert "\n" not in message and message.endswith(f"Received: keys[4] holds {bad}")
    with pytest.raises(ValueError, match=rf"Received: keys\[7\] holds {bad}$"):  # rows named by entry index
        Datastore(10, 3, 5, k=2).write_entries(3, keys, [0, 1, 2, 3, 4, 0])


@pytest.mark.parametrize(
    "values, shown",
    [([0, 1, 2, 3, 4, -1], r"values\[5\]=-1"), ([0, 1.5, 2, 3, 4, 0], "values of dtype float64")],
)
def test_values_that_are_not_token_ids_are_refused(values, shown):
    with pytest.raises(ValueError, match=f"Received: .*{shown}$"):
        Datastore(6, 3, 5, k=2).set_entries(np.zeros((6, 3)), values)


def test_entries_written_block_by_block_equal_set_entries():
    keys = rng.normal(size=(10, 4)).astype("float32")
    values = rng.integers(0, 7, size=10)
    whole, blocks = Datastore(10, 4, 7, k=3), Datastore(10, 4, 7, k=3)
    whole.set_entries(keys, values)
    for start in (0, 4, 8):
        blocks.write_entries(start, keys[start : start + 4], values[start : start + 4])
    np.testing.assert_array_equal(np.asarray(blocks.keys), keys)
    np.testing.assert_array_equal(np.asarray(blocks.values), values)
    queries = rng.normal(size=(1, 3, 4)).astype("float32")
    np.testing.assert_allclose(np.asarray(blocks(queries)), np.asarray(whole(queries)), atol=1e-6)
    with pytest.raises(ValueError, match=r"do not fit a datastore of size=10. Received: start=8"):
        blocks.write_entries(8, keys[:3], values[:3])


def test_from_model_streams_the_keys_instead_of_collecting_them():
    """The keys go into the layer batch by batch: NumPy never holds them all (once: a list, then its concatenation)."""
    import tracemalloc

    from keras_tfam.models import GPT2LM

    keras.utils.set_random_seed(0)
    model = GPT2LM(vocabulary_size=31, num_layers=1, num_heads=2, hidden_dim=512, max_sequence_length=32)
    corpus = np.random.default_rng(1).integers(0, 31, size=(64, 33))
    inputs, targets = corpus[:, :-1], corpus[:, 1:]
    Datastore.from_model(model, inputs[:4], targets[:4], batch_size=4, k=2)  # warm-up
    tracemalloc.start()
    datastore = Datastore.from_model(model, inputs, targets, batch_size=4, k=2)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    key_bytes = datastore.size * datastore.key_dim * 4  # 64 * 32 keys of 512 float32: 4 MiB
    assert datastore.size == 64 * 32
    assert peak < 0.5 * key_bytes, peak / key_bytes  # measured: 2.1x before streaming
    np.testing.assert_array_equal(np.asarray(datastore.values), targets.reshape(-1))
