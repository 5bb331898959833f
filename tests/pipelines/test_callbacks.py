"""SafeBackupAndRestore and the training series on a small Keras model (`tfam` runs: test_training, test_recovery;
every flag value: test_step_flags)."""

import glob
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from pipelines.callbacks import SafeBackupAndRestore, StepProfiler, ThroughputMonitor
from pipelines.step_schedule import StepSchedule

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


def _values(log_dir, tag):
    values = {}
    for name in sorted(os.listdir(log_dir)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(log_dir, name)):
            for value in event.summary.value:
                if value.tag == tag:
                    values[event.step] = float(tf.make_ndarray(value.tensor))
    return values


class EpochLosses(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.losses = []

    def on_epoch_end(self, epoch, logs=None):
        self.losses.append(logs["loss"])


def test_training_series_are_written_at_the_log_steps_with_the_interval_mean(tmp_path):
    # Epochs of gcd(6, 6, 4, 6) = 2 steps; logs at 4 and 6 (the end), each with its steps' mean loss.
    schedule = StepSchedule(max_steps=6, backup_every=6, eval_every=6, log_every=4)
    assert schedule.epoch_steps == 2
    monitor, losses = ThroughputMonitor(4 * 3, str(tmp_path), schedule), EpochLosses()
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(4).repeat()
    small_model().fit(
        data, epochs=schedule.epochs, steps_per_epoch=schedule.batches_per_epoch, verbose=0, callbacks=[losses, monitor]
    )
    written = _values(str(tmp_path / "train"), "epoch_loss")
    assert sorted(written) == [4, 6]
    np.testing.assert_allclose(written[4], np.mean(losses.losses[:2]), rtol=1e-6)
    np.testing.assert_allclose(written[6], losses.losses[2], rtol=1e-6)
    assert sorted(_values(str(tmp_path / "train"), "learning_rate")) == [4, 6]
    assert len(monitor.rates) == 2 and all(rate > 0 for rate in monitor.rates)


def test_backups_by_step_are_made_where_the_schedule_says_and_resumed_only_there(tmp_path):
    backup_dir = str(tmp_path / "backup")
    schedule = StepSchedule(max_steps=7, backup_every=3, eval_every=7)
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(4).repeat()
    backup = SafeBackupAndRestore(backup_dir, keep=5, delete_checkpoint=False, schedule=schedule)
    small_model().fit(
        data, epochs=schedule.epochs, steps_per_epoch=schedule.batches_per_epoch, verbose=0, callbacks=[backup]
    )
    with open(os.path.join(backup_dir, "training_metadata.json")) as f:
        assert [b["step"] for b in json.load(f)["backups"]] == [7, 6, 3]
    assert sorted(os.listdir(backup_dir)) == [
        "step-3.weights.h5",
        "step-6.weights.h5",
        "step-7.weights.h5",
        "training_metadata.json",
    ]
    resumed = SafeBackupAndRestore(backup_dir, delete_checkpoint=False, by_step=True)
    assert resumed.restorable_step() == 7
    resumed.schedule = StepSchedule(max_steps=9, backup_every=3, eval_every=7, start=7)
    with pytest.raises(ValueError, match=r"resume at the restored backup's step 7 .*Received: initial_epoch=0$"):
        small_model().fit(data, epochs=9, steps_per_epoch=1, verbose=0, callbacks=[resumed])


def test_the_profiler_traces_the_optimizer_steps_it_is_given(tmp_path):
    # Steps 3 to 4 of a run resumed at step 1, 2 batches a step: batches 5 to 8 of the run, 3 to 6 of this fit.
    schedule = StepSchedule(max_steps=5, backup_every=5, eval_every=5, accumulation=2, start=1)
    profiler = StepProfiler(str(tmp_path), 3, 4, schedule)
    traced = []
    probe = keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: traced.append(profiler.profiling))
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(4).repeat()
    model = small_model()
    model.fit(data, epochs=1, steps_per_epoch=8, verbose=0, callbacks=[profiler, probe])
    assert traced == [False, False, True, True, True, True, False, False]
    assert glob.glob(str(tmp_path / "plugins" / "profile" / "*" / "*.xplane.pb"))
    with pytest.raises(ValueError, match=r"Received: first=3, last=2$"):
        StepProfiler(str(tmp_path), 3, 2, schedule)
