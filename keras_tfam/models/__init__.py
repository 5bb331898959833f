"""Models assembled from keras_tfam layers."""

from keras_tfam.models.attention_pooling_lm import AttentionPoolingLM
from keras_tfam.models.gpt2_lm import GPT2LM
from keras_tfam.models.gpt2_presets import GPT2_PRESETS
from keras_tfam.models.transformer import Transformer
from keras_tfam.models.transformer_xl_lm import TransformerXLLM
from keras_tfam.models.transformer_xl_presets import TRANSFORMER_XL_PRESETS

__all__ = ["AttentionPoolingLM", "GPT2LM", "GPT2_PRESETS", "TRANSFORMER_XL_PRESETS", "Transformer", "TransformerXLLM"]
