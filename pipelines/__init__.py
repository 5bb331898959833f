"""TensorFlow-specific pipelines: data, training, export and the `tfam` CLI.

Importing them changes nothing in the process; the `tfam` command line calls `keras_tfam.cpu.configure()`
first (pooled tensor memory), and a program driving the pipelines itself may do the same.
"""
