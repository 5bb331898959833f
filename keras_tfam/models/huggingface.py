"""`from_huggingface`: a model for any supported local Hugging Face checkpoint directory."""

from keras_tfam.models.checkpoint_loaders import checkpoint_loader


def from_huggingface(directory, **overrides):
    """The model of a local Hugging Face checkpoint directory, with its weights, exactly.

    Reads `config.json` and the safetensors weights (`model.safetensors`, or
    shards listed by `model.safetensors.index.json`; float32, float16 or
    bfloat16). `model_type` picks the model: `gpt2` and `gpt_neo` give a
    `GPT2LM`; `llama`, `mistral`, `qwen2` and `gemma` a `DecoderLM` with
    their conventions (see `keras_tfam.convert.huggingface_llama`). An
    unsupported `model_type` or rope scaling is refused in one line listing
    what is supported.

    Args:
        directory: the checkpoint directory (no download: local files only).
        **overrides: `DecoderLM` arguments replacing the config's, e.g.
            `dtype="bfloat16"` to keep a bfloat16 checkpoint in bfloat16.

    Examples:
        >>> model = from_huggingface("tests/fixtures/hf-llama-tiny")  # any local checkpoint directory
        >>> type(model).__name__, model.num_key_value_heads
        ('DecoderLM', 2)
        >>> model.generate([[0, 53, 259]], max_new_tokens=20).shape
        (1, 23)
    """
    return checkpoint_loader("huggingface")(directory, None, **overrides)
