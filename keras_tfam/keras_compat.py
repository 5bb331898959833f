"""What the library needs of Keras that Keras has no public way for: one function each, with why.

Each has a test (`tests/test_keras_compat.py`) that fails when the Keras
behaviour it works around changes, so that it is deleted then.
"""

import keras
import numpy as np


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


class SavesQuantizedLora:
    """Mixed into a layer before its Keras class: a quantized layer with LoRA factors saves its quantized weights
    and the factors as they are, and loading them enables LoRA on the layer, so the model loads bit for bit.

    Keras saves such a layer with the factors merged into its weights and quantized again (`W + (alpha / rank) A B`
    rounded to int8), which is another model than the one in memory (`q(W) x + (alpha / rank) x A B`). A float
    layer with factors is left to Keras (the merged weight, within float rounding of the model).
    """

    def save_own_variables(self, store):
        if not (self.quantization_mode and getattr(self, "lora_enabled", False)):
            return super().save_own_variables(store)
        for variable in self.weights:  # each by its name: kernel, kernel_scale, lora_kernel_a, ...
            store[variable.name] = keras.ops.convert_to_numpy(variable)
        store["lora_alpha"] = np.asarray(float(self.lora_alpha))
        return None

    def load_own_variables(self, store):
        if "lora_alpha" not in store:
            return super().load_own_variables(store)
        factors = sorted(key for key in store.keys() if key.startswith("lora_") and key != "lora_alpha")
        if not getattr(self, "lora_enabled", False):
            self.enable_lora(int(store[factors[0]].shape[-1]), lora_alpha=float(store["lora_alpha"][()]))
        variables = {variable.name: variable for variable in self.weights}
        if set(variables) != set(store.keys()) - {"lora_alpha"}:
            raise ValueError(
                f"Layer {self.name!r} holds the variables {sorted(variables)}; the file has "
                f"{sorted(set(store.keys()) - {'lora_alpha'})}"
            )
        for name, variable in variables.items():
            variable.assign(store[name])
        return None
