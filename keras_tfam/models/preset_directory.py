"""Presets as local directories: a trained model with its config, weights and tokenizer, shared as keras-hub
shares its presets.

A preset directory holds

- `config.json`: the model, serialized by Keras (class and constructor
  arguments, quantization policies included);
- `model.weights.h5`: its weights (LoRA factors merged, as Keras saves them);
- `metadata.json`: what wrote it (`keras_tfam`, Keras and backend versions)
  and the parameter count;
- the tokenizer's own files when one is given (`tokenizer.json` or
  `tokenizer.model`, `tokenizer_config.json`), so the directory is also a
  tokenizer directory for `keras_tfam.convert.HuggingFaceTokenizer`.

Local directories only: nothing is downloaded.
"""

import importlib.metadata
import json
import os

import keras

CONFIG = "config.json"
WEIGHTS = "model.weights.h5"
METADATA = "metadata.json"


class PresetMixin:
    """`save_to_preset(directory, tokenizer=None)` on every model of the library."""

    def save_to_preset(self, directory, tokenizer=None):
        """Writes the model (and `tokenizer`, if given) as a preset directory; `load_preset` reads it back.

        Args:
            directory: the directory (created if needed; its preset files are
                replaced).
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
        with open(os.path.join(directory, CONFIG), "w", encoding="utf-8") as f:
            json.dump(keras.saving.serialize_keras_object(self), f, indent=2)
        self.save_weights(os.path.join(directory, WEIGHTS), overwrite=True)
        metadata = {
            "keras_tfam_version": _version(),
            "keras_version": keras.__version__,
            "backend": keras.backend.backend(),
            "class": type(self).__name__,
            "parameter_count": int(self.count_params()),
        }
        if tokenizer is not None:
            tokenizer.save_to_preset(directory)
        # Written last: a directory with metadata.json is a complete preset.
        with open(os.path.join(directory, METADATA), "w", encoding="utf-8") as f:
            json.dump(metadata, f, indent=2)


def _version():
    try:
        return importlib.metadata.version("keras_tfam")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree without installing
        return None


def is_preset_directory(path):
    """Whether `path` is a directory written by `save_to_preset`."""
    return isinstance(path, str) and os.path.isfile(os.path.join(path, METADATA))


def load_preset(directory, cls=None, **overrides):
    """The model of a preset directory written by `save_to_preset`, with its weights.

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
    model.load_weights(os.path.join(directory, WEIGHTS))
    return model
