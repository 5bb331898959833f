"""Rows written into a variable in place: the library's third backend-specific spot (with the compiler
choice in `generation/generator.py` and the VJP in `ops/autodiff.py`).

Streaming a large table into a variable (a kNN datastore's keys) must not hold a second copy of it:
Keras' `assign` takes the whole new value. Each backend's own module is imported inside its branch.
"""

import keras
import numpy as np
from keras import ops


def write_rows(variable, start, rows):
    """Writes `rows` over `variable[start : start + len(rows)]`, in place where the backend allows it.

    TensorFlow (a strided-slice assignment on the resource, which does not
    read the variable first, so its buffer is not copied on write) and
    PyTorch write into the variable's own buffer; JAX arrays are immutable,
    and a variable mirrored by a `tf.distribute` strategy has several
    buffers, so there the variable is assigned whole, around the new rows.
    """
    rows = np.asarray(rows, keras.backend.standardize_dtype(variable.dtype))
    end = start + len(rows)
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf  # the backend Keras already runs on

        if not isinstance(variable.value, tf.distribute.DistributedValues):
            rank = len(variable.shape)
            tf.raw_ops.ResourceStridedSliceAssign(
                ref=variable.value.handle,
                begin=[start] + [0] * (rank - 1),
                end=[end] + list(variable.shape[1:]),
                strides=[1] * rank,
                value=rows,
            )
            return
    elif backend == "torch":
        import torch

        with torch.no_grad():
            variable.value[start:end] = torch.as_tensor(rows, device=variable.value.device)
        return
    variable.assign(ops.slice_update(variable.value, [start] + [0] * (len(variable.shape) - 1), rows))
