"""The library's built models build their optimizer before the first `fit` (`keras_tfam.models.fit_traces_once`):
on TensorFlow the train step is traced once instead of twice, and the training is Keras' own, bit for bit."""

import keras
import numpy as np

from keras_tfam.losses import TokenCrossEntropy
from keras_tfam.models import GPT2LM

BACKEND = keras.config.backend()


def test_a_built_model_traces_its_first_fit_once_and_trains_as_keras_does():
    text = np.random.default_rng(0).integers(0, 50, size=(8, 17)).astype("int32")
    models, traces, histories = [], [], []
    for fit in (GPT2LM.fit, keras.Model.fit):
        keras.utils.set_random_seed(3)
        model = GPT2LM(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=16, max_sequence_length=16)
        model.compile(optimizer=keras.optimizers.AdamW(1e-2), loss=TokenCrossEntropy())
        if fit is GPT2LM.fit and BACKEND == "tensorflow":
            train_step = model.train_step
            model.train_step = lambda batch: (traces.append(batch), train_step(batch))[1]
        history = fit(model, text[:, :-1], text[:, 1:], batch_size=4, shuffle=False, epochs=2, verbose=0)
        histories.append(history.history)
        models.append(model)

    assert len(traces) == (1 if BACKEND == "tensorflow" else 0)  # Keras' own TensorFlow trainer traces twice
    assert histories[0] == histories[1]
    for ours, keras_own in zip(models[0].weights, models[1].weights):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(keras_own))
    assert len(models[0].optimizer.variables) == len(models[1].optimizer.variables)
