"""Checkpoints: Hugging Face import and export (GPT-2, GPT-Neo, Llama, Mistral, Qwen2, Gemma, with their
tokenizers), and keras-hub import; each loader registers with the models."""

from keras_tfam.convert import huggingface, keras_hub_gpt2  # noqa: F401 (registers the loaders)
from keras_tfam.convert.huggingface_export import save_to_huggingface
from keras_tfam.convert.huggingface_tokenizer import HuggingFaceTokenizer
from keras_tfam.convert.safetensors_checkpoint import SafetensorsCheckpoint

__all__ = ["HuggingFaceTokenizer", "SafetensorsCheckpoint", "save_to_huggingface"]
