import glob
import json
import os

import keras
import numpy as np
import tensorflow as tf
from pipeline_runs import run_tfam, tiny_args

from keras_tfam.models import TransformerXLLM
from pipelines.callbacks import SafeBackupAndRestore
from pipelines.data.lm_stream import stateful_lm_dataset
from pipelines.evaluation import evaluate_perplexity

rng = np.random.default_rng(0)


def tiny_xl(memory_length=8):
    keras.utils.set_random_seed(3)
    return TransformerXLLM(23, num_layers=1, num_heads=2, hidden_dim=16, memory_length=memory_length)


def test_evaluation_carries_the_memory_across_batches():
    # 3 rows of 24 tokens read in segments of 6, memory 24 >= a row: each row's
    # loss is one causal pass over the row's text.
    tokens = rng.integers(0, 23, size=72)
    model = tiny_xl(memory_length=24)
    result = evaluate_perplexity(model, stateful_lm_dataset(tokens, 6, 3, start_id=0), num_words=72)
    stream = np.concatenate([[0], tokens])
    total = 0.0
    for row in range(3):
        inputs, targets = stream[24 * row : 24 * row + 24], stream[24 * row + 1 : 24 * row + 25]
        logits = model(inputs[None].astype("int32"))
        total += float(np.sum(keras.losses.sparse_categorical_crossentropy(targets[None], logits, from_logits=True)))
    assert result["tokens"] == 72
    np.testing.assert_allclose(result["nll"], total, rtol=1e-5)
    # A second pass starts from an empty memory again: the same result.
    again = evaluate_perplexity(model, stateful_lm_dataset(tokens, 6, 3, start_id=0), num_words=72)
    np.testing.assert_allclose(again["nll"], result["nll"], rtol=1e-6)


def test_resumed_training_continues_the_stream_with_its_memory(tmp_path):
    # 4 steps straight, or 2 steps, a backup, a new process-like model restored
    # from it and 2 more steps on the stream resumed at batch 2: the same weights
    # and the same memory (no text seen twice or skipped).
    tokens = rng.integers(0, 23, size=400)

    def fit(model, backup, epochs, initial_epoch=0):
        model.build((4, 8))  # as `tfam train` does: the memory exists before a backup is restored
        model.compile(keras.optimizers.AdamW(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        data = stateful_lm_dataset(tokens, 8, 4, start_id=0, repeat=True).skip(2 * initial_epoch)
        model.fit(
            data,
            epochs=epochs,
            initial_epoch=initial_epoch,
            steps_per_epoch=2,
            verbose=0,
            callbacks=[SafeBackupAndRestore(str(backup), save_freq="epoch", delete_checkpoint=False)],
        )
        return model

    straight = fit(tiny_xl(), tmp_path / "straight", epochs=2)
    fit(tiny_xl(), tmp_path / "killed", epochs=1)
    with open(tmp_path / "killed" / "training_metadata.json") as f:
        resumed_epoch = json.load(f)["epoch"]  # the next epoch to run
    resumed = fit(tiny_xl(), tmp_path / "killed", epochs=2, initial_epoch=resumed_epoch)
    assert resumed_epoch == 1
    for a, b in zip(resumed.weights, straight.weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), rtol=1e-4, atol=1e-5)
    memory = resumed.memory_state()[0]
    assert np.asarray(memory["memory_mask"]).all()


def _scalar_tags(log_dir):
    tags = set()
    for path in glob.glob(os.path.join(log_dir, "events*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(value.tag for value in event.summary.value)
    return tags


def test_tfam_trains_transformer_xl_with_memory_spans_and_compression(tmp_path, small_wikitext):
    # The whole family from the command line: XL memory, adaptive spans, compressive
    # memory; evaluation with memory, TensorBoard scalars, the export.
    out = str(tmp_path / "xl")
    args = tiny_args(
        small_wikitext,
        out,
        **{
            "model": "adaptive_span_tiny",
            "memory-length": 16,
            "max-span": 16,
            "compressed-memory-length": 8,
            "compression-rate": 2,
            "max-steps": 4,
            "backup-every": 2,
            "eval-every": 4,
        },
    )
    run_tfam(args)
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    assert summary["steps"] == 4 and summary["export"] and np.isfinite(summary["validation"]["loss"])
    tags = _scalar_tags(os.path.join(out, "logs", "train"))
    assert {"memory/length", "memory/filled", "memory/compressed_filled", "span/layer_0/head_1"} <= tags
