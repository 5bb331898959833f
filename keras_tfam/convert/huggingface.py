"""Hugging Face checkpoints by `model_type`: what `keras_tfam.models.from_huggingface` and
`DecoderLM.from_huggingface` load."""

import os

from keras_tfam.convert.huggingface_gpt2 import load_huggingface_gpt2, read_config
from keras_tfam.convert.huggingface_gpt_neo import load_huggingface_gpt_neo
from keras_tfam.convert.huggingface_llama import MODEL_TYPES, load_huggingface_llama
from keras_tfam.models.checkpoint_loaders import register_checkpoint_loader
from keras_tfam.models.gpt2_lm import GPT2LM

# The keys of a GPT-2 config (the original checkpoints' name no `model_type`).
GPT2_KEYS = ("n_embd", "n_layer", "n_head")
LOADERS = {
    "gpt2": load_huggingface_gpt2,
    "gpt_neo": load_huggingface_gpt_neo,
    **{model_type: load_huggingface_llama for model_type in MODEL_TYPES},
}


@register_checkpoint_loader("huggingface")
def load_huggingface(directory, cls=None, **overrides):
    """The model of the Hugging Face directory's `config.json` (its `model_type`) with its weights.

    `cls` is the class to build; `None` picks the family's: `GPT2LM` for
    GPT-2 and GPT-Neo, `DecoderLM` for the Llama family. A config without
    `model_type` is read as GPT-2's when it has GPT-2's keys (as the original
    GPT-2 checkpoints' do), and refused otherwise.
    """
    config = read_config(directory, None)
    model_type = config.get("model_type")
    if model_type is None and all(key in config for key in GPT2_KEYS):
        model_type = "gpt2"  # the original GPT-2 checkpoints' configs name no model type
    elif model_type is None:
        raise ValueError(
            f"{os.path.join(directory, 'config.json')} has no `model_type`: set it to the checkpoint's, "
            f"one of the supported {tuple(LOADERS)}"
        )
    if model_type not in LOADERS:
        raise ValueError(
            f"Unsupported Hugging Face checkpoint: supported model types are {tuple(LOADERS)}. "
            f"Received: model_type={model_type!r}"
        )
    if cls is None and model_type in ("gpt2", "gpt_neo"):
        cls = GPT2LM
    return LOADERS[model_type](directory, cls, **overrides)
