"""Hugging Face checkpoints by `model_type`: what `GPT2LM.from_huggingface` loads."""

from keras_tfam.convert.huggingface_gpt2 import load_huggingface_gpt2, read_config
from keras_tfam.convert.huggingface_gpt_neo import load_huggingface_gpt_neo
from keras_tfam.models.checkpoint_loaders import register_checkpoint_loader

LOADERS = {"gpt2": load_huggingface_gpt2, "gpt_neo": load_huggingface_gpt_neo}


@register_checkpoint_loader("huggingface")
def load_huggingface(directory, cls, **overrides):
    """`cls` built from the Hugging Face directory's `config.json` (its `model_type`) with its weights."""
    model_type = read_config(directory, None).get("model_type", "gpt2")
    if model_type not in LOADERS:
        raise ValueError(
            f"Unsupported Hugging Face checkpoint: supported model types are {tuple(LOADERS)}. "
            f"Received: model_type={model_type!r}"
        )
    return LOADERS[model_type](directory, cls, **overrides)
