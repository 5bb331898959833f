import keras
import numpy as np
import pytest

from keras_tfam.models import AttentionPoolingLM
from pipelines.data.lm_stream import context_windows


def test_windows_predict_every_token_once():
    windows, targets = context_windows(np.arange(1, 8), 3, start_id=0)
    np.testing.assert_array_equal(targets, np.arange(1, 8))
    np.testing.assert_array_equal(windows[:4], [[0, 0, 0], [0, 0, 1], [0, 1, 2], [1, 2, 3]])


@pytest.mark.training
def test_learns_a_next_token_rule_and_saves(tmp_path):
    """Next token = token three back + 1 (mod 40): needs attention to a position, not a bag of words."""
    keras.utils.set_random_seed(0)
    data = np.random.default_rng(0)
    windows = data.integers(0, 40, size=(4096, 8)).astype("int32")
    targets = (windows[:, -3] + 1) % 40
    model = AttentionPoolingLM(40, context_length=8, num_layers=2, num_heads=4, hidden_dim=64)
    model.compile(
        keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(3e-3, 640)),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    model.fit(windows, targets, batch_size=64, epochs=10, verbose=0)
    test = data.integers(0, 40, size=(512, 8)).astype("int32")
    accuracy = np.mean(np.argmax(model.predict(test, verbose=0), -1) == (test[:, -3] + 1) % 40)
    assert accuracy > 0.95, accuracy
    path = str(tmp_path / "pool.keras")
    model.save(path)
    np.testing.assert_allclose(keras.saving.load_model(path)(test[:4]), model(test[:4]), atol=1e-5)
    assert len([w for w in model.weights if "token_embedding" in w.path]) == 1
    with pytest.raises(ValueError, match="Received: context_length=0"):
        AttentionPoolingLM(40, context_length=0, num_layers=1, num_heads=1, hidden_dim=8)
