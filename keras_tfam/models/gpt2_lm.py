"""GPT-2 (Radford et al. 2019): the decoder LM with its defaults, under the name checkpoints and configs use."""

import keras

from keras_tfam.models.decoder_lm import DecoderLM

__all__ = ["GPT2LM"]


@keras.saving.register_keras_serializable(package="keras_tfam")
class GPT2LM(DecoderLM):
    """A GPT-2 decoder LM: `DecoderLM` with its defaults (learned positions, LayerNorm, tanh GELU, tied head).

    Every `DecoderLM` argument is accepted; see `DecoderLM` for them.

    Args:
        vocabulary_size: token ids are in `[0, vocabulary_size)`.
        num_layers: decoder blocks.
        num_heads: attention heads.
        hidden_dim: width of the residual stream.
        **kwargs: the other arguments of `DecoderLM`, with GPT-2's defaults.

    Examples:
        >>> model = GPT2LM.from_preset("gpt2_tiny", vocabulary_size=8192)
        >>> model.generate([[464, 3290]], max_new_tokens=20).shape
        (1, 22)
    """
