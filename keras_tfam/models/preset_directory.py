"""Presets as local directories: a trained model with its config, weights and tokenizer, shared as keras-hub
shares its presets.

A preset directory holds

- `config.json`: the model, serialized by Keras (class and constructor
  arguments, quantization policies included);
- `model.weights.h5`: its weights (LoRA factors merged, as Keras saves them,
  except in quantized layers, which keep them: see `keras_tfam.models.lora`);
- `metadata.json`: what wrote it (`keras_tfam`, Keras and backend versions)
  and the parameter count;
- the tokenizer's own files when one is given (`tokenizer.json` or
  `tokenizer.model`, `tokenizer_config.json`), so the directory is also a
  tokenizer directory for `keras_tfam.convert.HuggingFaceTokenizer`.

`metadata.json` lists the files the preset consists of: saving again over a
preset removes those of its files (and any tokenizer file) the new preset does
not write, so the directory never pairs a model with another one's tokenizer.

Local directories only: nothing is downloaded.
"""

import importlib.metadata
import json
import os
import shutil
import tempfile

import keras
import numpy as np

CONFIG = "config.json"
WEIGHTS = "model.weights.h5"
METADATA = "metadata.json"
# The files of a tokenizer directory (`keras_tfam.convert.HuggingFaceTokenizer` copies these).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json")


class PresetMixin:
    """`save_to_preset(directory, tokenizer=None)` on every model of the library."""

    def save_to_preset(self, directory, tokenizer=None):
        """Writes the model (and `tokenizer`, if given) as a preset directory; `load_preset` reads it back.

        Args:
            directory: the directory (created if needed). The files of a
                preset saved there before, tokenizer files included, are
                replaced or removed; other files are left alone.
            tokenizer: a tokenizer with `save_to_preset(directory)`, such as
                `keras_tfam.convert.HuggingFaceTokenizer`, or `None`.
        """
        if tokenizer is not None and not callable(getattr(tokenizer, "save_to_preset", None)):
            raise ValueError(
                "`tokenizer` must have a save_to_preset(directory) method (e.g. a HuggingFaceTokenizer). "
                f"Received: tokenizer of type {type(tokenizer).__name__}"
            )
        if not self.built:
            raise ValueError(f"Build the {type(self).__name__} (call it once) before saving it as a preset")
        os.makedirs(directory, exist_ok=True)
        previous = _preset_files(directory)
        # Written beside the directory first: a tokenizer read from `directory` itself still finds its files.
        staging = tempfile.mkdtemp(prefix=".preset-", dir=os.path.dirname(os.path.abspath(directory)))
        try:
            with open(os.path.join(staging, CONFIG), "w", encoding="utf-8") as f:
                json.dump(keras.saving.serialize_keras_object(self), f, indent=2)
            self.save_weights(os.path.join(staging, WEIGHTS), overwrite=True)
            if tokenizer is not None:
                tokenizer.save_to_preset(staging)
            files = sorted(name for name in os.listdir(staging) if os.path.isfile(os.path.join(staging, name)))
            for name in {METADATA, *previous, *TOKENIZER_FILES} - set(files):
                if os.path.isfile(os.path.join(directory, name)):
                    os.remove(os.path.join(directory, name))
            for name in files:
                os.replace(os.path.join(staging, name), os.path.join(directory, name))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        metadata = {
            "keras_tfam_version": _version(),
            "keras_version": keras.__version__,
            "backend": keras.backend.backend(),
            "class": type(self).__name__,
            "parameter_count": int(self.count_params()),
            "files": [*files, METADATA],
        }
        # Written last: a directory with metadata.json is a complete preset.
        with open(os.path.join(directory, METADATA), "w", encoding="utf-8") as f:
            json.dump(metadata, f, indent=2)


def _version():
    try:
        return importlib.metadata.version("keras_tfam")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree without installing
        return None


def _preset_files(directory):
    """The files `metadata.json` in `directory` lists as its preset's (none if it lists none)."""
    try:
        with open(os.path.join(directory, METADATA), encoding="utf-8") as f:
            files = json.load(f).get("files", [])
    except (OSError, ValueError, AttributeError):
        return set()
    # Names only: a listed path never reaches outside the directory.
    return {name for name in files if isinstance(name, str) and name == os.path.basename(name)}


def names_directory(name):
    """Whether a `from_preset` name is a directory (a `str` or a path): one `load_preset` reads, or refuses
    naming what it lacks."""
    return isinstance(name, (str, os.PathLike)) and os.path.isdir(name)


def load_preset(directory, cls=None, **overrides):
    """The model of a preset directory written by `save_to_preset`, with its weights.

    A weights file that cannot be read into the config's model, or that holds
    a NaN or an infinity, is refused in one line naming the file.

    Args:
        directory: the preset directory.
        cls: the class the model must be an instance of, or `None`.
        **overrides: refused (a preset directory is loaded as it was saved);
            accepted here so that `from_preset(name, **overrides)` can pass
            them on and get the error.

    Examples:
        >>> import tempfile
        >>> model = from_huggingface("tests/fixtures/hf-llama-tiny")
        >>> tokenizer = HuggingFaceTokenizer("tests/fixtures/hf-llama-tiny")
        >>> directory = tempfile.mkdtemp()
        >>> model.save_to_preset(directory, tokenizer=tokenizer)  # fine-tuned weights, config, tokenizer files
        >>> loaded = load_preset(directory)
        >>> type(loaded).__name__, HuggingFaceTokenizer(directory).encode("The game") == tokenizer.encode("The game")
        ('DecoderLM', True)
    """
    if overrides:
        raise ValueError(
            f"A preset directory is loaded as it was saved; it takes no overrides. Received: {sorted(overrides)}"
        )
    for name in (METADATA, CONFIG, WEIGHTS):
        if not os.path.isfile(os.path.join(directory, name)):
            raise FileNotFoundError(
                f"No {name} in {directory!r}: not a preset directory written by save_to_preset "
                f"(found: {sorted(os.listdir(directory)) if os.path.isdir(directory) else 'no such directory'})"
            )
    with open(os.path.join(directory, CONFIG), encoding="utf-8") as f:
        try:
            config = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{os.path.join(directory, CONFIG)} is not valid JSON ({error})") from None
    model = keras.saving.deserialize_keras_object(config)
    if cls is not None and not isinstance(model, cls):
        raise ValueError(f"The preset in {directory!r} holds a {type(model).__name__}, not a {cls.__name__}")
    weights = os.path.join(directory, WEIGHTS)
    try:
        model.load_weights(weights)
    except (OSError, ValueError, KeyError, TypeError) as error:  # h5py's OSError, Keras' ValueError
        reason = " ".join(str(error).split())
        raise ValueError(
            f"{weights} cannot be loaded into the {type(model).__name__} of {CONFIG} (a truncated file, or "
            f"another model's weights?): {reason[:300]}"
        ) from None
    # Keras loads the weights of a larger model's file silently (the extra layers are left unread).
    stored, expected = _array_count(weights), len([v for v in model.weights if not _is_lora_factor(v)])
    if stored != expected:
        raise ValueError(
            f"{weights} holds {stored} arrays, the {type(model).__name__} of {CONFIG} has {expected} weights: "
            "another model's weights file"
        )
    for variable in model.weights:
        value = keras.ops.convert_to_numpy(variable)
        value = value.astype(np.float32) if value.dtype.name == "bfloat16" else value
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise ValueError(
                f"{weights} holds NaN or infinite values in {variable.path}: the preset is damaged; save it again"
            )
    return model


def _is_lora_factor(variable):
    # LoRA factors are merged into their kernel when saved (Keras' `save_own_variables`).
    return variable.path.rsplit("/", 1)[-1].startswith("lora_")


def _array_count(path):
    """How many arrays of the model's layers and its own the Keras weights file `path` holds (not the optimizer's,
    nor LoRA factors)."""
    import h5py  # a dependency of Keras, needed only here

    found = []
    with h5py.File(path, "r") as f:
        for group in ("layers", "vars"):
            if isinstance(f.get(group), h5py.Group):
                f[group].visititems(lambda name, item: found.append(name) if isinstance(item, h5py.Dataset) else None)
    # A quantized layer's LoRA factors (and their scale), saved as they are, are made by loading them.
    return len([name for name in found if not name.rsplit("/", 1)[-1].startswith("lora_")])
