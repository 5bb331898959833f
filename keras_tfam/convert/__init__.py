"""Checkpoint import: Hugging Face (GPT-2, GPT-Neo, Llama, Mistral, Qwen2, Gemma, with their tokenizers) and
keras-hub; each loader registers with the models."""

from keras_tfam.convert import huggingface, keras_hub_gpt2  # noqa: F401 (registers the loaders)
from keras_tfam.convert.huggingface_tokenizer import HuggingFaceTokenizer
from keras_tfam.convert.safetensors_checkpoint import SafetensorsCheckpoint

__all__ = ["HuggingFaceTokenizer", "SafetensorsCheckpoint"]
