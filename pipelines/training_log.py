"""What a run reports as it trains: training series (TensorBoard `train`), a progress line, the profiler, kill points.

Every series is written against the optimizer step: the training loss,
learning rate and tokens/s every `--log-every` steps, whatever the length of
`fit`'s epochs; the others at the steps a
`pipelines.step_schedule.StepSchedule` logs at (every epoch without one).
"""

import math
import time

import keras
import numpy as np
import tensorflow as tf

from pipelines.faults import fault_point


class _Interval:
    """The batches since a series' last point: their summed loss, and the seconds of the timed ones."""

    def __init__(self):
        self.loss_sum, self.losses, self.timed, self.seconds = 0.0, 0, 0, 0.0

    def loss(self):
        return self.loss_sum / self.losses if self.losses else None

    def rate(self, tokens_per_batch):
        return tokens_per_batch * self.timed / self.seconds if self.timed else None


class ThroughputMonitor(keras.callbacks.Callback):
    """The training series: loss, learning rate and tokens/s every `log_every` optimizer steps, and a line.

    Into TensorBoard (`train`), against the optimizer step, every
    `log_every` steps and at the last one, whatever the length of `fit`'s
    epochs:
    - `loss`: the mean training loss of the interval's batches (the
      validation's `loss` is drawn in the same chart);
    - `learning_rate`: the learning rate at that step;
    - `tokens_per_second`: the interval's tokens over the time of its
      batches: not the evaluations and backups between epochs, nor the
      first batch of a `fit` (its compilation).
    At the steps `schedule` logs at (every epoch without one): `epoch_loss`,
    the mean training loss since the previous of them (Keras' name, as the
    validation's `epoch_loss`), and `learning_rate` and `tokens_per_second`
    into the epoch's logs.

    The loss of a batch comes from Keras' batch logs, which hold the mean
    loss of the epoch's batches so far.

    Args:
        tokens_per_batch: tokens of one batch (the global batch times its length).
        log_dir: TensorBoard folder (None: no TensorBoard).
        schedule: a `StepSchedule`, or None (every epoch).
        log_every: optimizer steps between two points of the series; default: the
            schedule's `log_every`, and without a schedule, every epoch's end.
        progress: print a line (`step 40/600  loss 5.1234  9,000 tokens/s`) at each point.
    """

    def __init__(self, tokens_per_batch, log_dir=None, schedule=None, log_every=None, progress=False):
        super().__init__()
        if log_every is not None and (not isinstance(log_every, int) or log_every < 1):
            raise ValueError(f"`log_every` must be a positive integer or None. Received: log_every={log_every!r}")
        self.tokens_per_batch = tokens_per_batch
        self.writer = tf.summary.create_file_writer(f"{log_dir}/train") if log_dir else None
        self.schedule = schedule
        self.log_every = log_every if log_every is not None or schedule is None else schedule.log_every
        self.progress = progress
        self.rates = []  # tokens/s of each point

    def on_train_begin(self, logs=None):
        self._compiled, self._step = False, None
        self._steps, self._epochs = _Interval(), _Interval()

    def on_epoch_begin(self, epoch, logs=None):
        if self._step is None:  # after every `on_train_begin`: a restored backup's step
            self._step = int(self.model.optimizer.iterations.numpy())
        self._mark = time.perf_counter()
        self._epoch_sum = 0.0  # the loss summed over the epoch's batches so far

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if "loss" in (logs or {}):
            epoch_sum = float(np.mean(logs["loss"])) * (batch + 1)
            for interval in (self._steps, self._epochs):
                interval.loss_sum += epoch_sum - self._epoch_sum
                interval.losses += 1
            self._epoch_sum = epoch_sum
        if self._compiled:
            for interval in (self._steps, self._epochs):
                interval.timed += 1
                interval.seconds += now - self._mark
        self._compiled = True
        if self.log_every is not None:
            # The optimizer's step: it moves once per `accumulation` batches.
            step = int(self.model.optimizer.iterations.numpy())
            if step != self._step and step % self.log_every == 0:
                self._write_point(step)
            self._step = step
        self._mark = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if self.schedule is not None and not self.schedule.logs(self.schedule.step(epoch)):
            return
        if self.log_every is None:
            self._write_point(int(self.model.optimizer.iterations.numpy()))
        interval, self._epochs = self._epochs, _Interval()
        loss, rate = interval.loss(), interval.rate(self.tokens_per_batch)
        if logs is not None:
            logs["learning_rate"] = self._learning_rate()
            if rate is not None:
                logs["tokens_per_second"] = rate
        if self.writer is not None and loss is not None:
            with self.writer.as_default(step=int(self.model.optimizer.iterations.numpy())):
                tf.summary.scalar("epoch_loss", loss)
            self.writer.flush()

    def on_train_end(self, logs=None):
        if self._steps.losses:  # the steps after the last point: the run's end (or a stop)
            self._write_point(int(self.model.optimizer.iterations.numpy()))

    def _learning_rate(self):
        return float(np.asarray(self.model.optimizer.learning_rate))

    def _write_point(self, step):
        interval, self._steps = self._steps, _Interval()
        loss, rate = interval.loss(), interval.rate(self.tokens_per_batch)
        if rate is not None:
            self.rates.append(rate)
        if self.writer is not None:
            with self.writer.as_default(step=step):
                tf.summary.scalar("learning_rate", self._learning_rate())
                if rate is not None:
                    tf.summary.scalar("tokens_per_second", rate)
                if loss is not None:
                    tf.summary.scalar("loss", loss)
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
