"""Models assembled from keras_tfam layers."""

from keras_tfam.models.attention_pooling_lm import AttentionPoolingLM
from keras_tfam.models.decision_transformer import DecisionTransformer
from keras_tfam.models.decoder_lm import DecoderLM
from keras_tfam.models.early_exit_calibration import grid_search_threshold, learn_then_test
from keras_tfam.models.early_exit_lm import EarlyExitLM
from keras_tfam.models.gpt2_lm import GPT2LM
from keras_tfam.models.gpt2_presets import GPT2_PRESETS
from keras_tfam.models.huggingface import from_huggingface
from keras_tfam.models.knn_lm import KNNLM
from keras_tfam.models.preset_directory import load_preset
from keras_tfam.models.transformer import Transformer
from keras_tfam.models.transformer_xl_lm import TransformerXLLM
from keras_tfam.models.transformer_xl_presets import TRANSFORMER_XL_PRESETS

__all__ = [
    "AttentionPoolingLM",
    "DecisionTransformer",
    "DecoderLM",
    "EarlyExitLM",
    "GPT2LM",
    "GPT2_PRESETS",
    "KNNLM",
    "TRANSFORMER_XL_PRESETS",
    "Transformer",
    "TransformerXLLM",
    "from_huggingface",
    "grid_search_threshold",
    "learn_then_test",
    "load_preset",
]
