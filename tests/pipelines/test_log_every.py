"""`--log-every`: the training series at step granularity, whatever the epochs of `fit` (backups, evaluations)."""

import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from pipeline_runs import run_tfam, tiny_args

from pipelines.step_schedule import StepSchedule
from pipelines.training_log import ThroughputMonitor


def _series(folder, tag):
    """`{step: value}` of a scalar series, read by TensorBoard's own event reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(folder)
    accumulator.Reload()
    return {event.step: float(tf.make_ndarray(event.tensor_proto)) for event in accumulator.Tensors(tag)}


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory, small_wikitext):
    """20 steps in one epoch (backups and validations at the end only), the series every 5 steps."""
    run = str(tmp_path_factory.mktemp("log-every") / "run")
    steps = {"max-steps": 20, "backup-every": 20, "eval-every": 20, "log-every": 5, "warmup-steps": 2}
    result = run_tfam(tiny_args(small_wikitext, run, **steps, jit="off", export="off"))
    return run, result.stdout


def test_a_20_step_run_logs_the_training_loss_at_steps_5_10_15_20(logged_run):
    run, stdout = logged_run
    train = os.path.join(run, "logs", "train")
    loss = _series(train, "loss")
    assert sorted(loss) == [5, 10, 15, 20]
    assert sorted(_series(train, "learning_rate")) == [5, 10, 15, 20]
    assert sorted(_series(train, "tokens_per_second")) == [5, 10, 15, 20]
    assert all(math.isfinite(value) for value in loss.values())
    # The epoch is the whole run here: its mean loss is the mean of the four intervals' (5 steps each).
    epoch_loss = _series(train, "epoch_loss")
    assert sorted(epoch_loss) == [20]
    np.testing.assert_allclose(epoch_loss[20], np.mean(list(loss.values())), rtol=1e-5)
    assert [line.split()[1] for line in stdout.splitlines() if line.startswith("step ")] == [
        "5/20",
        "10/20",
        "15/20",
        "20/20",
    ]


def test_the_learning_rate_points_follow_the_warmup_and_cosine_schedule(logged_run):
    run, _ = logged_run
    written = _series(os.path.join(run, "logs", "train"), "learning_rate")
    # tiny_args: peak 3e-3; warmup 2 steps, then a cosine decay over the other 18 to 0.1 of the peak.
    peak, warmup, alpha = 3e-3, 2, 0.1
    for step, value in written.items():
        expected = peak * (alpha + (1 - alpha) * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (20 - warmup))))
        np.testing.assert_allclose(value, expected, rtol=1e-5, err_msg=f"step {step}")


X = np.arange(24, dtype="float32").reshape(12, 2) / 10
Y = (X @ np.array([[1.0], [-2.0]], "float32")) + 0.5


def test_the_interval_loss_is_the_mean_of_its_batches_across_epochs_and_accumulation(tmp_path):
    # Weights that do not move (learning rate 0): each batch's loss is the model's error on that batch.
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.0, gradient_accumulation_steps=2), "mse")
    batch_losses = [
        float(np.mean((np.asarray(model(X[i : i + 2])) - Y[i : i + 2]) ** 2)) for i in range(0, 12, 2)
    ] * 2  # the 12 batches of two passes over the data
    # Epochs of 3 steps (6 batches), a point every 2 steps: the one at step 4 spans the two epochs.
    schedule = StepSchedule(max_steps=6, backup_every=3, eval_every=3, accumulation=2)
    monitor = ThroughputMonitor(2 * 2, str(tmp_path), schedule, log_every=2)
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(2).repeat()
    fit = dict(epochs=schedule.epochs, steps_per_epoch=schedule.batches_per_epoch, shuffle=False, verbose=0)
    model.fit(data, callbacks=[monitor], **fit)
    loss = _series(str(tmp_path / "train"), "loss")
    assert sorted(loss) == [2, 4, 6]
    for step, value in loss.items():
        np.testing.assert_allclose(value, np.mean(batch_losses[2 * step - 4 : 2 * step]), rtol=1e-5)
    epoch_loss = _series(str(tmp_path / "train"), "epoch_loss")  # at the schedule's log steps: its backups
    assert sorted(epoch_loss) == [3, 6]
    np.testing.assert_allclose(epoch_loss[3], np.mean(batch_losses[:6]), rtol=1e-5)
    assert len(monitor.rates) == 3


def test_log_every_must_be_a_positive_integer():
    with pytest.raises(ValueError, match=r"Received: log_every=0$"):
        ThroughputMonitor(8, log_every=0)
