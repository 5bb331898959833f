"""What the library needs of Keras that Keras has no public way for: one function each, with why.

Each has a test (`tests/test_keras_compat.py`) that fails when the Keras
behaviour it works around changes, so that it is deleted then.
"""

import keras


class FreesDeletedVariables:
    """Mixed into a layer before its Keras class: deleting a variable attribute (as `quantize` does with the float
    kernel) untracks it as Keras does, without the `gc.collect()` Keras' `Layer.__delattr__` runs each time.

    A variable is in no reference cycle: its buffer is freed with its last reference on every backend, so the
    collection only costs a pass over every object of the process, once per layer quantized.
    """

    def __delattr__(self, name):
        value = getattr(self, name, None)
        if isinstance(value, keras.Variable):
            self._untrack_variable(value)  # what Keras' `Layer.__delattr__` does, less its collection
            super(keras.layers.Layer, self).__delattr__(name)
        else:
            super().__delattr__(name)


def give_own_dtype_policy(layer, policy):
    """Gives `layer` `policy` in place of the `DTypePolicyMap` it holds (Keras' setter writes into the map)."""
    layer._dtype_policy = policy
