"""`tfam train`: a GPT-2-style LM on WikiText-2 with `model.fit` under a distribution strategy.

Run directory layout (`--out RUN`):

    RUN/.lock                    held while a process trains here (one at a time)
    RUN/config.json              the config (a rerun must match it)
    RUN/kernel_path.json         XLA or oneDNN, float32 or bfloat16: chosen once, kept by a resumed run
    RUN/tokenizer/               the tokenizer, trained on the train split
    RUN/cache/<split>-<key>.npy  the tokenized splits, keyed by the tokenizer and the text
    RUN/backup/                  the last backups (step-N.weights.h5): rerunning the command resumes
    RUN/checkpoints/best.keras   the model with the best validation loss (+ best.json)
    RUN/checkpoints/final.keras  the model at the end of training (+ final.json)
    RUN/logs/                    TensorBoard (train/, validation/)
    RUN/summary.json             the results
    RUN/export/<version>/        the SavedModel for TF Serving (or --export-dir; none with --export off)

A step is one optimizer update everywhere (`pipelines.step_schedule`):
`--max-steps` of them, a backup after every `--backup-every`, a validation
after every `--eval-every`, the training loss, learning rate and tokens/s
after every `--log-every` (each also at the end), whatever the values and
the gradient accumulation.
Rerunning the command resumes from the last backup, on the data stream at
the backup's step: a killed run ends with the weights of an uninterrupted
one. A larger `--max-steps` extends a run, finished or not, the same way
(the learning rate follows the new `--max-steps`' schedule from there); a
smaller one than the step reached is refused.

Every file is written atomically and checked when it is read back (see
`pipelines.files`); a damaged one is reported by name, with what is done
about it: a derived file is rebuilt, a damaged backup or checkpoint falls
back to the previous one, and a run is never silently started over.
"""

import json
import math
import os
import statistics

import keras
import numpy as np
import tensorflow as tf

from keras_tfam.losses import TokenCrossEntropy
from keras_tfam.models import from_huggingface
from keras_tfam.models.presets import get_preset
from pipelines.callbacks import BestCheckpoint, PerplexityEvaluator, SafeBackupAndRestore
from pipelines.checkpoints import load_checkpoint, save_checkpoint
from pipelines.data.lm_stream import lm_dataset, stateful_lm_dataset
from pipelines.errors import CorruptFileError, notice
from pipelines.evaluation import text_units
from pipelines.export import export_model
from pipelines.files import atomic_write_json, read_json, remove_temporaries
from pipelines.keras_workarounds import fit_multi_worker
from pipelines.kernel_path import choose_kernel_path, describe, training_step_seconds, with_cpu_settings
from pipelines.optimizer import GlobalClipAdamW
from pipelines.run_data import cached_tokens, run_tokenizer, save_tokenizer, split_text
from pipelines.run_lock import RunLock
from pipelines.step_schedule import StepSchedule
from pipelines.strategy import choose_strategy, configure_cpu_devices, is_chief, worker_dir
from pipelines.training_log import FaultPoints, ModelScalars, StepProfiler, ThroughputMonitor
from pipelines.training_summary import format_summary, protocol_label  # noqa: F401 - `tfam train` prints it

# The kernel path a run started with, kept for its resumption (pipelines.kernel_path).
KERNEL_PATH_FILE = "kernel_path.json"
# Fields that may differ between a run and its resumption.
_RESUMABLE = {
    "max_steps",
    "log_every",
    "out",
    "export",
    "export_dir",
    "export_batch_sizes",
    "profile_steps",
    "samples",
    "sample_tokens",
    "data_dir",
}


def _kernel_path(run_dir, config, strategy, vocabulary_size):
    """The run's kernel path: the one it started with (`kernel_path.json`) when resumed, else chosen now.

    Where a measurement decides, it times the run's own model, optimizer and
    batch shape on each open path (`training_step_seconds`).
    """
    recorded = os.path.join(run_dir, KERNEL_PATH_FILE)
    if os.path.isfile(recorded):
        try:
            with open(recorded) as f:
                path = json.load(f)
        except (OSError, ValueError):
            path = None
        if (
            isinstance(path, dict)
            and isinstance(path.get("jit_compile"), bool)
            and isinstance(path.get("precision"), str)
        ):
            return path
        notice(f"{recorded} is damaged: choosing the kernel path again (it is rewritten)")
    stateful = stateful_stream(config)

    def build():
        model = build_model(config, vocabulary_size)
        if stateful:
            model.build((config.batch_size, config.sequence_length))
        return model

    def step_seconds(jit_compile, policy):
        return training_step_seconds(
            build,
            lambda: build_optimizer(config),
            config.batch_size,
            config.sequence_length,
            vocabulary_size,
            jit_compile,
            policy,
        )

    return choose_kernel_path(config.jit, config.precision, strategy, step_seconds)


def _check_run_config(run_dir, config):
    """Refuses a rerun whose config differs from the run's; True if the run has no config yet."""
    path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(path):
        return True
    try:
        previous = read_json(path)
    except CorruptFileError as error:
        raise CorruptFileError(
            path,
            error.problem,
            action="it records the run's options: if this command has them, delete the file and rerun "
            "(it is written again from them)",
        ) from None
    changed = {
        k: (previous.get(k), v) for k, v in config.to_dict().items() if k not in _RESUMABLE and previous.get(k) != v
    }
    if changed:
        raise ValueError(
            f"{run_dir!r} holds a run with another config; changed fields (saved, given): {changed}. Use another --out."
        )
    return False


def _check_max_steps(config, backup):
    """Refuses a `max_steps` below the step the run's backup has reached; returns that step (0: none).

    A larger `max_steps` extends the run: it goes on from the backup's step on the same stream.
    """
    start = backup.restorable_step()
    if config.max_steps < start:
        path = os.path.join(backup.backup_dir, backup.restorable()["weights"])
        raise ValueError(
            f"`--max-steps` must be at least {start}, the step this run has reached ({path}): a run is extended, "
            f"never shortened (for fewer steps, use another --out). Received: max_steps={config.max_steps}"
        )
    return start


def check_sequence_length(model, sequence_length):
    """Raises a `ValueError` if `sequence_length` exceeds the context the model knows (`max_length`)."""
    if model.max_length is not None and sequence_length > model.max_length:
        raise ValueError(
            f"`sequence_length` must be at most the model's context of {model.max_length} positions (max_length: "
            f"the context it was trained on, or its learned positions). Received: sequence_length={sequence_length}"
        )


def build_losses(model, sequence_length):
    """Builds a compiled model's loss and metrics on a batch of ids, in the strategy's scope.

    Under a distribution strategy, Keras builds whatever is unbuilt from the
    first batch averaged across replicas, which turns token ids into floats.
    """
    ids = np.zeros((1, sequence_length), np.int32)
    predictions = model(ids, training=False)
    model.compute_loss(x=ids, y=ids, y_pred=predictions, training=False)
    model.compute_metrics(ids, ids, predictions, sample_weight=None)


def build_model(config, vocabulary_size):
    """The model of `config`: its preset (or the checkpoint of `init_from`), the config's model options, and the
    context it trains on; with `lora_rank`, LoRA factors are its only trainable weights.

    The model records `context_length = sequence_length` (unless the options
    set it), so generation never attends over more than it was trained on;
    a learned position table has `sequence_length` rows unless
    `max_sequence_length` is set.
    """
    if config.init_from is not None:
        model = from_huggingface(config.init_from, **config.model_options)
        if vocabulary_size > model.vocabulary_size:
            raise ValueError(
                f"The tokenizer of {config.init_from!r} has {vocabulary_size} ids, more than the model's "
                f"{model.vocabulary_size}"
            )
        check_sequence_length(model, config.sequence_length)
        return _with_lora(model, config)
    model_class, arguments = get_preset(config.model)
    options = dict(config.model_options)
    if "max_sequence_length" in arguments:  # a learned position table: as long as the training windows
        options.setdefault("max_sequence_length", config.sequence_length)
        options.setdefault("context_length", min(config.sequence_length, options["max_sequence_length"]))
    else:
        options.setdefault("context_length", config.sequence_length)
    model = model_class(**{**arguments, **options, "vocabulary_size": vocabulary_size})
    check_sequence_length(model, config.sequence_length)
    return _with_lora(model, config)


def _with_lora(model, config):
    """`model` with LoRA factors of `config.lora_rank` (only they train), or as it is."""
    if config.lora_rank is not None:
        model.enable_lora(config.lora_rank)
    return model


def build_optimizer(config):
    """AdamW, linear warmup then cosine decay, global-norm clipping (of the all-reduced gradient).

    Weight decay applies to matrices only: not to biases, norm gains/offsets,
    or the token and position embeddings (the tied token embedding is also the
    output head; decaying it pulls rare-word logits to zero).
    """
    warmup = min(config.warmup_steps, config.max_steps)
    # Keras' schedules count batches, and a step is `accumulation` of them.
    accumulation = config.gradient_accumulation_steps
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else config.learning_rate,
        decay_steps=max(1, config.max_steps - warmup) * accumulation,
        alpha=config.min_learning_rate_ratio,
        warmup_target=config.learning_rate if warmup else None,
        warmup_steps=warmup * accumulation,
    )
    optimizer = GlobalClipAdamW(
        learning_rate=schedule,
        weight_decay=config.weight_decay,
        beta_1=config.beta_1,
        beta_2=config.beta_2,
        clip_global_norm=config.clip_norm,
        gradient_accumulation_steps=(
            config.gradient_accumulation_steps if config.gradient_accumulation_steps > 1 else None
        ),
    )
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta", "scale", "embeddings"])
    return optimizer


def stateful_stream(config):
    """Whether the config's model reads a stateful stream (its class says so: `stateful_stream`)."""
    model_class, _ = get_preset(config.model)
    return bool(getattr(model_class, "stateful_stream", False))


def train(config):
    """Trains, checkpoints, evaluates and exports as `config` says; returns a summary dict.

    The run directory is locked for the whole time (`RunLock`): a second
    process on it raises `RunInUse`.
    """
    config.validate()
    configure_cpu_devices(config.cpu_devices)
    strategy = choose_strategy(config.strategy)
    run_dir = worker_dir(os.path.abspath(config.out), strategy)
    with RunLock(run_dir):
        return _train_locked(config, strategy, run_dir)


def _train_locked(config, strategy, run_dir):
    checkpoint_dir = os.path.join(run_dir, "checkpoints")
    backup_dir = os.path.join(run_dir, "backup")
    # We hold the lock: temporaries here were left by killed processes.
    for folder in (run_dir, checkpoint_dir, backup_dir, os.path.join(run_dir, "cache")):
        remove_temporaries(folder)
    # Data first: a missing split fails before any model work.
    train_lines, eval_lines = (split_text(config, split) for split in (config.train_split, config.eval_split))
    new_run = _check_run_config(run_dir, config)
    backup = SafeBackupAndRestore(backup_dir, delete_checkpoint=False, by_step=True)
    start = _check_max_steps(config, backup)
    # The schedule's epochs end at its backups and evaluations; the training series are written every
    # `log_every` steps whatever the epochs (ThroughputMonitor), and `epoch_loss` at each backup.
    schedule = StepSchedule(
        config.max_steps,
        config.backup_every,
        config.eval_every,
        accumulation=config.gradient_accumulation_steps,
        start=start,
    )
    backup.schedule = schedule
    keras.utils.set_random_seed(config.seed)
    tokenizer, new_tokenizer = run_tokenizer(run_dir, config, train_lines)
    kernel_path = with_cpu_settings(_kernel_path(run_dir, config, strategy, tokenizer.vocabulary_size))
    print(describe(kernel_path), flush=True)
    keras.mixed_precision.set_global_policy(kernel_path["precision"])
    keras.utils.set_random_seed(config.seed)  # a measurement's models drew from it

    replicas = strategy.num_replicas_in_sync
    global_batch = config.batch_size * replicas
    stateful = stateful_stream(config)
    if stateful and replicas > 1:
        raise ValueError(
            f"{config.model!r} trains on a stateful stream, on one device only. Received: {replicas} replicas"
        )
    jit = kernel_path["jit_compile"]

    # The model validates the architecture options: nothing is written before it is built.
    with strategy.scope():
        model = build_model(config, tokenizer.vocabulary_size)
        if stateful:
            # The stream's memory has a row per batch row: built now, so that a
            # backup (weights and memory) can be restored into it.
            model.build((global_batch, config.sequence_length))
        model.compile(
            optimizer=build_optimizer(config),
            loss=TokenCrossEntropy(),  # Keras' sparse cross-entropy, one pass each way over the logits
            jit_compile=jit,
        )
        if strategy.num_replicas_in_sync > 1:
            build_losses(model, config.sequence_length)
    if new_run:
        atomic_write_json(os.path.join(run_dir, "config.json"), config.to_dict())
    atomic_write_json(os.path.join(run_dir, KERNEL_PATH_FILE), kernel_path)
    if new_tokenizer:
        save_tokenizer(tokenizer, os.path.join(run_dir, "tokenizer"))
    train_tokens = cached_tokens(run_dir, tokenizer, train_lines, config.train_split)
    eval_tokens = cached_tokens(run_dir, tokenizer, eval_lines, config.eval_split)

    # Resume the data stream where the backup left it: the batches of its steps are skipped.
    if stateful:
        # Consecutive batches continue each other's rows (the model carries a
        # memory across them, restored with the backup): not shuffled.
        train_data = stateful_lm_dataset(
            train_tokens, config.sequence_length, global_batch, tokenizer.eos_id, repeat=True
        ).skip(schedule.skipped_batches)
        eval_data = stateful_lm_dataset(eval_tokens, config.sequence_length, global_batch, tokenizer.eos_id)
    else:
        train_data = lm_dataset(
            train_tokens,
            config.sequence_length,
            global_batch,
            tokenizer.eos_id,
            shuffle=True,
            seed=config.seed,
            drop_remainder=True,
            repeat=True,
        ).skip(schedule.skipped_batches)
        eval_data = lm_dataset(eval_tokens, config.sequence_length, global_batch, tokenizer.eos_id)

    log_dir = os.path.join(run_dir, "logs")
    os.makedirs(checkpoint_dir, exist_ok=True)
    prompts = [line for line in eval_lines if len(line.split()) > 8][: config.samples]

    def samples():
        texts = []
        for prompt in prompts:
            words = " ".join(prompt.split()[:8])
            ids = [tokenizer.eos_id] + list(np.asarray(tokenizer.tokenize_prompt(tf.constant([words])).flat_values))
            out = model.generate([ids], config.sample_tokens, sampler="top_p", seed=config.seed, jit_compile=False)
            completion = tokenizer.detokenize(out[:, len(ids) :]).numpy()[0].decode("utf-8", "replace")
            texts.append(f"**{words}** {completion}")
        return texts

    throughput = ThroughputMonitor(
        global_batch * config.sequence_length,
        log_dir,
        schedule,
        log_every=config.log_every or config.backup_every,  # null in an older config file: the backups'
        progress=True,
    )
    evaluator = PerplexityEvaluator(
        eval_data,
        text_units(tokenizer.kind, eval_lines),
        strategy,
        schedule,
        log_dir,
        sampler=samples if config.samples else None,
    )
    best_path = os.path.join(checkpoint_dir, "best.keras")
    best = BestCheckpoint(best_path)
    # Each callback acts at the steps `schedule` says; Keras' progress bar would count epochs and batches.
    callbacks = [throughput, evaluator, best, backup, keras.callbacks.TerminateOnNaN()]
    if config.profile_steps:
        first, last = (int(s) for s in config.profile_steps.split(","))
        callbacks.append(StepProfiler(os.path.join(log_dir, "train"), first, last, schedule))
    if hasattr(model, "summary_scalars"):
        callbacks.append(ModelScalars(log_dir, schedule))
    callbacks.append(FaultPoints(schedule.accumulation))  # last: see FaultPoints
    # The stream is shuffled already (with the seed, resumably).
    fit_arguments = dict(initial_epoch=schedule.initial_epoch, shuffle=False, verbose=0)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        history = fit_multi_worker(
            model, strategy, train_data, callbacks, schedule.epochs, schedule.batches_per_epoch, **fit_arguments
        )
    else:
        history = model.fit(
            train_data,
            epochs=schedule.epochs,
            steps_per_epoch=schedule.batches_per_epoch,
            callbacks=callbacks,
            **fit_arguments,
        )
    steps = int(model.optimizer.iterations.numpy())
    stopped_on_nan = any(not math.isfinite(v) for v in history.history.get("loss", []))
    final_path = os.path.join(checkpoint_dir, "final.keras")
    if not stopped_on_nan:
        save_checkpoint(model, final_path, {"step": steps}, fault="final-write")
    if evaluator.last is not None and evaluator.last_step == steps:
        result = evaluator.last
    else:
        evaluator.set_model(model)
        result = evaluator.evaluate()
        if steps > schedule.start and not stopped_on_nan:
            evaluator.record(result, steps)  # into TensorBoard like the others
        if not stopped_on_nan:
            # The final evaluation is a validation result like the others.
            best.set_model(model)
            best.consider(result["loss"], steps)

    export_path = None
    if config.export and is_chief(strategy) and not stopped_on_nan:
        exported = model
        if os.path.isfile(best_path):
            try:
                exported = load_checkpoint(best_path, compile=False)
            except CorruptFileError as error:
                notice(f"{error}: exporting the final model instead")
        export_dir = config.export_dir or os.path.join(run_dir, "export")
        export_path = export_model(
            exported, export_dir, tokenizer, overwrite=False, batch_sizes=config.export_batch_sizes
        )
    summary = {
        "steps": steps,
        "max_steps": config.max_steps,
        "resumed_from_step": schedule.start,
        "replicas": replicas,
        "jit_compile": jit,
        "kernel_path": kernel_path,
        "protocol": protocol_label(config),
        "tokenizer": tokenizer.kind,
        "validation": result,
        "tokens_per_second": statistics.median(throughput.rates) if throughput.rates else None,
        "best_checkpoint": best_path if os.path.isfile(best_path) else None,
        "final_checkpoint": final_path if os.path.isfile(final_path) else None,
        "export": export_path,
        "logs": log_dir,
        "stopped_on_nan": stopped_on_nan,
    }
    atomic_write_json(os.path.join(run_dir, "summary.json"), summary)
    return summary
