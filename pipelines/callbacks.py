"""Training callbacks: kill-safe backups and checkpoints, validation perplexity, TensorBoard, speed."""

import math
import os
import re
import shutil
import time

import keras
import numpy as np
import tensorflow as tf

from pipelines.checkpoints import save_checkpoint, verify_checkpoint
from pipelines.errors import CorruptFileError, notice
from pipelines.evaluation import METRICS, evaluate_perplexity, nll_function
from pipelines.faults import fault_point
from pipelines.files import (
    TEMP_PREFIX,
    atomic_path,
    atomic_write_json,
    digest_problem,
    file_digest,
    read_json,
    set_aside,
    sidecar_path,
)


def _finite(logs):
    return all(math.isfinite(float(v)) for k, v in (logs or {}).items() if "loss" in k)


class SafeBackupAndRestore(keras.callbacks.Callback):
    """Backs up the weights at each epoch's end and restores them at `fit`'s start, safely.

    What `keras.callbacks.BackupAndRestore` does, except that it survives
    being killed mid-save, checks what it restores and never backs up a NaN.
    Each backup, `epoch-N.weights.h5`, is written under a temporary name and
    renamed into place; then `training_metadata.json` (replaced atomically)
    lists the newest backups, newest first, with their sizes and SHA-256. A
    SIGKILL at any moment leaves the previous complete backup. The last
    `keep` backups are kept, so that a backup damaged later (a truncated
    file) falls back to the one before it, with a notice naming the damaged
    file; if the metadata itself is damaged, the backups are found by their
    file names. When no backup is usable the run stops (`CorruptFileError`)
    rather than silently starting over.

    A non-finite loss (or a stop requested by `TerminateOnNaN`) skips the
    backup, so broken weights never replace the last good ones.

    The epoch to resume at is `restorable()["epoch"]`, which the caller passes
    to `fit` as `initial_epoch` (it also tells a stream where to resume); a
    `fit` that starts elsewhere while a backup is restored is refused.

    Args:
        backup_dir: the folder of the backups.
        keep: how many backups to keep (at least 1).
        save_freq: `"epoch"`, the only frequency: a backup at every epoch's end.
        delete_checkpoint: whether to delete `backup_dir` when `fit` ends.

    Example:

    >>> backup = SafeBackupAndRestore("/tmp/run/backup", delete_checkpoint=False)
    >>> restored = backup.restorable()
    >>> model.fit(data, epochs=10, initial_epoch=restored["epoch"] if restored else 0, callbacks=[backup])
    """

    def __init__(self, backup_dir, keep=2, save_freq="epoch", delete_checkpoint=True):
        super().__init__()
        if not backup_dir:
            raise ValueError(f"`backup_dir` must name a folder. Received: backup_dir={backup_dir!r}")
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"`keep` must be a positive integer. Received: keep={keep!r}")
        if save_freq != "epoch":
            raise ValueError(f"`save_freq` must be 'epoch' (backups are made at epoch ends). Received: {save_freq=}")
        self.backup_dir = backup_dir
        self.keep = keep
        self.save_freq = save_freq
        self.delete_checkpoint = delete_checkpoint
        self.metadata_path = os.path.join(backup_dir, "training_metadata.json")
        self._backups = None
        self._start_checked = False

    def restorable(self):
        """The newest intact backup (`{"epoch", "weights", ...}`) or None; selected once, with notices."""
        if self._backups is None:
            self._backups = self._select()
        return self._backups[0] if self._backups else None

    def _weights_files(self):
        found = []
        for name in os.listdir(self.backup_dir) if os.path.isdir(self.backup_dir) else []:
            match = re.fullmatch(r"epoch-(\d+)\.weights\.h5", name)
            if match:
                found.append({"epoch": int(match.group(1)), "weights": name})
        return sorted(found, key=lambda backup: -backup["epoch"])

    def _candidates(self):
        try:
            metadata = read_json(self.metadata_path)
            if not isinstance(metadata, dict) or not {"epoch", "weights"} <= set(metadata):
                raise CorruptFileError(self.metadata_path, "does not name a backup (no epoch or weights)")
        except CorruptFileError as error:
            found = self._weights_files()
            notice(f"{error}: looking for the backups by their file names instead ({len(found)} found)")
            return found
        # Older runs recorded one backup, without a digest.
        return metadata.get("backups") or [metadata]

    def _problem(self, backup):
        path = os.path.join(self.backup_dir, backup["weights"])
        if "sha256" in backup:
            return digest_problem(path, backup)
        if not os.path.isfile(path):
            return "is missing"
        import h5py

        try:
            with h5py.File(path, "r"):
                pass
        except OSError as error:
            return f"cannot be opened ({error})"
        return None

    def _select(self):
        if not os.path.isfile(self.metadata_path):
            # Nothing backed up yet (a first backup killed before its metadata
            # was written leaves a weights file that the next backup replaces).
            return []
        damaged = []
        candidates = self._candidates()
        for index, backup in enumerate(candidates):
            problem = self._problem(backup)
            if problem is None:
                for path, what in damaged:
                    notice(
                        f"{path} {what}: resuming from the previous backup {backup['weights']} "
                        f"(epoch {backup['epoch']}) instead"
                    )
                return candidates[index:]
            damaged.append((os.path.join(self.backup_dir, backup["weights"]), problem))
        details = "; ".join(f"{path} {what}" for path, what in damaged) or "no backup file found"
        raise CorruptFileError(
            self.backup_dir,
            f"holds no usable backup ({details})",
            action=f"to start this run over from step 0, move {self.backup_dir} away and rerun the command",
        )

    def on_train_begin(self, logs=None):
        self._start_checked = False
        backup = self.restorable()
        if backup is None:
            return
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        path = os.path.join(self.backup_dir, backup["weights"])
        try:
            self.model.load_weights(path)
        except Exception as error:  # noqa: BLE001 - whatever h5py or Keras raises, say which file
            raise CorruptFileError(
                path,
                f"cannot be loaded into this model ({type(error).__name__}: {error})",
                action=f"to start this run over from step 0, move {self.backup_dir} away and rerun the command",
            ) from error

    def on_epoch_begin(self, epoch, logs=None):
        if not self._start_checked:
            self._start_checked = True
            backup = self.restorable()
            if backup is not None and epoch != backup["epoch"]:
                raise ValueError(
                    f"`fit` must resume at the restored backup's epoch: pass `initial_epoch={backup['epoch']}` "
                    f"(from {os.path.join(self.backup_dir, backup['weights'])}). Received: initial_epoch={epoch}"
                )

    def on_epoch_end(self, epoch, logs=None):
        if _finite(logs) and not self.model.stop_training:
            self._save(epoch + 1)

    def on_train_end(self, logs=None):
        if self.delete_checkpoint and os.path.isdir(self.backup_dir):
            shutil.rmtree(self.backup_dir)

    def _save(self, epoch):
        name = f"epoch-{epoch}.weights.h5"
        path = os.path.join(self.backup_dir, name)
        with atomic_path(path, fault="backup-write") as temp:
            self.model.save_weights(temp)
        record = {
            "epoch": epoch,
            "step": int(self.model.optimizer.iterations.numpy()),
            "weights": name,
            **file_digest(path),
        }
        older = [backup for backup in self._backups or [] if backup["weights"] != name]
        kept = [record] + older[: self.keep - 1]
        atomic_write_json(self.metadata_path, {**record, "backups": kept})
        self._backups = kept
        names = {backup["weights"] for backup in kept}
        for old in os.listdir(self.backup_dir):
            if old.endswith(".weights.h5") and old not in names and not old.startswith(TEMP_PREFIX):
                os.remove(os.path.join(self.backup_dir, old))


class PerplexityEvaluator(keras.callbacks.Callback):
    """Every `every` epochs: validation loss and perplexities into the logs.

    Runs before the checkpoint callback so that `val_loss` can select the best
    model. Also logs the values to TensorBoard (`validation` writer) and
    generates a few text samples.

    Args:
        dataset: the validation stream (`(inputs, targets, weights)` batches).
        units: the text units of the split, as `evaluate_perplexity` takes
            them: `{"num_words": n}` (word perplexity) or
            `{"num_characters": n}` (bits per character, for character-level
            runs, where words are meaningless).
        strategy: the distribution strategy.
        every: evaluate every `every` epochs.
        log_dir: TensorBoard folder (None: no TensorBoard).
        sampler: a function returning a few text samples to log.
    """

    def __init__(self, dataset, units, strategy, every=1, log_dir=None, sampler=None):
        super().__init__()
        self.dataset = dataset
        self.units = dict(units)
        self.strategy = strategy
        self.every = every
        self.sampler = sampler
        self.writer = tf.summary.create_file_writer(f"{log_dir}/validation") if log_dir else None
        self.last = None
        self.last_step = None
        self._step = None

    def evaluate(self):
        if self._step is None:
            self._step = nll_function(self.model, self.strategy)
        return evaluate_perplexity(self.model, self.dataset, strategy=self.strategy, step=self._step, **self.units)

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or (epoch + 1) % self.every:
            return
        if not _finite(logs):
            return
        result = self.evaluate()
        self.last = result
        self.last_step = int(self.model.optimizer.iterations.numpy())
        metrics = {name: result[name] for name in ("loss", *METRICS) if name in result}
        logs.update({f"val_{name}": value for name, value in metrics.items()})
        if self.writer is not None:
            with self.writer.as_default(step=self.last_step):
                for name, value in metrics.items():
                    tf.summary.scalar(name, value)
                if self.sampler is not None:
                    for i, text in enumerate(self.sampler()):
                        tf.summary.text(f"sample_{i}", text)
            self.writer.flush()


class BestCheckpoint(keras.callbacks.Callback):
    """Saves the model as `.keras` whenever `val_loss` improves, atomically and verifiably.

    The best value survives restarts (the sidecar `best.json`, which also
    holds the checkpoint's size and SHA-256), so a resumed run cannot
    overwrite a better checkpoint with a worse one, and a NaN is never an
    improvement. A checkpoint found damaged when the run starts is set aside
    (`best.keras.corrupt`) with a notice, and the next validation result,
    whatever it is, writes a new one.

    Args:
        path: the checkpoint, ending in `.keras`.
    """

    def __init__(self, path):
        super().__init__()
        self.path = path
        self.meta = sidecar_path(path)
        self.best = self._recorded_best()

    def _recorded_best(self):
        if not os.path.isfile(self.path):
            # No best model yet: none was saved, or the first save was killed
            # before its rename (its sidecar then records no previous file).
            try:
                lost = os.path.isfile(self.meta) and read_json(self.meta).get("previous") is not None
            except (CorruptFileError, AttributeError):
                lost = True
            if lost:
                notice(f"{self.path} is missing: the next validation result writes a new one")
            return math.inf
        try:
            return float(verify_checkpoint(self.path).get("val_loss", math.inf))
        except CorruptFileError as error:
            moved = set_aside(self.path)
            notice(
                f"{error}: moved it to {os.path.basename(moved)}; the next validation result writes a new best "
                "checkpoint (until then the final model stands in for it)"
            )
            return math.inf

    def consider(self, value, step):
        """Saves the model if `value` (a validation loss at `step`) is the best so far."""
        if value is None or not math.isfinite(value) or value >= self.best:
            return False
        self.best = float(value)
        save_checkpoint(self.model, self.path, {"val_loss": self.best, "step": int(step)}, fault="best-write")
        return True

    def on_epoch_end(self, epoch, logs=None):
        self.consider((logs or {}).get("val_loss"), int(self.model.optimizer.iterations.numpy()))


class ThroughputMonitor(keras.callbacks.Callback):
    """Tokens/s per epoch and the learning rate, into the logs and TensorBoard (`train`)."""

    def __init__(self, tokens_per_step, log_dir=None):
        super().__init__()
        self.tokens_per_step = tokens_per_step
        self.writer = tf.summary.create_file_writer(f"{log_dir}/train") if log_dir else None
        self.rates = []

    def on_epoch_begin(self, epoch, logs=None):
        self.batch_ends = []

    def on_train_batch_end(self, batch, logs=None):
        self.batch_ends.append(time.perf_counter())

    def on_epoch_end(self, epoch, logs=None):
        # From the end of the first step to the end of the last: no compilation,
        # no evaluation, no checkpointing.
        if len(self.batch_ends) < 2:
            return
        steps = len(self.batch_ends) - 1
        rate = self.tokens_per_step * steps / (self.batch_ends[-1] - self.batch_ends[0])
        self.rates.append(rate)
        iterations = int(self.model.optimizer.iterations.numpy())
        learning_rate = float(np.asarray(self.model.optimizer.learning_rate))
        if logs is not None:
            logs["tokens_per_second"] = rate
            logs["learning_rate"] = learning_rate
        if self.writer is not None:
            with self.writer.as_default(step=iterations):
                tf.summary.scalar("tokens_per_second", rate)
                tf.summary.scalar("learning_rate", learning_rate)
                if logs and "loss" in logs:
                    tf.summary.scalar("step_loss", float(logs["loss"]))
            self.writer.flush()


class GlobalStepTensorBoard(keras.callbacks.TensorBoard):
    """Keras' TensorBoard callback with the `epoch_*` series plotted against the global step.

    Keras writes epoch summaries at the epoch index that `on_epoch_end`
    receives; the other series of a run (validation, learning rate, tokens/s)
    are at the optimizer step, and an epoch here is `backup_every` steps, so
    this passes the step on as the epoch. Histograms and embeddings, which
    Keras schedules by epoch, are refused.

    Args:
        log_dir: the folder of the logs.
        **kwargs: `keras.callbacks.TensorBoard` arguments, without
            `histogram_freq` or `embeddings_freq`.
    """

    def __init__(self, log_dir="logs", **kwargs):
        for name in ("histogram_freq", "embeddings_freq"):
            if kwargs.get(name):
                raise ValueError(
                    f"`{name}` counts epochs, which this callback replaces by steps. Received: {name}={kwargs[name]!r}"
                )
        super().__init__(log_dir, **kwargs)

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(int(self.model.optimizer.iterations.numpy()), logs)


class FaultPoints(keras.callbacks.Callback):
    """The training kill points of `pipelines.faults`: `train-begin` and `step` (after each step).

    Put it last, so that `train-begin` comes after the backup is restored.
    """

    def on_train_begin(self, logs=None):
        fault_point("train-begin")

    def on_train_batch_end(self, batch, logs=None):
        fault_point("step")


class ModelScalars(keras.callbacks.Callback):
    """What a model reports of itself (`model.summary_scalars()`: name -> float) into TensorBoard (`train`).

    Transformer-XL reports its memory (length, slots filled) and learned
    attention spans per layer and head.
    """

    def __init__(self, log_dir):
        super().__init__()
        self.writer = tf.summary.create_file_writer(f"{log_dir}/train")

    def on_epoch_end(self, epoch, logs=None):
        scalars = self.model.summary_scalars()
        with self.writer.as_default(step=int(self.model.optimizer.iterations.numpy())):
            for name, value in scalars.items():
                tf.summary.scalar(name, value)
        self.writer.flush()
