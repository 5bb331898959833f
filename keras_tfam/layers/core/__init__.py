from keras_tfam.layers.core.dense import Dense

__all__ = ["Dense"]
