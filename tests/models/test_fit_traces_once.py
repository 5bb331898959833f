"""The library's models build themselves, their compiled metrics and their optimizer before the first `fit`
(`keras_tfam.models.fit_traces_once`): on TensorFlow the train step is traced once instead of twice, and the
training is Keras' own, bit for bit."""

import keras
import numpy as np
import pytest

from keras_tfam.models import TransformerXLLM

BACKEND = keras.config.backend()


def unbuilt_model(memory_length):
    keras.utils.set_random_seed(3)
    model = TransformerXLLM(50, num_layers=1, num_heads=2, hidden_dim=16, memory_length=memory_length)
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    return model


@pytest.mark.parametrize(
    "data,memory_length",
    # Arrays build the model for their batch size: Transformer-XL's stream memory needs it. A dataset of
    # unknown batch size builds from its element_spec, as the traced step would.
    [("arrays", 8), ("dataset", 0)],
)
def test_an_unbuilt_model_traces_its_first_fit_once_and_trains_as_keras_does(data, memory_length):
    text = np.random.default_rng(0).integers(0, 50, size=(8, 17)).astype("int32")
    x, y = text[:, :-1], text[:, 1:]
    if data == "dataset":
        if BACKEND != "tensorflow":
            pytest.skip("tf.data on TensorFlow")
        import tensorflow as tf

        def arguments():
            return (tf.data.Dataset.from_tensor_slices((x, y)).batch(4),), {}
    else:
        def arguments():
            return (x, y), {"batch_size": 4, "shuffle": False}

    models, traces, histories = [], [], []
    for fit in (TransformerXLLM.fit, keras.Model.fit):
        model = unbuilt_model(memory_length)
        assert not model.built
        if fit is TransformerXLLM.fit and BACKEND == "tensorflow":
            train_step = model.train_step
            model.train_step = lambda batch: (traces.append(batch), train_step(batch))[1]
        args, kwargs = arguments()
        histories.append(fit(model, *args, epochs=2, verbose=0, **kwargs).history)
        models.append(model)

    # Keras' own TensorFlow trainer traces twice (once creating the variables).
    assert len(traces) == (1 if BACKEND == "tensorflow" else 0)
    assert histories[0] == histories[1]
    # The same variables in the same order (under the two models' own names).
    assert [w.path.split("/", 1)[1] for w in models[0].weights] == [w.path.split("/", 1)[1] for w in models[1].weights]
    for ours, keras_own in zip(models[0].weights, models[1].weights):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(keras_own))
