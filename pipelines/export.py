"""SavedModel export for TF Serving: `serving_default`, `generate` and `generate_text`.

Layout: `<export_dir>/<version>/` with an integer version, as TF Serving
expects. The model is written to a temporary folder beside the target
(`.incomplete-*`), flushed to disk, made world-readable (folders 0755, files
0644: TF Serving often runs as another user) and renamed into place only
when complete, so an interrupted or failed export never leaves a version
folder that looks complete. `<export_dir>/.export.lock` lets one export at
a time write there; the next export deletes what killed ones left behind
(and puts back a version that an interrupted `--overwrite` had moved aside).

Signatures (`pipelines.serving_functions`; their decoding loop XLA-compiled for a few batch sizes,
`pipelines.served_decoding`, which a TF Serving on CPU runs with `--xla_cpu_compilation_enabled=true`).
Every input of `generate`, `prefill` and `generate_text` has the batch on its first axis (one setting per
row), so TF Serving's batcher can merge requests; a merged call gives each row what it gets alone
(`pipelines.serving_requests` builds them):

- `serving_default(token_ids int32 [B, T])` -> `logits float32 [B, V]`: the
  next-token logits after the last position `T - 1` (not log-probabilities).
- `generate(token_ids int32 [B, T], lengths int32 [B], max_new_tokens int32 [B],
  temperature float32 [B], top_k int32 [B], top_p float32 [B], seed int32 [B],
  stop_token_ids int32 [B, S], repetition_penalty float32 [B])` ->
  `token_ids int32 [B, T + N]` (`N` the largest `max_new_tokens`),
  `num_generated int32 [B]`, `logprobs float32 [B, N]`: prompts right-padded
  to `T`, `lengths` their real lengths; each row is its prompt, its new
  tokens, then padding (0). `temperature <= 0` is greedy; `top_k <= 0` and
  `top_p >= 1` turn those filters off; `seed` seeds the row's draws (the same
  seed, the same draws, whatever else the batch holds); a row stops after it
  generates one of its `stop_token_ids` (negative ids are none; pad a row
  with `-1`); `repetition_penalty` as transformers' (1 is off).
  `num_generated` counts a row's new tokens (its stop token included),
  `logprobs` is the log-probability of each under the model's own
  distribution, 0 past `num_generated`. Past the model's context, a sliding
  window, as `GPT2LM.generate`.
- `prefill` (the inputs of `generate`) -> the decoding state, named tensors
  `state_*` of `[B, ...]`; `decode_chunk(state_*, num_tokens int32 [B])` ->
  `token_ids int32 [B, num_tokens]` (each row's next new tokens, padding past
  its end), `logprobs`, `finished bool [B]` and the next `state_*`: a client
  streams by calling `decode_chunk` until every row is finished, and the
  chunks concatenated are the new tokens of `generate`. Within the model's
  context only.
- `generate_text(prompts string [B], max_new_tokens, temperature, top_k, top_p,
  seed, stop_token_ids, repetition_penalty, stop_strings string [B, S])` ->
  `completions string [B]`, `num_generated int32 [B]`: the tokenizer runs in
  the graph; each prompt is read as following an end of line, as in
  training; a row also stops at the tokenizer's end token, which is not
  detokenized, and at its `stop_strings` (`""` none): the completion is cut
  before the first one, `num_generated` counts the tokens up to the one that
  completed it.

Each version holds `assets.extra/tf_serving_warmup_requests`
(`pipelines.serving_warmup`), which TF Serving replays before serving it.

Every signature rejects bad requests with an error naming the value (ids
outside `[0, V)`, empty prompts, `lengths` of another batch, a NaN
temperature, a `max_new_tokens` past the export's limit, a setting with another
number of rows, ...): the checks of `keras_tfam.generation.prompt_checks`, as
graph assertions.

The word and character tokenizers use core TensorFlow ops only. The BPE
tokenizer needs the tensorflow-text ops, and a SavedModel holding one op a
server lacks cannot be loaded at all; so a BPE run's `<version>/` holds the
token-level signatures only (loadable by any TensorFlow), and
`generate_text` goes to a second model, `<export_dir>-text/<version>/`.

An imported checkpoint's tokenizer (`tfam train --init-from`) is exported the
same way: its `tokenizer.json` pipeline runs in the graph of
`<export_dir>-text/<version>/` (`pipelines.data.graph_tokenizer`, the ids and
text of transformers). Its files also go to `<version>/assets.extra/tokenizer/`
(where TF Serving allows extra files), for clients of the token-level
signatures (`keras_tfam.convert.HuggingFaceTokenizer` or transformers). A
pipeline without an exact graph version is exported with those two only,
and the export says why.
"""

import os
import re
import shutil
import tempfile

import tensorflow as tf

from keras_tfam.generation import GreedySampler, Sampling
from keras_tfam.generation.requests import resolve_drafter
from pipelines.errors import notice
from pipelines.faults import fault_point
from pipelines.files import fsync_directory, fsync_tree
from pipelines.run_lock import RunLock
from pipelines.served_decoding import DEFAULT_BATCH_SIZES
from pipelines.serving_functions import ROW_SETTINGS, ServingFunctions, resolve_max_new_tokens_limit
from pipelines.serving_warmup import write_warmup_requests

# Where an export carries an imported checkpoint's tokenizer files (TF Serving leaves `assets.extra` alone).
TOKENIZER_ASSETS = "assets.extra/tokenizer"


def core_ops_only(tokenizer):
    """Whether a tokenizer's graph uses core TensorFlow ops only (word, char)."""
    return tokenizer is None or tokenizer.kind in ("word", "char")


def resolve_version_dir(export_dir):
    """`export_dir` itself if its name is an integer, else `export_dir/<next integer>`."""
    export_dir = os.path.abspath(export_dir)
    if re.fullmatch(r"\d+", os.path.basename(export_dir)):
        return export_dir
    versions = [int(d) for d in os.listdir(export_dir) if d.isdigit()] if os.path.isdir(export_dir) else []
    return os.path.join(export_dir, str(max(versions, default=0) + 1))


def ensure_built(model):
    """Builds a subclassed model that was only used through `generate` (its own `call` never ran)."""
    if not model.built:
        model(tf.zeros((1, 2), tf.int32), training=False)


def _archive(model, tokenizer, text_signature=True, max_new_tokens_limit=None, **decoding):
    """`(root, signatures, warmup)`: a `tf.Module` holding the model's variables, each signature's one trace,
    and the options of its warmup requests (`pipelines.serving_warmup.warmup_inputs`).

    The model itself is not tracked (only its variables are), so the save
    traces nothing of it again; each signature is a concrete function traced
    here, which `tf.saved_model.save` writes as it is.
    """
    ensure_built(model)
    functions = ServingFunctions(model, tokenizer, max_new_tokens_limit, **decoding)
    signatures = {
        "serving_default": tf.function(
            functions.serving_default,
            input_signature=[tf.TensorSpec([None, None], tf.int32, name="token_ids")],
            autograph=False,
        ).get_concrete_function(),
    }
    signatures.update(
        generate=functions.generate_trace, prefill=functions.prefill_trace, decode_chunk=functions.decode_chunk_trace
    )
    resources = []
    if text_signature and tokenizer is not None:
        signatures["generate_text"] = tf.function(
            functions.generate_text,
            input_signature=[
                tf.TensorSpec([None], tf.string, name="prompts"),
                *ROW_SETTINGS.values(),
                tf.TensorSpec([None, None], tf.string, name="stop_strings"),
            ],
            autograph=False,
        ).get_concrete_function()
        # The tokenizer's lookup tables, which the text signature reads (as Keras' `ExportArchive` tracks them).
        resources = [
            trackable
            for trackable in tf.train.TrackableView(tokenizer).descendants()
            if isinstance(trackable, tf.saved_model.experimental.TrackableResource)
        ]
    served = functions.decoding
    warmup = dict(batch_sizes=served.batch_sizes or (1,), context=served.context, drafted=served.drafted)
    return _root(model, signatures, resources), signatures, warmup


def _root(model, signatures, tokenizer_resources=()):
    """The `tf.Module` a SavedModel of `signatures` (concrete functions) saves: their variables and the
    tokenizer's tables they read."""
    root = tf.Module()
    if tokenizer_resources:
        root.tokenizer_resources = list(tokenizer_resources)
    variables = {id(v): v for v in model.variables}
    for function in signatures.values():
        variables.update((id(v), v) for v in function.variables)
    root.model_variables = list(variables.values())
    for name, function in signatures.items():
        setattr(root, name, function)
    return root


def _token_level(model, archive):
    """`archive` (`_archive`) without `generate_text` and the tokenizer's tables: the same traces, so
    writing both SavedModels traces the signatures once."""
    _, signatures, warmup = archive
    signatures = {name: function for name, function in signatures.items() if name != "generate_text"}
    return _root(model, signatures), signatures, warmup


def text_export_dir(export_dir):
    """Where a BPE run's `generate_text` model goes: `<export_dir>-text`."""
    return os.path.abspath(export_dir).rstrip(os.sep) + "-text"


def export_model(
    model,
    export_dir,
    tokenizer=None,
    overwrite=False,
    max_new_tokens_limit=None,
    batch_sizes=DEFAULT_BATCH_SIZES,
    jit_compile=True,
    prompt_lookup_num_tokens=None,
    max_matching_ngram_size=None,
    draft_model=None,
    num_draft_tokens=None,
):
    """Writes the SavedModel to `export_dir` (TF Serving layout); returns the version path.

    `max_new_tokens_limit` bounds the `max_new_tokens` of a `generate`
    request (default: `DEFAULT_MAX_NEW_TOKENS`, or the model's context if
    longer); a larger request fails with a clear error before allocating.
    `batch_sizes` and `jit_compile`: how `generate` compiles its loop
    (`pipelines.served_decoding.ServedDecoding`). `prompt_lookup_num_tokens`
    and `max_matching_ngram_size`, or `draft_model` and `num_draft_tokens`:
    the served loop drafts as `generate` does with them, and gives the same
    outputs (the draft's weights are saved with the model's).

    A tokenizer whose graph needs ops outside core TensorFlow (BPE, an
    imported checkpoint's) gets its `generate_text` model written to
    `<export_dir>-text/<version>/` (with the token-level signatures too), and
    `<export_dir>/<version>/` keeps only the token-level signatures, loadable
    by any TensorFlow.
    """
    limit = resolve_max_new_tokens_limit(model, max_new_tokens_limit)
    drafter = resolve_drafter(
        model, Sampling(GreedySampler()), prompt_lookup_num_tokens, max_matching_ngram_size, draft_model,
        num_draft_tokens,
    )  # fmt: skip
    if draft_model is not None:
        ensure_built(draft_model)
    decoding = dict(batch_sizes=batch_sizes, jit_compile=jit_compile, drafter=drafter)
    planned = resolve_version_dir(export_dir)
    if os.path.exists(planned) and not overwrite:  # refused before the signatures are traced
        raise FileExistsError(f"Export {planned!r} exists already; pass --overwrite to replace it")
    files = None
    if tokenizer is not None and tokenizer.kind == "huggingface":
        files = {f"{TOKENIZER_ASSETS}/{os.path.basename(name)}": data for name, data in tokenizer.files().items()}
    if tokenizer is not None and not tokenizer.in_graph:
        notice(
            f"the tokenizer has no graph version ({tokenizer.not_in_graph}); the export serves token ids, "
            f"with the tokenizer's files in <version>/{TOKENIZER_ASSETS}/"
        )
        archive = _archive(model, tokenizer, text_signature=False, max_new_tokens_limit=limit, **decoding)
        return _export(archive, export_dir, overwrite, files)
    split_text = not core_ops_only(tokenizer)
    if split_text:
        text_planned = os.path.join(text_export_dir(os.path.dirname(planned)), os.path.basename(planned))
        if os.path.exists(text_planned) and not overwrite:
            raise FileExistsError(f"Export {text_planned!r} exists already; pass --overwrite to replace it")
    archive = _archive(model, tokenizer, max_new_tokens_limit=limit, **decoding)
    if not split_text:
        return _export(archive, export_dir, overwrite, files)
    target = _export(_token_level(model, archive), export_dir, overwrite, files)
    text_target = os.path.join(text_export_dir(os.path.dirname(target)), os.path.basename(target))
    _export(archive, text_target, overwrite)
    return target


def _export(archive, export_dir, overwrite, extra_files=None):
    """Writes one version of `archive` (`_archive`) under `export_dir`, holding the folder's export lock."""
    target = resolve_version_dir(export_dir)
    if os.path.exists(target) and not overwrite:
        raise FileExistsError(f"Export {target!r} exists already; pass --overwrite to replace it")
    parent = os.path.dirname(target)
    with RunLock(parent, name=".export.lock", remove_if_unused=False):
        _clean_killed_exports(parent)
        target = resolve_version_dir(export_dir)  # a version put back by the cleaning counts
        if os.path.exists(target) and not overwrite:
            raise FileExistsError(f"Export {target!r} exists already; pass --overwrite to replace it")
        _write_version(archive, target, extra_files)
    return target


def _readable_by_all(path):
    """Folders 0755, files 0644 under `path` (`mkdtemp` makes 0700; TF Serving may run as another user)."""
    os.chmod(path, 0o755)
    for root, folders, files in os.walk(path):
        for name in folders:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)


def save_archive(archive, path):
    """Writes `archive` (`_archive`) as a SavedModel at `path`, with TF Serving warmup requests."""
    root, signatures, warmup = archive
    tf.saved_model.save(root, path, signatures=signatures)
    write_warmup_requests(path, sorted(signatures), **warmup)


def _write_version(archive, target, extra_files=None):
    """Writes `archive` (and `extra_files`, `{relative path: bytes}`) to the version folder `target` through a
    staging folder, atomically."""
    parent, version = os.path.split(target)
    staging = tempfile.mkdtemp(prefix=".incomplete-", dir=parent)
    try:
        save_archive(archive, staging)
        for name, data in (extra_files or {}).items():
            path = os.path.join(staging, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
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
