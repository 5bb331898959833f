"""Training callbacks: kill-safe backups and checkpoints, validation perplexity (training series: training_log)."""

import math
import os
import re
import shutil

import keras
import tensorflow as tf

from pipelines.checkpoints import save_checkpoint, verify_checkpoint
from pipelines.errors import CorruptFileError, notice
from pipelines.evaluation import METRICS, evaluate_perplexity, nll_function
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

# The training series' callbacks, importable from here too.
from pipelines.training_log import FaultPoints, ModelScalars, StepProfiler, ThroughputMonitor  # noqa: F401


def _finite(logs):
    return all(math.isfinite(float(v)) for k, v in (logs or {}).items() if "loss" in k)


class SafeBackupAndRestore(keras.callbacks.Callback):
    """Backs up the weights at epoch ends and restores them at `fit`'s start, safely.

    What `keras.callbacks.BackupAndRestore` does, except that it survives
    being killed mid-save, checks what it restores and never backs up a NaN.
    Each backup is written under a temporary name and renamed into place;
    then `training_metadata.json` (replaced atomically) lists the newest
    backups, newest first, with their step, sizes and SHA-256. A SIGKILL at
    any moment leaves the previous complete backup. The last `keep` backups
    are kept, so that a backup damaged later (a truncated file) falls back
    to the one before it, with a notice naming the damaged file; if the
    metadata itself is damaged, the backups are found by their file names.
    When no backup is usable the run stops (`CorruptFileError`) rather than
    silently starting over.

    A non-finite loss (or a stop requested by `TerminateOnNaN`) skips the
    backup, so broken weights never replace the last good ones.

    By step (with a `schedule`, `pipelines.step_schedule.StepSchedule`),
    backups are made at the steps it says (`step-N.weights.h5`, N optimizer
    steps), a run resumes at `restorable_step()` (the schedule's `start`)
    and a `fit` that does not start there is refused. Without one, a backup
    is made at every epoch's end (`epoch-N.weights.h5`) and the epoch to
    resume at is `restorable()["epoch"]`, which the caller passes to `fit`
    as `initial_epoch` (it also tells a stream where to resume).

    Args:
        backup_dir: the folder of the backups.
        keep: how many backups to keep (at least 1).
        save_freq: `"epoch"`, the only frequency: backups at epoch ends.
        delete_checkpoint: whether to delete `backup_dir` when `fit` ends.
        schedule: a `StepSchedule`, or None (a backup at every epoch's end).
        by_step: name and resume the backups by step (default: with a
            `schedule`); True with the schedule set later, once the step to
            resume at (`restorable_step()`) has made it.

    Example:

    >>> backup = SafeBackupAndRestore("/tmp/run/backup", delete_checkpoint=False)
    >>> restored = backup.restorable()
    >>> model.fit(data, epochs=10, initial_epoch=restored["epoch"] if restored else 0, callbacks=[backup])
    """

    def __init__(self, backup_dir, keep=2, save_freq="epoch", delete_checkpoint=True, schedule=None, by_step=None):
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
        self.schedule = schedule
        self.by_step = schedule is not None if by_step is None else bool(by_step)
        self.metadata_path = os.path.join(backup_dir, "training_metadata.json")
        self._backups = None
        self._start_checked = False

    @property
    def _key(self):
        """What a backup is named and resumed by: its optimizer step with a schedule, else its epoch."""
        return "step" if self.by_step else "epoch"

    def restorable(self):
        """The newest intact backup (`{"step", "weights", ...}`, and `"epoch"` by epoch) or None; selected once."""
        if self._backups is None:
            self._backups = self._select()
        return self._backups[0] if self._backups else None

    def restorable_step(self):
        """The optimizer step of the newest intact backup (0 without one): where a run resumes."""
        backup = self.restorable()
        return int(backup["step"]) if backup is not None else 0

    def _weights_files(self):
        found = []
        for name in os.listdir(self.backup_dir) if os.path.isdir(self.backup_dir) else []:
            match = re.fullmatch(r"(epoch|step)-(\d+)\.weights\.h5", name)
            if match:
                found.append({match.group(1): int(match.group(2)), "weights": name})
        return sorted(found, key=lambda backup: -backup.get(self._key, -1))

    def _candidates(self):
        try:
            metadata = read_json(self.metadata_path)
            if not isinstance(metadata, dict) or "weights" not in metadata:
                raise CorruptFileError(self.metadata_path, "does not name a backup (no weights)")
        except CorruptFileError as error:
            found = self._weights_files()
            notice(f"{error}: looking for the backups by their file names instead ({len(found)} found)")
            return found
        # Older runs recorded one backup, without a digest.
        return metadata.get("backups") or [metadata]

    def _problem(self, backup):
        if self._key not in backup:
            return f"records no {self._key} (written by another version of tfam)"
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
                        f"({self._key} {backup[self._key]}) instead"
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
        if self.by_step and self.schedule is None:
            raise ValueError("A backup by step needs the run's `schedule` before `fit`. Received: schedule=None")
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
        if self._start_checked:
            return
        self._start_checked = True
        backup = self.restorable()
        if backup is None:
            return
        path = os.path.join(self.backup_dir, backup["weights"])
        if not self.by_step and epoch != backup["epoch"]:
            raise ValueError(
                f"`fit` must resume at the restored backup's epoch: pass `initial_epoch={backup['epoch']}` "
                f"(from {path}). Received: initial_epoch={epoch}"
            )
        if self.by_step and epoch * self.schedule.epoch_steps != backup["step"]:
            raise ValueError(
                f"`fit` must resume at the restored backup's step {backup['step']} (from {path}): pass "
                f"`initial_epoch={self.schedule.epoch_of(backup['step'])}` of the schedule. Received: "
                f"initial_epoch={epoch}"
            )

    def on_epoch_end(self, epoch, logs=None):
        if self.schedule is not None and not self.schedule.backs_up(self.schedule.step(epoch)):
            return
        if _finite(logs) and not self.model.stop_training:
            self._save(epoch + 1)

    def on_train_end(self, logs=None):
        if self.delete_checkpoint and os.path.isdir(self.backup_dir):
            shutil.rmtree(self.backup_dir)

    def _save(self, epoch):
        step = int(self.model.optimizer.iterations.numpy())
        if self.schedule is not None and step != self.schedule.step(epoch - 1):
            raise RuntimeError(f"The optimizer is at step {step}, the schedule at {self.schedule.step(epoch - 1)}")
        name = f"{self._key}-{step if self.by_step else epoch}.weights.h5"
        path = os.path.join(self.backup_dir, name)
        with atomic_path(path, fault="backup-write") as temp:
            self.model.save_weights(temp)
        # An epoch counts steps of this `fit`'s epoch length only: with a schedule, the step alone is recorded.
        record = {**({} if self.by_step else {"epoch": epoch}), "step": step, "weights": name}
        record.update(file_digest(path))
        older = [backup for backup in self._backups or [] if backup["weights"] != name]
        kept = [record] + older[: self.keep - 1]
        atomic_write_json(self.metadata_path, {**record, "backups": kept})
        self._backups = kept
        names = {backup["weights"] for backup in kept}
        for old in os.listdir(self.backup_dir):
            if old.endswith(".weights.h5") and old not in names and not old.startswith(TEMP_PREFIX):
                os.remove(os.path.join(self.backup_dir, old))


class PerplexityEvaluator(keras.callbacks.Callback):
    """At the steps `schedule` evaluates at (every epoch without one): validation loss and perplexities into the logs.

    Runs before the checkpoint callback so that `val_loss` can select the best
    model. Also logs the values to TensorBoard (`validation` writer, at the
    optimizer step; the loss also as `epoch_loss`, the name Keras gives it)
    and generates a few text samples.

    Args:
        dataset: the validation stream (`(inputs, targets, weights)` batches).
        units: the text units of the split, as `evaluate_perplexity` takes
            them: `{"num_words": n}` (word perplexity) or
            `{"num_characters": n}` (bits per character, for character-level
            runs, where words are meaningless).
        strategy: the distribution strategy.
        schedule: a `pipelines.step_schedule.StepSchedule`, or None.
        log_dir: TensorBoard folder (None: no TensorBoard).
        sampler: a function returning a few text samples to log.
    """

    def __init__(self, dataset, units, strategy, schedule=None, log_dir=None, sampler=None):
        super().__init__()
        self.dataset = dataset
        self.units = dict(units)
        self.strategy = strategy
        self.schedule = schedule
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
        if logs is None or not _finite(logs):
            return
        if self.schedule is not None and not self.schedule.evaluates(self.schedule.step(epoch)):
            return
        self.record(self.evaluate(), int(self.model.optimizer.iterations.numpy()), logs)

    def record(self, result, step, logs=None):
        """Keeps `result` (a validation at `step`) as the last one, into `logs` and TensorBoard."""
        self.last, self.last_step = result, step
        metrics = {name: result[name] for name in ("loss", *METRICS) if name in result}
        if logs is not None:
            logs.update({f"val_{name}": value for name, value in metrics.items()})
        if self.writer is not None:
            with self.writer.as_default(step=step):
                for name, value in metrics.items():
                    tf.summary.scalar(name, value)
                tf.summary.scalar("epoch_loss", metrics["loss"])
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
