"""TensorFlow-specific pipelines: data, training, export and the `tfam` CLI."""
