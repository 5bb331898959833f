"""The transforms of the Hugging Face weight maps, each with its inverse, so one map serves import and export.

A weight map is `{checkpoint name: [(variable, transform or None), ...]}`:
importing applies each transform to the checkpoint's tensor to get the
variable's value; exporting (`stored_tensor`) rebuilds the tensor from the
variables' values.
"""

import numpy as np


def transpose(tensor):
    """PyTorch `nn.Linear` weights `[out, in]` <-> Keras `Dense` kernels `[in, out]` (its own inverse)."""
    return np.transpose(tensor)


class Columns:
    """Columns `[index * width, (index + 1) * width)` of a tensor: one of GPT-2's fused q/k/v parts.

    Args:
        index: which part.
        width: the columns of each part.
    """

    def __init__(self, index, width):
        self.index = index
        self.width = width

    def __call__(self, tensor):
        return tensor[..., self.index * self.width : (self.index + 1) * self.width]

    def __repr__(self):
        return f"Columns({self.index}, {self.width})"


def stored_shape(entries):
    """The shape of the checkpoint tensor of `[(variable, transform), ...]`, without reading the variables."""
    shapes = [tuple(variable.shape) for variable, _ in entries]
    if len(entries) == 1 and entries[0][1] is transpose:
        return shapes[0][::-1]
    if len(entries) > 1:
        return (*shapes[0][:-1], sum(shape[-1] for shape in shapes))
    return shapes[0]


def stored_tensor(entries, value_of):
    """The checkpoint tensor of a weight map's `[(variable, transform), ...]`, from `value_of(variable)`."""
    transforms = [transform for _, transform in entries]
    values = [value_of(variable) for variable, _ in entries]
    if len(entries) == 1 and transforms[0] is None:
        return values[0]
    if len(entries) == 1 and transforms[0] is transpose:
        return transpose(values[0])
    if all(isinstance(t, Columns) for t in transforms) and [t.index for t in transforms] == list(range(len(entries))):
        return np.concatenate(values, axis=-1)
    raise ValueError(f"A weight map entry has no inverse: transforms {transforms} (expected None, transpose, Columns)")
