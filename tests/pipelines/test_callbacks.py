"""SafeBackupAndRestore and GlobalStepTensorBoard on a small Keras model (`tfam` runs: test_training, test_recovery)."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from pipelines.callbacks import GlobalStepTensorBoard, SafeBackupAndRestore

rng = np.random.default_rng(0)
X, Y = rng.normal(size=(12, 3)).astype("float32"), rng.normal(size=(12, 1)).astype("float32")


def small_model():
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.05), "mse")
    return model


def fit(model, epochs, initial_epoch=0, callbacks=()):
    # One step an epoch is a batch of 4; an epoch goes on where the one before stopped in the data.
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(4).repeat().skip(initial_epoch)
    return model.fit(
        data, epochs=epochs, initial_epoch=initial_epoch, steps_per_epoch=1, verbose=0, callbacks=list(callbacks)
    )


def test_a_resumed_fit_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    straight = small_model()
    fit(straight, 3)
    backup_dir = str(tmp_path / "backup")
    fit(small_model(), 2, callbacks=[SafeBackupAndRestore(backup_dir, delete_checkpoint=False)])
    with open(os.path.join(backup_dir, "training_metadata.json")) as f:
        metadata = json.load(f)
    assert metadata["epoch"] == 2 and metadata["step"] == 2
    assert [b["weights"] for b in metadata["backups"]] == ["epoch-2.weights.h5", "epoch-1.weights.h5"]

    backup = SafeBackupAndRestore(backup_dir, delete_checkpoint=False)
    assert backup.restorable()["epoch"] == 2
    resumed = small_model()
    history = fit(resumed, 3, initial_epoch=2, callbacks=[backup])
    assert len(history.history["loss"]) == 1
    for a, b in zip(resumed.get_weights(), straight.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert sorted(os.listdir(backup_dir)) == ["epoch-2.weights.h5", "epoch-3.weights.h5", "training_metadata.json"]


def test_a_fit_that_does_not_start_at_the_restored_epoch_is_refused(tmp_path):
    backup_dir = str(tmp_path / "backup")
    fit(small_model(), 1, callbacks=[SafeBackupAndRestore(backup_dir, delete_checkpoint=False)])
    with pytest.raises(ValueError, match=r"pass `initial_epoch=1` .*Received: initial_epoch=0"):
        fit(small_model(), 2, callbacks=[SafeBackupAndRestore(backup_dir, delete_checkpoint=False)])
    # The model keeps no epoch of its own: a later fit without the callback starts where it is told.
    model = small_model()
    fit(model, 2, initial_epoch=1, callbacks=[SafeBackupAndRestore(backup_dir, delete_checkpoint=False)])
    assert len(fit(model, 1).history["loss"]) == 1


def test_the_backups_are_deleted_at_the_end_unless_kept_and_the_arguments_are_checked(tmp_path):
    backup_dir = str(tmp_path / "backup")
    fit(small_model(), 1, callbacks=[SafeBackupAndRestore(backup_dir)])
    assert not os.path.exists(backup_dir)
    with pytest.raises(ValueError, match="Received: keep=0"):
        SafeBackupAndRestore(backup_dir, keep=0)
    with pytest.raises(ValueError, match="Received: save_freq=10"):
        SafeBackupAndRestore(backup_dir, save_freq=10)
    with pytest.raises(ValueError, match="Received: backup_dir=''"):
        SafeBackupAndRestore("")


def _steps(log_dir, tag):
    steps = []
    for name in sorted(os.listdir(log_dir)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(log_dir, name)):
            steps += [event.step for value in event.summary.value if value.tag == tag]
    return steps


def test_epoch_series_are_written_at_the_optimizer_step(tmp_path):
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(4).repeat()
    ours, keras_own = (
        GlobalStepTensorBoard(str(tmp_path / "ours")),
        keras.callbacks.TensorBoard(str(tmp_path / "keras")),
    )
    for callback in (ours, keras_own):
        small_model().fit(data, epochs=2, steps_per_epoch=3, validation_data=(X, Y), verbose=0, callbacks=[callback])
    for split in ("train", "validation"):
        assert _steps(str(tmp_path / "ours" / split), "epoch_loss") == [3, 6]
        # Why GlobalStepTensorBoard exists: Keras writes them at the epoch index.
        assert _steps(str(tmp_path / "keras" / split), "epoch_loss") == [0, 1]
    assert _steps(str(tmp_path / "ours" / "train"), "epoch_learning_rate") == [3, 6]
    with pytest.raises(ValueError, match="Received: histogram_freq=1"):
        GlobalStepTensorBoard(str(tmp_path), histogram_freq=1)
