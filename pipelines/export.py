"""SavedModel export for TF Serving: `serving_default`, `generate` and `generate_text`.

Layout: `<export_dir>/<version>/` with an integer version, as TF Serving
expects. The model is written to a temporary folder beside the target
(`.incomplete-*`), flushed to disk, made world-readable (folders 0755, files
0644: TF Serving often runs as another user) and renamed into place only
when complete, so an interrupted or failed export never leaves a version
folder that looks complete. `<export_dir>/.export.lock` lets one export at
a time write there; the next export deletes what killed ones left behind
(and puts back a version that an interrupted `--overwrite` had moved aside).

Signatures (all without XLA, which TF Serving on CPU does not enable):

- `serving_default(token_ids int32 [B, T])` -> `logits float32 [B, V]`: the
  next-token logits after the last position `T - 1` (not log-probabilities).
- `generate(token_ids int32 [B, T], lengths int32 [B], max_new_tokens int32 [],
  temperature float32 [], top_k int32 [], top_p float32 [], seed int32 [])`
  -> `token_ids int32 [B, T + max_new_tokens]`: prompts right-padded to `T`,
  `lengths` their real lengths; each row is its prompt, `max_new_tokens` new
  tokens, then padding. `temperature <= 0` is greedy; `top_k <= 0` and
  `top_p >= 1` turn those filters off. The KV-cached decoding loop runs in
  the graph.
- `generate_text(prompts string [B], max_new_tokens, temperature, top_k, top_p,
  seed)` -> `completions string [B]`: the tokenizer runs in the graph; each
  prompt is read as following an end of line, as in training.

The word and character tokenizers use core TensorFlow ops only; the BPE
tokenizer's `generate_text` needs the tensorflow-text ops where it is served.
"""

import os
import re
import shutil
import tempfile

import keras
import tensorflow as tf

from keras_tfam.generation.samplers import TensorSampler
from pipelines.errors import notice
from pipelines.faults import fault_point
from pipelines.files import fsync_directory, fsync_tree
from pipelines.run_lock import RunLock

_SCALARS = dict(
    max_new_tokens=tf.TensorSpec([], tf.int32, name="max_new_tokens"),
    temperature=tf.TensorSpec([], tf.float32, name="temperature"),
    top_k=tf.TensorSpec([], tf.int32, name="top_k"),
    top_p=tf.TensorSpec([], tf.float32, name="top_p"),
    seed=tf.TensorSpec([], tf.int32, name="seed"),
)


def resolve_version_dir(export_dir):
    """`export_dir` itself if its name is an integer, else `export_dir/<next integer>`."""
    export_dir = os.path.abspath(export_dir)
    if re.fullmatch(r"\d+", os.path.basename(export_dir)):
        return export_dir
    versions = [int(d) for d in os.listdir(export_dir) if d.isdigit()] if os.path.isdir(export_dir) else []
    return os.path.join(export_dir, str(max(versions, default=0) + 1))


class ServingFunctions:
    """The exported computations, over a GPT2LM and a tokenizer."""

    def __init__(self, model, tokenizer=None):
        self.model = model
        self.tokenizer = tokenizer

    def serving_default(self, token_ids):
        logits = self.model(token_ids, training=False)
        return {"logits": tf.cast(logits[:, -1], tf.float32)}

    def generate(self, token_ids, lengths, max_new_tokens, temperature, top_k, top_p, seed):
        model = self.model
        batch_size, width = tf.shape(token_ids)[0], tf.shape(token_ids)[1]
        checks = [
            tf.debugging.assert_greater_equal(max_new_tokens, 1, message="max_new_tokens must be >= 1"),
            tf.debugging.assert_greater_equal(lengths, 1, message="every prompt needs at least one token"),
            tf.debugging.assert_less_equal(lengths, width, message="lengths exceed the token_ids width"),
            tf.debugging.assert_non_negative(token_ids, message="token ids must be >= 0"),
            tf.debugging.assert_less(token_ids, model.vocabulary_size, message="token ids must be < vocabulary_size"),
        ]
        if model.position == "learned":
            checks.append(
                tf.debugging.assert_less_equal(
                    width + max_new_tokens,
                    model.max_sequence_length,
                    message=f"prompt width + max_new_tokens exceeds max_sequence_length={model.max_sequence_length}",
                )
            )
        with tf.control_dependencies(checks):
            tokens = tf.concat([token_ids, tf.zeros([batch_size, max_new_tokens], tf.int32)], axis=1)
        positions = tf.range(width)[None, :]
        tokens = tf.concat(
            [tf.where(positions < lengths[:, None], token_ids, 0), tokens[:, width:]], axis=1
        )
        sampler = TensorSampler(temperature, top_k, top_p)
        generated = model.generate_graph(
            tokens,
            lengths,
            max_new_tokens,
            tf.stack([seed, 0]),
            tf.zeros([0], tf.int32),
            sampler,
            tf.reduce_min(lengths) - 1,
        )
        return {"token_ids": generated}

    def generate_text(self, prompts, max_new_tokens, temperature, top_k, top_p, seed):
        tokenizer = self.tokenizer
        ids = tokenizer.tokenize_prompt(prompts)
        start = tf.fill([ids.nrows(), 1], tf.constant(tokenizer.eos_id, tf.int32))
        ids = tf.concat([tf.RaggedTensor.from_tensor(start), tf.cast(ids, tf.int32)], axis=1)
        lengths = tf.cast(ids.row_lengths(), tf.int32)
        generated = self.generate(ids.to_tensor(), lengths, max_new_tokens, temperature, top_k, top_p, seed)
        new_tokens = tf.RaggedTensor.from_tensor(
            tf.gather(generated["token_ids"], lengths[:, None] + tf.range(max_new_tokens)[None, :], batch_dims=1)
        )
        return {"completions": tokenizer.detokenize(new_tokens)}


def export_model(model, export_dir, tokenizer=None, overwrite=False):
    """Writes the SavedModel to `export_dir` (TF Serving layout); returns the version path."""
    target = resolve_version_dir(export_dir)
    if os.path.exists(target) and not overwrite:
        raise FileExistsError(f"Export {target!r} exists already; pass --overwrite to replace it")
    functions = ServingFunctions(model, tokenizer)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        "serving_default",
        functions.serving_default,
        input_signature=[tf.TensorSpec([None, None], tf.int32, name="token_ids")],
    )
    archive.add_endpoint(
        "generate",
        functions.generate,
        input_signature=[
            tf.TensorSpec([None, None], tf.int32, name="token_ids"),
            tf.TensorSpec([None], tf.int32, name="lengths"),
            *_SCALARS.values(),
        ],
    )
    if tokenizer is not None:
        archive.track(tokenizer)
        archive.add_endpoint(
            "generate_text",
            functions.generate_text,
            input_signature=[tf.TensorSpec([None], tf.string, name="prompts"), *_SCALARS.values()],
        )
    parent = os.path.dirname(target)
    with RunLock(parent, name=".export.lock", remove_if_unused=False):
        _clean_killed_exports(parent)
        target = resolve_version_dir(export_dir)  # a version put back by the cleaning counts
        if os.path.exists(target) and not overwrite:
            raise FileExistsError(f"Export {target!r} exists already; pass --overwrite to replace it")
        _write_version(archive, target)
    return target


def _readable_by_all(path):
    """Folders 0755, files 0644 under `path` (`mkdtemp` makes 0700; TF Serving may run as another user)."""
    os.chmod(path, 0o755)
    for root, folders, files in os.walk(path):
        for name in folders:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)


def _write_version(archive, target):
    """Writes `archive` to the version folder `target` through a staging folder, atomically."""
    parent, version = os.path.split(target)
    staging = tempfile.mkdtemp(prefix=".incomplete-", dir=parent)
    try:
        archive.write_out(staging, verbose=False)
        _readable_by_all(staging)
        fsync_tree(staging)
        fault_point("export-write")
        if os.path.exists(target):
            # Moved aside under a name that says which version it was, so that
            # the next export can put it back if this one is killed midway.
            retired = tempfile.mkdtemp(prefix=f".replaced-{version}-", dir=parent)
            os.rename(target, os.path.join(retired, "old"))
            os.rename(staging, target)
            fsync_directory(parent)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.rename(staging, target)
        fsync_directory(parent)
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging, ignore_errors=True)


def _clean_killed_exports(parent):
    """Deletes the staging folders of killed exports; puts back a version a killed overwrite moved aside.

    Call it holding the folder's `.export.lock`: nobody else is exporting.
    """
    for name in sorted(os.listdir(parent)):
        path = os.path.join(parent, name)
        if name.startswith(".incomplete-"):
            shutil.rmtree(path, ignore_errors=True)
            notice(f"deleted {path}, the unfinished folder of an export that was killed")
            continue
        match = re.fullmatch(r"\.replaced-(\d+)-.*", name)
        if match:
            old, version = os.path.join(path, "old"), os.path.join(parent, match.group(1))
            if os.path.isdir(old) and not os.path.exists(version):
                os.rename(old, version)
                notice(f"put back {version}, which an export killed while replacing it had moved aside")
            shutil.rmtree(path, ignore_errors=True)
