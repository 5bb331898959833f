"""The step flags mean what they say at any values: `--max-steps` optimizer updates, backups after every
`--backup-every`, validations after every `--eval-every`, training series after every log interval (each also at
the end), gradient accumulation included; and a run killed anywhere, resumed, ends with an uninterrupted run's
weights.

The schedule (`StepSchedule`) is checked over many values against the flags' definitions; the callbacks that follow
it on a small Keras model, killed and resumed, over fewer; `tfam train` itself on a few.
"""

import json
import os
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pipeline_runs import run_tfam, tiny_args

from pipelines.callbacks import PerplexityEvaluator, SafeBackupAndRestore
from pipelines.step_schedule import StepSchedule
from pipelines.training_log import ThroughputMonitor


def _due(step, every, max_steps):
    return step % every == 0 or step == max_steps


@st.composite
def flags(draw, most_steps=40):
    max_steps = draw(st.integers(1, most_steps))
    return {
        "max_steps": max_steps,
        "backup_every": draw(st.integers(1, most_steps + 5)),
        "eval_every": draw(st.integers(1, most_steps + 5)),
        "log_every": draw(st.integers(1, most_steps + 5)),
        "accumulation": draw(st.integers(1, 4)),
        "start": draw(st.integers(0, max_steps)),
    }


@settings(max_examples=300, deadline=None)
@given(flags())
@example({"max_steps": 21, "backup_every": 10, "eval_every": 7, "log_every": 10, "accumulation": 1, "start": 0})
@example({"max_steps": 25, "backup_every": 10, "eval_every": 25, "log_every": 10, "accumulation": 1, "start": 20})
@example({"max_steps": 8, "backup_every": 4, "eval_every": 50, "log_every": 4, "accumulation": 4, "start": 0})
def test_the_schedule_puts_every_event_where_the_flags_say(values):
    schedule = StepSchedule(**values)
    max_steps, start, accumulation = values["max_steps"], values["start"], values["accumulation"]
    # The epochs `fit` runs cover exactly the steps after `start`, in batches of `accumulation` per step.
    assert schedule.initial_epoch * schedule.epoch_steps == start
    assert schedule.epochs * schedule.epoch_steps == max_steps
    assert schedule.batches_per_epoch == schedule.epoch_steps * accumulation
    assert schedule.skipped_batches == start * accumulation
    assert [schedule.step(e) for e in range(schedule.initial_epoch, schedule.epochs)] == list(
        range(start + schedule.epoch_steps, max_steps + 1, schedule.epoch_steps)
    )
    # Every step an event is due at, and no other, is an epoch's end with that event.
    expected = {}
    for step in range(start + 1, max_steps + 1):
        kinds = tuple(
            kind
            for kind, every in (("backup", "backup_every"), ("eval", "eval_every"), ("log", "log_every"))
            if _due(step, values[every], max_steps)
        )
        if kinds:
            expected[step] = kinds
    assert schedule.events() == expected


def test_the_schedule_refuses_values_outside_its_range():
    with pytest.raises(ValueError, match=r"Received: backup_every=0$"):
        StepSchedule(10, 0, 5)
    with pytest.raises(ValueError, match=r"Received: start=11$"):
        StepSchedule(10, 5, 5, start=11)
    assert StepSchedule(10, 5, 3).log_every == 5  # unset: the backup interval


rng = np.random.default_rng(0)
X, Y = rng.normal(size=(10, 3)).astype("float32"), rng.normal(size=(10, 1)).astype("float32")


class Killed(Exception):
    """What a SIGKILL leaves on disk, raised instead: the fit stops where it is, no callback ends."""


class KillAfter(keras.callbacks.Callback):
    def __init__(self, batches):
        super().__init__()
        self.batches = batches

    def on_train_batch_end(self, batch, logs=None):
        self.batches -= 1
        if self.batches == 0:
            raise Killed()


class RecordedBackups(SafeBackupAndRestore):
    saved = ()

    def _save(self, epoch):
        self.saved = [*self.saved, int(self.model.optimizer.iterations.numpy())]
        super()._save(epoch)


class RecordedEvaluations(PerplexityEvaluator):
    """The evaluator's schedule, with a stand-in measurement (the model here is not a language model)."""

    evaluated = ()

    def evaluate(self):
        return {"loss": float(np.mean((np.asarray(self.model(X)) - Y) ** 2))}

    def record(self, result, step, logs=None):
        self.evaluated = [*self.evaluated, step]
        super().record(result, step, logs)


def _fit(backup_dir, values, kill_after=None):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    accumulation = values["accumulation"]
    optimizer = keras.optimizers.Adam(0.05, gradient_accumulation_steps=accumulation if accumulation > 1 else None)
    model.compile(optimizer, "mse", run_eagerly=True)  # a few steps: no graph to trace for each model
    backup = RecordedBackups(backup_dir, keep=100, delete_checkpoint=False, by_step=True)
    start = backup.restorable_step()
    schedule = StepSchedule(
        values["max_steps"], values["backup_every"], values["eval_every"], values["log_every"], accumulation, start
    )
    backup.schedule = schedule
    evaluator = RecordedEvaluations(None, {}, tf.distribute.get_strategy(), schedule)
    log = ThroughputMonitor(2 * 3, schedule=schedule)
    steps_logged = []
    logged = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: steps_logged.append(schedule.step(epoch)) if "learning_rate" in logs else None
    )
    callbacks = [log, logged, evaluator, backup] + ([KillAfter(kill_after)] if kill_after else [])
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(2).repeat().skip(schedule.skipped_batches)
    try:
        model.fit(
            data,
            epochs=schedule.epochs,
            initial_epoch=schedule.initial_epoch,
            steps_per_epoch=schedule.batches_per_epoch,
            verbose=0,
            shuffle=False,
            callbacks=callbacks,
        )
    except Killed:
        pass
    return model, list(backup.saved), list(evaluator.evaluated), steps_logged


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flags(most_steps=9), st.integers(0, 40))
@example({"max_steps": 7, "backup_every": 3, "eval_every": 2, "log_every": 4, "accumulation": 2, "start": 0}, 8)
def test_callbacks_act_where_the_flags_say_and_a_killed_fit_resumes_exactly(tmp_path_factory, values, kill):
    folder = tmp_path_factory.mktemp("fit")
    max_steps, accumulation = values["max_steps"], values["accumulation"]
    straight, backups, evaluations, logged = _fit(str(folder / "straight"), values)
    assert int(straight.optimizer.iterations.numpy()) == max_steps
    for name, every, steps in (
        ("backup", "backup_every", backups),
        ("eval", "eval_every", evaluations),
        ("log", "log_every", logged),
    ):
        assert steps == [s for s in range(1, max_steps + 1) if _due(s, values[every], max_steps)], name

    # Killed after any batch, mid-accumulation included, before the epoch end's callbacks of that batch.
    kill_after = 1 + kill % (max_steps * accumulation)
    _, done, _, _ = _fit(str(folder / "killed"), values, kill_after=kill_after)
    assert done == [s for s in backups if s * accumulation < kill_after]
    resumed, resumed_backups, _, _ = _fit(str(folder / "killed"), values)
    assert int(resumed.optimizer.iterations.numpy()) == max_steps
    assert resumed_backups == [s for s in backups if s > (done[-1] if done else 0)]
    for a, b in zip(resumed.get_weights(), straight.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _summary(run):
    with open(os.path.join(run, "summary.json")) as f:
        return json.load(f)


def _steps(folder, tag):
    steps = []
    for name in sorted(os.listdir(folder)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(folder, name)):
            steps += [event.step for value in event.summary.value if value.tag == tag]
    return steps


def _final_weights(run):
    from pipelines.checkpoints import load_checkpoint

    return load_checkpoint(os.path.join(run, "checkpoints", "final.keras")).get_weights()


# Coprime intervals and accumulation: the arithmetic the issue found wrong (backups after every step,
# validations at the backup interval, "2 steps" of 8).
ODD = {"max-steps": 7, "backup-every": 3, "eval-every": 2, "gradient-accumulation-steps": 2, "jit": "off"}


def test_tfam_train_counts_every_flag_in_optimizer_steps_and_resumes_a_kill_exactly(tmp_path, small_wikitext):
    straight = str(tmp_path / "straight")
    run_tfam(tiny_args(small_wikitext, straight, **ODD, export="off", precision="float32"))
    summary = _summary(straight)
    assert summary["steps"] == 7 and summary["max_steps"] == 7
    logs = os.path.join(straight, "logs")
    assert _steps(os.path.join(logs, "validation"), "loss") == [2, 4, 6, 7]
    assert _steps(os.path.join(logs, "train"), "epoch_loss") == [3, 6, 7]  # the log interval: --backup-every
    with open(os.path.join(straight, "backup", "training_metadata.json")) as f:
        assert [b["step"] for b in json.load(f)["backups"]] == [7, 6]  # the last two of 3, 6, 7

    # SIGKILL after step 5 (batch 10 of 14), in a fresh process; the rerun resumes at the backup of step 3.
    killed = str(tmp_path / "killed")
    args = tiny_args(small_wikitext, killed, **ODD, export="off", precision="float32")
    result = run_tfam(args, env={"TFAM_FAULT": "step:5"}, check=False)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    run_tfam(args)
    assert _summary(killed)["steps"] == 7 and _summary(killed)["resumed_from_step"] == 3
    for a, b in zip(_final_weights(killed), _final_weights(straight)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
