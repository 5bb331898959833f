"""`tfam train`: a GPT-2-style LM on WikiText-2 with `model.fit` under a distribution strategy.

Run directory layout (`--out RUN`):

    RUN/config.json              the config (a rerun must match it)
    RUN/tokenizer/               the tokenizer, trained on the train split
    RUN/cache/<split>.npy        the tokenized splits (cache after tokenization)
    RUN/backup/                  BackupAndRestore state: rerunning the command resumes
    RUN/checkpoints/best.keras   the model with the best validation loss
    RUN/checkpoints/final.keras  the model at the end of training
    RUN/logs/                    TensorBoard (train/, validation/)
    RUN/export/<version>/        the SavedModel for TF Serving (or --export-dir)
"""

import json
import math
import os
import statistics

import keras
import numpy as np
import tensorflow as tf

from keras_tfam.models.presets import get_preset
from pipelines.callbacks import BestCheckpoint, ModelScalars, PerplexityEvaluator, SafeBackupAndRestore, ThroughputMonitor
from pipelines.data.lm_stream import lm_dataset, stateful_lm_dataset, tokenize_lines
from pipelines.data.tokenizers import load_tokenizer, train_tokenizer
from pipelines.data.wikitext import count_words, split_lines
from pipelines.export import export_model
from pipelines.keras_workarounds import patch_multi_worker_fit
from pipelines.optimizer import GlobalClipAdamW

# Fields that may differ between a run and its resumption.
_RESUMABLE = {"max_steps", "out", "export_dir", "profile_steps", "samples", "sample_tokens", "data_dir"}


def configure_cpu_devices(count):
    """Splits the CPU into `count` logical devices (before TensorFlow starts)."""
    if count and count > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)


def choose_strategy(name):
    """MultiWorkerMirrored with TF_CONFIG; Mirrored over several GPUs (or logical CPUs); else default."""
    if name == "multi_worker" or (name == "auto" and os.environ.get("TF_CONFIG")):
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name == "mirrored":
        devices = gpus or tf.config.list_logical_devices("CPU")
        return tf.distribute.MirroredStrategy([d.name for d in devices])
    if name == "auto" and len(gpus) > 1:
        return tf.distribute.MirroredStrategy([d.name for d in gpus])
    return tf.distribute.get_strategy()


def choose_jit(setting, strategy):
    """XLA where it works: on GPUs, and on a single CPU device; not across logical CPUs."""
    if setting != "auto":
        return setting == "on"
    if tf.config.list_logical_devices("GPU"):
        return True
    return strategy.num_replicas_in_sync == 1 and not isinstance(
        strategy, tf.distribute.MultiWorkerMirroredStrategy
    )


def _is_chief(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    return resolver.task_type == "chief" or (resolver.task_type == "worker" and resolver.task_id == 0)


def _worker_dir(run_dir, strategy):
    """Non-chief workers of a multi-worker run write beside the chief, not over it."""
    if _is_chief(strategy):
        return run_dir
    resolver = strategy.cluster_resolver
    return os.path.join(run_dir, f"{resolver.task_type}_{resolver.task_id}")


def _check_run_config(run_dir, config):
    path = os.path.join(run_dir, "config.json")
    values = config.to_dict()
    if os.path.isfile(path):
        with open(path) as f:
            previous = json.load(f)
        changed = {k: (previous.get(k), v) for k, v in values.items() if k not in _RESUMABLE and previous.get(k) != v}
        if changed:
            raise ValueError(
                f"{run_dir!r} holds a run with another config; changed fields (saved, given): {changed}. "
                "Use another --out."
            )
    os.makedirs(run_dir, exist_ok=True)
    with open(path, "w") as f:
        json.dump(values, f, indent=2)


def _tokens(run_dir, tokenizer, lines, name):
    """The split's token stream, cached in the run after the first tokenization."""
    path = os.path.join(run_dir, "cache", f"{name}.npy")
    if os.path.isfile(path):
        return np.load(path)
    tokens = tokenize_lines(tokenizer, lines)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.save(path, tokens)
    return tokens


def _split(config, split):
    """A split's lines: from `data_dir` (files), else downloaded through the TFDS builder."""
    if config.data_dir:
        return split_lines(config.data_dir, split)
    from pipelines.data.wikitext_tfds import tfds_split_lines

    return tfds_split_lines(config.dataset, split)


def build_model(config, vocabulary_size):
    """The model of `config`: its preset, the config's model options, and the context it trains on.

    The model records `context_length = sequence_length` (unless the options
    set it), so generation never attends over more than it was trained on;
    a learned position table has `sequence_length` rows unless
    `max_sequence_length` is set.
    """
    model_class, arguments = get_preset(config.model)
    options = {"context_length": config.sequence_length, **config.model_options}
    if "max_sequence_length" in arguments and "max_sequence_length" not in config.model_options:
        options["max_sequence_length"] = max(config.sequence_length, options["context_length"])
    model = model_class(**{**arguments, **options, "vocabulary_size": vocabulary_size})
    if model.max_length is not None and config.sequence_length > model.max_length:
        raise ValueError(
            f"sequence_length={config.sequence_length} exceeds the model's context of {model.max_length} positions "
            f"(max_length): train on at most that, or give the model more positions"
        )
    return model


def build_optimizer(config):
    """AdamW, linear warmup then cosine decay, global-norm clipping (of the all-reduced gradient).

    Weight decay applies to matrices only: not to biases, norm gains/offsets,
    or the token and position embeddings (the tied token embedding is also the
    output head; decaying it pulls rare-word logits to zero).
    """
    warmup = min(config.warmup_steps, config.max_steps)
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else config.learning_rate,
        decay_steps=max(1, config.max_steps - warmup),
        alpha=config.min_learning_rate_ratio,
        warmup_target=config.learning_rate if warmup else None,
        warmup_steps=warmup,
    )
    optimizer = GlobalClipAdamW(
        learning_rate=schedule,
        weight_decay=config.weight_decay,
        beta_1=config.beta_1,
        beta_2=config.beta_2,
        clip_global_norm=config.clip_norm,
        gradient_accumulation_steps=config.gradient_accumulation_steps if config.gradient_accumulation_steps > 1 else None,
    )
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta", "scale", "embeddings"])
    return optimizer


def _initial_epoch(backup_dir):
    path = os.path.join(backup_dir, "training_metadata.json")
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        return int(json.load(f)["epoch"])


def stateful_stream(config):
    """Whether the config's model reads a stateful stream (its class says so: `stateful_stream`)."""
    model_class, _ = get_preset(config.model)
    return bool(getattr(model_class, "stateful_stream", False))


def protocol_label(config):
    if config.train_split == "train":
        return f"WikiText-2 {config.eval_split} split"
    return (
        f"mini protocol: trained on {config.train_split}, evaluated on {config.eval_split} "
        "(not WikiText-2 test perplexity)"
    )


def train(config):
    """Trains, checkpoints, evaluates and exports as `config` says; returns a summary dict."""
    config.validate()
    configure_cpu_devices(config.cpu_devices)
    strategy = choose_strategy(config.strategy)
    run_dir = _worker_dir(os.path.abspath(config.out), strategy)
    # Data first: a missing split fails before any model work.
    train_lines, eval_lines = (_split(config, split) for split in (config.train_split, config.eval_split))
    _check_run_config(run_dir, config)
    keras.utils.set_random_seed(config.seed)
    keras.mixed_precision.set_global_policy(config.precision)

    tokenizer_dir = os.path.join(run_dir, "tokenizer")
    if os.path.isdir(tokenizer_dir):
        tokenizer = load_tokenizer(tokenizer_dir)
    else:
        tokenizer = train_tokenizer(config.tokenizer, train_lines, config.vocabulary_size)
        tokenizer.save(tokenizer_dir)
    train_tokens = _tokens(run_dir, tokenizer, train_lines, config.train_split)
    eval_tokens = _tokens(run_dir, tokenizer, eval_lines, config.eval_split)

    replicas = strategy.num_replicas_in_sync
    global_batch = config.batch_size * replicas
    steps_per_epoch = math.gcd(config.backup_every, config.max_steps)
    epochs = config.max_steps // steps_per_epoch
    validation_every = max(1, config.eval_every // steps_per_epoch)
    backup_dir = os.path.join(run_dir, "backup")
    initial_epoch = _initial_epoch(backup_dir)
    # Resume the data stream where the backup left it.
    if stateful_stream(config):
        # Consecutive batches continue each other's rows (the model carries a
        # memory across them, restored with the backup): not shuffled.
        if replicas > 1:
            raise ValueError(
                f"{config.model!r} trains on a stateful stream, on one device only. Received: {replicas} replicas"
            )
        train_data = stateful_lm_dataset(
            train_tokens, config.sequence_length, global_batch, tokenizer.eos_id, repeat=True
        ).skip(initial_epoch * steps_per_epoch)
        eval_data = stateful_lm_dataset(eval_tokens, config.sequence_length, global_batch, tokenizer.eos_id)
    else:
        train_data = lm_dataset(
            train_tokens, config.sequence_length, global_batch, tokenizer.eos_id,
            shuffle=True, seed=config.seed, drop_remainder=True, repeat=True,
        ).skip(initial_epoch * steps_per_epoch)
        eval_data = lm_dataset(eval_tokens, config.sequence_length, global_batch, tokenizer.eos_id)
    jit = choose_jit(config.jit, strategy)

    with strategy.scope():
        model = build_model(config, tokenizer.vocabulary_size)
        if stateful_stream(config):
            # The stream's memory has a row per batch row: built now, so that a
            # backup (weights and memory) can be restored into it.
            model.build((global_batch, config.sequence_length))
        model.compile(
            optimizer=build_optimizer(config),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=jit,
        )

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        patch_multi_worker_fit(model, strategy, next(iter(train_data.take(1))))

    log_dir = os.path.join(run_dir, "logs")
    os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
    prompts = [line for line in eval_lines if len(line.split()) > 8][: config.samples]

    def samples():
        texts = []
        for prompt in prompts:
            words = " ".join(prompt.split()[:8])
            ids = [tokenizer.eos_id] + list(np.asarray(tokenizer.tokenize_prompt(tf.constant([words])).flat_values))
            out = model.generate([ids], config.sample_tokens, sampler="top_p", seed=config.seed, jit_compile=False)
            completion = tokenizer.detokenize(out[:, len(ids):]).numpy()[0].decode("utf-8", "replace")
            texts.append(f"**{words}** {completion}")
        return texts

    throughput = ThroughputMonitor(global_batch * config.sequence_length, log_dir)
    evaluator = PerplexityEvaluator(
        eval_data, count_words(eval_lines), strategy, validation_every, log_dir,
        sampler=samples if config.samples else None,
    )
    best_path = os.path.join(run_dir, "checkpoints", "best.keras")
    profile = tuple(int(s) for s in config.profile_steps.split(",")) if config.profile_steps else 0
    callbacks = [
        throughput,
        evaluator,
        BestCheckpoint(best_path),
        SafeBackupAndRestore(backup_dir, save_freq="epoch", delete_checkpoint=False),
        keras.callbacks.TerminateOnNaN(),
        keras.callbacks.TensorBoard(log_dir, update_freq="epoch", write_graph=False, profile_batch=profile),
    ]
    if hasattr(model, "summary_scalars"):
        callbacks.append(ModelScalars(log_dir))
    history = model.fit(
        train_data,
        epochs=epochs,
        initial_epoch=initial_epoch,
        steps_per_epoch=steps_per_epoch,
        callbacks=callbacks,
        verbose="auto",
    )
    steps = int(model.optimizer.iterations.numpy())
    stopped_on_nan = any(not math.isfinite(v) for v in history.history.get("loss", []))
    final_path = os.path.join(run_dir, "checkpoints", "final.keras")
    if not stopped_on_nan:
        model.save(final_path)
    if evaluator.last is not None and evaluator.last_step == steps:
        result = evaluator.last
    else:
        evaluator.set_model(model)
        result = evaluator.evaluate()

    export_path = None
    if _is_chief(strategy) and not stopped_on_nan:
        exported = keras.saving.load_model(best_path) if os.path.isfile(best_path) else model
        export_path = export_model(exported, config.export_dir or os.path.join(run_dir, "export"), tokenizer, overwrite=False)
    summary = {
        "steps": steps,
        "resumed_from_step": initial_epoch * steps_per_epoch,
        "replicas": replicas,
        "jit_compile": jit,
        "protocol": protocol_label(config),
        "validation": result,
        "tokens_per_second": statistics.median(throughput.rates) if throughput.rates else None,
        "best_checkpoint": best_path if os.path.isfile(best_path) else None,
        "final_checkpoint": final_path if os.path.isfile(final_path) else None,
        "export": export_path,
        "logs": log_dir,
        "stopped_on_nan": stopped_on_nan,
    }
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def format_summary(summary):
    v = summary["validation"]
    rate = summary["tokens_per_second"]
    lines = [
        "=" * 72,
        f"tfam train: {summary['steps']} steps on {summary['replicas']} replica(s)"
        + (f" (resumed at step {summary['resumed_from_step']})" if summary["resumed_from_step"] else "")
        + (" -- STOPPED: loss became NaN" if summary["stopped_on_nan"] else ""),
        f"validation ({summary['protocol']}):",
        f"  loss {v['loss']:.4f} nats/token   token perplexity {v['token_perplexity']:.2f}   "
        f"word perplexity {v['word_perplexity']:.2f}   ({v['tokens']} tokens, {v['words']} words)",
        f"throughput: {rate:.0f} tokens/s (median over epochs)" if rate else "throughput: n/a (no epoch ran)",
        f"best checkpoint: {summary['best_checkpoint']}",
        f"export: {summary['export']}",
        f"TensorBoard: tensorboard --logdir {summary['logs']}",
        "=" * 72,
    ]
    return "\n".join(lines)
