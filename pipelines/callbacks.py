"""Training callbacks: NaN-safe backups, validation perplexity, TensorBoard extras, speed."""

import json
import math
import os
import time

import keras
import numpy as np
import tensorflow as tf

from pipelines.evaluation import evaluate_perplexity, nll_function


def _finite(logs):
    return all(math.isfinite(float(v)) for k, v in (logs or {}).items() if "loss" in k)


class SafeBackupAndRestore(keras.callbacks.BackupAndRestore):
    """`BackupAndRestore` that survives being killed mid-save and never backs up a NaN.

    Each backup is written under a temporary name and renamed into place, and
    `training_metadata.json` (replaced atomically, last) names the weights file
    it belongs to: a SIGKILL at any moment leaves the previous complete backup.
    A non-finite loss (or a stop requested by `TerminateOnNaN`) skips the
    backup, so broken weights never replace the last good ones.
    """

    def on_train_begin(self, logs=None):
        self._load_model()

    def _load_model(self):
        metadata_path = os.path.join(self.backup_dir, "training_metadata.json")
        if not os.path.isfile(metadata_path):
            return
        with open(metadata_path) as f:
            metadata = json.load(f)
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        self.model.load_weights(os.path.join(self.backup_dir, metadata["weights"]))
        self.model._initial_epoch = metadata["epoch"]

    def _save_model(self):
        os.makedirs(self.backup_dir, exist_ok=True)
        name = f"epoch-{self._current_epoch}.weights.h5"
        partial = os.path.join(self.backup_dir, f"incomplete-{name}")
        self.model.save_weights(partial, overwrite=True)
        os.replace(partial, os.path.join(self.backup_dir, name))
        metadata = {"epoch": self._current_epoch, "batch": self._last_batch_seen, "weights": name}
        with open(os.path.join(self.backup_dir, "training_metadata.json.tmp"), "w") as f:
            json.dump(metadata, f)
        os.replace(
            os.path.join(self.backup_dir, "training_metadata.json.tmp"),
            os.path.join(self.backup_dir, "training_metadata.json"),
        )
        for old in os.listdir(self.backup_dir):
            if old.endswith(".weights.h5") and old != name:
                os.remove(os.path.join(self.backup_dir, old))

    def on_epoch_end(self, epoch, logs=None):
        if _finite(logs) and not self.model.stop_training:
            super().on_epoch_end(epoch, logs)


class PerplexityEvaluator(keras.callbacks.Callback):
    """Every `every` epochs: validation loss and token/word perplexity into the logs.

    Runs before the checkpoint callback so that `val_loss` can select the best
    model. Also logs the values to TensorBoard (`validation` writer) and
    generates a few text samples.
    """

    def __init__(self, dataset, num_words, strategy, every=1, log_dir=None, sampler=None):
        super().__init__()
        self.dataset = dataset
        self.num_words = num_words
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
        return evaluate_perplexity(self.model, self.dataset, self.num_words, self.strategy, self._step)

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or (epoch + 1) % self.every:
            return
        if not _finite(logs):
            return
        result = self.evaluate()
        self.last = result
        self.last_step = int(self.model.optimizer.iterations.numpy())
        logs["val_loss"] = result["loss"]
        logs["val_token_perplexity"] = result["token_perplexity"]
        logs["val_word_perplexity"] = result["word_perplexity"]
        if self.writer is not None:
            with self.writer.as_default(step=self.last_step):
                tf.summary.scalar("loss", result["loss"])
                tf.summary.scalar("token_perplexity", result["token_perplexity"])
                tf.summary.scalar("word_perplexity", result["word_perplexity"])
                if self.sampler is not None:
                    for i, text in enumerate(self.sampler()):
                        tf.summary.text(f"sample_{i}", text)
            self.writer.flush()


class BestCheckpoint(keras.callbacks.Callback):
    """Saves the model as `.keras` whenever `val_loss` improves; the best value
    survives restarts (`best.json`), so a resumed run cannot overwrite a better
    checkpoint with a worse one, and a NaN is never an improvement."""

    def __init__(self, path):
        super().__init__()
        self.path = path
        self.meta = path[: -len(".keras")] + ".json"
        self.best = math.inf
        if tf.io.gfile.exists(self.meta):
            with open(self.meta) as f:
                self.best = json.load(f)["val_loss"]

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get("val_loss")
        if value is None or not math.isfinite(value) or value >= self.best:
            return
        self.best = float(value)
        self.model.save(self.path)
        with open(self.meta, "w") as f:
            json.dump({"val_loss": self.best, "step": int(self.model.optimizer.iterations.numpy())}, f)


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
