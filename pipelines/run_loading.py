"""What `tfam eval`, `generate` and `export` load: a run's checkpoint and tokenizer, checked against each other.

A run is its directory (`RUN`, whose `best` or `final` checkpoint is
loaded) or one of its checkpoints (`RUN/checkpoints/final.keras`), whose
tokenizer is the run's above it. A `.keras` file elsewhere has no tokenizer:
`tfam export` serves its token ids, `eval` and `generate` refuse it.
"""

import os

from pipelines.errors import CorruptFileError, notice


def run_directory(path):
    """The run directory of `path`: itself, the run above a `.keras` file in its `checkpoints/`, or None."""
    if os.path.isdir(path):
        return path
    folder = os.path.dirname(os.path.abspath(path))
    return os.path.dirname(folder) if os.path.basename(folder) == "checkpoints" else None


def _checkpoint_paths(run, checkpoint):
    """The checkpoints to try in turn: the `.keras` file `run`, or the run's `best` (then `final`) or `final`."""
    if os.path.isfile(run):
        if not run.endswith(".keras"):
            raise ValueError(f"`run` must be a run directory of `tfam train` or a .keras file. Received: run={run!r}")
        return [run]
    if not os.path.isdir(run):
        raise FileNotFoundError(f"No run directory or .keras file {run!r}")
    names = ["best", "final"] if checkpoint == "best" else [checkpoint]
    paths = [os.path.join(run, "checkpoints", f"{name}.keras") for name in names]
    paths = [path for path in paths if os.path.isfile(path)]
    if not paths:
        raise FileNotFoundError(f"No checkpoint {names} in {os.path.join(run, 'checkpoints')!r}")
    return paths


def _run_tokenizer(run, run_dir, needs_tokenizer):
    """The tokenizer in `run_dir/tokenizer/`; None, or with `needs_tokenizer` an error saying what to pass."""
    from pipelines.data.tokenizers import load_tokenizer

    folder = os.path.join(run_dir, "tokenizer") if run_dir is not None else None
    if folder is not None and os.path.isdir(folder):
        return load_tokenizer(folder)
    if not needs_tokenizer:
        return None
    if os.path.isdir(run):
        raise FileNotFoundError(f"{run!r} has no tokenizer/ folder: pass the run directory of `tfam train`")
    raise FileNotFoundError(
        f"{run!r} has no tokenizer: pass a run directory of `tfam train` (holding tokenizer/ and checkpoints/), "
        "or a .keras file in its checkpoints/ folder"
    )


def load_for_inference(path):
    """`(model, sidecar record)` of the checkpoint at `path`, verified first, without its optimizer (as
    `load_checkpoint(path, compile=False)`)."""
    from pipelines.checkpoints import load_verified_checkpoint, verify_checkpoint

    record = verify_checkpoint(path)
    return load_verified_checkpoint(path, compile=False), record


def check_language_model(path, model):
    """Raises a `ValueError` unless `model` is a language model: a decoding model of one vocabulary."""
    from keras_tfam.generation import DecodingModel

    if not isinstance(model, DecodingModel) or model.output_vocabulary_size is not None:
        raise ValueError(
            f"`run` must hold a language model of keras_tfam (a decoding model of one vocabulary, as GPT2LM or "
            f"DecoderLM). Received: {path!r}, a {type(model).__name__}"
        )


def check_vocabulary(path, model, tokenizer, tokenizer_dir):
    """Raises a `ValueError` unless the model's ids are the tokenizer's.

    A run's own tokenizer has exactly the model's vocabulary; an imported
    checkpoint's (`huggingface`) may have fewer ids than its model, whose
    table can be padded.
    """
    model_size, tokenizer_size = model.vocabulary_size, tokenizer.vocabulary_size
    fits = model_size >= tokenizer_size if tokenizer.kind == "huggingface" else model_size == tokenizer_size
    if not fits:
        raise ValueError(
            f"{path} is not a checkpoint of this run's vocabulary: its model has {model_size} ids and the tokenizer "
            f"in {tokenizer_dir} has {tokenizer_size}. Received: vocabulary_size={model_size} (model), "
            f"{tokenizer_size} (tokenizer)"
        )


def _training_notice(run_dir, path, record):
    """One line on stderr when the checkpoint may not be the run's last: it is still training, or was stopped."""
    from pipelines.run_lock import describe_holder, lock_holder

    step = record.get("step")
    loaded = f"using {os.path.basename(path)}, " + (f"of step {step}" if step is not None else "its step not recorded")
    holder = lock_holder(run_dir)
    if holder is not None:
        notice(f"{run_dir} is still training ({describe_holder(holder)}): {loaded}")
    elif not os.path.isfile(os.path.join(run_dir, "checkpoints", "final.keras")):
        notice(
            f"{run_dir} has no final checkpoint (its training stopped before the end; rerun its `tfam train` to "
            f"resume): {loaded}"
        )


def load_run(run, checkpoint="best", needs_tokenizer=False):
    """The model (`best` or `final` checkpoint, or a `.keras` file) and tokenizer of a run.

    Each checkpoint is verified before it is loaded; a damaged `best.keras`
    falls back to `final.keras` with a notice. A checkpoint of a run that is
    still training, or that has no final checkpoint, is loaded with a notice
    giving its step.

    Args:
        run: a run directory, or a `.keras` file (in a run's `checkpoints/`,
            its tokenizer is the run's).
        checkpoint: `best` (falls back to `final`) or `final`.
        needs_tokenizer: refuse a run without a tokenizer instead of
            returning None for it.

    Raises:
        FileNotFoundError: no such run, no checkpoint in it, or no tokenizer
            where `needs_tokenizer`.
        ValueError: the checkpoint is not a language model, or not of the
            tokenizer's vocabulary.
        CorruptFileError: no intact checkpoint, or a damaged tokenizer.
    """
    paths = _checkpoint_paths(run, checkpoint)
    run_dir = run_directory(run)
    tokenizer = _run_tokenizer(run, run_dir, needs_tokenizer)
    for index, path in enumerate(paths):
        try:
            model, record = load_for_inference(path)
            break
        except CorruptFileError as error:
            if index + 1 == len(paths):
                raise
            notice(f"{error}: using {os.path.basename(paths[index + 1])} instead")
    check_language_model(path, model)
    if tokenizer is not None:
        check_vocabulary(path, model, tokenizer, os.path.join(run_dir, "tokenizer"))
    if run_dir is not None and os.path.isfile(os.path.join(run_dir, "config.json")):  # a run of `tfam train`
        _training_notice(run_dir, path, record)
    return model, tokenizer
