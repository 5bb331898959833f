"""What a run reports as it trains: training series (TensorBoard `train`), a progress line, the profiler, kill points.

Every series is written against the optimizer step, at the steps a
`pipelines.step_schedule.StepSchedule` logs at (every epoch without one).
"""

import math
import time

import keras
import numpy as np
import tensorflow as tf

from pipelines.faults import fault_point


class ThroughputMonitor(keras.callbacks.Callback):
    """The loss, tokens/s and learning rate of each log interval: into the logs, TensorBoard (`train`), a line.

    At each step `schedule` logs at: `epoch_loss` (the mean training loss
    of the interval's steps: Keras' name for it), `learning_rate` and
    `tokens_per_second`. The rate counts the interval's batches from each
    epoch's start to its batches' ends: not the evaluations and backups
    between epochs, nor the first batch of a `fit` (its compilation).

    Args:
        tokens_per_batch: tokens of one batch (the global batch times its length).
        log_dir: TensorBoard folder (None: no TensorBoard).
        schedule: a `StepSchedule`, or None (an interval is an epoch).
        progress: print a line (`step 40/600: ...`) at each log step.
    """

    def __init__(self, tokens_per_batch, log_dir=None, schedule=None, progress=False):
        super().__init__()
        self.tokens_per_batch = tokens_per_batch
        self.writer = tf.summary.create_file_writer(f"{log_dir}/train") if log_dir else None
        self.schedule = schedule
        self.progress = progress
        self.rates = []

    def on_train_begin(self, logs=None):
        self._compiled = False
        self._reset()

    def _reset(self):
        self._losses, self._batches, self._seconds = [], 0, 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._mark = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if self._compiled:
            self._batches += 1
            self._seconds += now - self._mark
        self._compiled = True
        self._mark = now

    def on_epoch_end(self, epoch, logs=None):
        if logs and "loss" in logs:
            self._losses.append(float(logs["loss"]))
        if self.schedule is not None and not self.schedule.logs(self.schedule.step(epoch)):
            return
        step = int(self.model.optimizer.iterations.numpy())
        rate = self.tokens_per_batch * self._batches / self._seconds if self._batches else None
        loss = float(np.mean(self._losses)) if self._losses else None
        learning_rate = float(np.asarray(self.model.optimizer.learning_rate))
        self._reset()
        if rate is not None:
            self.rates.append(rate)
        if logs is not None:
            logs["learning_rate"] = learning_rate
            if rate is not None:
                logs["tokens_per_second"] = rate
        if self.writer is not None:
            with self.writer.as_default(step=step):
                tf.summary.scalar("learning_rate", learning_rate)
                if rate is not None:
                    tf.summary.scalar("tokens_per_second", rate)
                if loss is not None:
                    tf.summary.scalar("epoch_loss", loss)
            self.writer.flush()
        if self.progress:
            total = f"/{self.schedule.max_steps}" if self.schedule is not None else ""
            parts = [f"step {step}{total}"]
            if loss is not None:
                parts.append(f"loss {loss:.4f}" if math.isfinite(loss) else f"loss {loss}")
            if rate is not None:
                parts.append(f"{rate:,.0f} tokens/s")
            print("  ".join(parts), flush=True)


class StepProfiler(keras.callbacks.Callback):
    """Profiles optimizer steps `first` to `last` (1-based, counted over the whole run) into `log_dir`.

    The trace is TensorFlow's profiler (`tf.profiler.experimental`), read by
    TensorBoard's Profile tab. Steps outside this `fit` (before its start)
    are not profiled.

    Args:
        log_dir: the folder of the trace (TensorBoard's `train` writer's).
        first: the first step profiled.
        last: the last step profiled.
        schedule: the run's `StepSchedule` (its start and batches per step).
    """

    def __init__(self, log_dir, first, last, schedule):
        super().__init__()
        if not 1 <= first <= last:
            raise ValueError(f"`first` and `last` must be steps with 1 <= first <= last. Received: {first=}, {last=}")
        self.log_dir = log_dir
        self.first = first
        self.last = last
        self.schedule = schedule
        self._batches = 0
        self.profiling = False  # whether a trace is being recorded

    def on_train_batch_begin(self, batch, logs=None):
        steps, partial = divmod(self._batches, self.schedule.accumulation)
        if not self.profiling and not partial and self.schedule.start + steps + 1 == self.first:
            tf.profiler.experimental.start(self.log_dir)
            self.profiling = True

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        steps, partial = divmod(self._batches, self.schedule.accumulation)
        if self.profiling and not partial and self.schedule.start + steps >= self.last:
            self._stop()

    def on_train_end(self, logs=None):
        self._stop()

    def _stop(self):
        if self.profiling:
            tf.profiler.experimental.stop()
            self.profiling = False


class FaultPoints(keras.callbacks.Callback):
    """The training kill points of `pipelines.faults`: `train-begin`, and `step` after each optimizer step.

    Put it last, so that `train-begin` comes after the backup is restored.

    Args:
        accumulation: batches per optimizer step (gradient accumulation).
    """

    def __init__(self, accumulation=1):
        super().__init__()
        self.accumulation = accumulation
        self._batches = 0

    def on_train_begin(self, logs=None):
        fault_point("train-begin")

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        if self._batches % self.accumulation == 0:
            fault_point("step")


class ModelScalars(keras.callbacks.Callback):
    """What a model reports of itself (`model.summary_scalars()`: name -> float) into TensorBoard (`train`).

    Transformer-XL reports its memory (length, slots filled) and learned
    attention spans per layer and head. Written at the steps `schedule` logs
    at (every epoch without one).
    """

    def __init__(self, log_dir, schedule=None):
        super().__init__()
        self.writer = tf.summary.create_file_writer(f"{log_dir}/train")
        self.schedule = schedule

    def on_epoch_end(self, epoch, logs=None):
        if self.schedule is not None and not self.schedule.logs(self.schedule.step(epoch)):
            return
        scalars = self.model.summary_scalars()
        with self.writer.as_default(step=int(self.model.optimizer.iterations.numpy())):
            for name, value in scalars.items():
                tf.summary.scalar(name, value)
        self.writer.flush()
