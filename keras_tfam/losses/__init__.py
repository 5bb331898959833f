"""Losses: the language-model loss over the logits in one pass."""

from keras_tfam.losses.token_cross_entropy import TokenCrossEntropy

__all__ = ["TokenCrossEntropy"]
