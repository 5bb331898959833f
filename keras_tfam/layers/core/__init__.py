from keras_tfam.layers.core.dense import Dense
