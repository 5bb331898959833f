"""Checkpoint import: Hugging Face (GPT-2, GPT-Neo) and keras-hub; each loader registers with the models."""

from keras_tfam.convert import huggingface, keras_hub_gpt2  # noqa: F401 (registers the loaders)
