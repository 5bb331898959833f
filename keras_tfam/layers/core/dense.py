"""Keras' `Dense`, with the one-row products of decoding kept fast by XLA's CPU backend."""

import keras
import numpy as np
from keras import ops
from keras import quantizers

from keras_tfam.utils import (
    FreesDeletedVariables,
    columns_product,
    is_single_row,
    kernel_rows,
    one_row_by_rows,
    register_row_kernel,
    rows_product,
    takes_bfloat16_rows_product,
    takes_columns_product,
    takes_int8_rows_product,
    takes_one_row_by_rows,
)


@keras.saving.register_keras_serializable(package="keras_tfam")
class Dense(FreesDeletedVariables, keras.layers.Dense):
    """Keras' `Dense` layer, whose one-row products stay fast on a CPU, in float32 and in int8.

    Decoding one sequence multiplies a single row by every weight matrix, a
    matrix-vector product that XLA's CPU backend treats apart:

    - **float32.** XLA fuses `matmul + bias` into one "output fusion" exactly
      when the product has one row, and emits that fusion as a
      single-threaded loop: GPT-2 small's per-token products then read their
      weights at 12-15 GB/s instead of the 19-23 GB/s of the unfused,
      multithreaded product on 2 cores (`BENCHMARKS.md`, batch-1 decoding:
      +30% tokens/s). So for a one-row input this layer adds the bias as
      `x - (-bias)`, which XLA does not output-fuse. Negation is exact, so
      the result is bit-identical to `x + bias`. Inside
      `keras_tfam.utils.kernels_as_rows` (the generator's decoding loop, under
      TensorFlow) the row is multiplied by the kernel's rows, copied once
      before the loop, as `rows @ x` (`keras_tfam.utils.one_row_by_rows`):
      GPT-2 small's batch-1 step is 6-10% faster than over the `(K, N)`
      kernel (`BENCHMARKS.md`). The same sums, in another order.
    - **int8** (`quantize("int8")`, Keras' per-output-channel scales). The
      int8 kernel is kept as rows, `(units, input_dim)`, and a one-row input
      is multiplied by it in float with `keras_tfam.utils.rows_product`,
      which XLA reads one byte per weight; Keras' int8 product is converted
      to int32 weights by XLA, four bytes per weight. The activations are
      quantized as Keras does (per row, unless the config says not to), so
      the integer sums are those of Keras' int8 product: exact in float32
      up to `input_dim` 1040, and within float32 rounding of them beyond.
      Saved files, `kernel`, LoRA and the merge on save are Keras' own
      `(input_dim, units)` layout: only the variable in memory is transposed.
    - **bfloat16** (a bfloat16 dtype policy, as `generation.with_dtype`
      makes). XLA multiplies float32 copies of bfloat16 weights. Where it
      pays on this CPU (`keras_tfam.cpu.bfloat16_rows_pay`), a one-row input
      is multiplied by the kernel's rows widened by their bits
      (`keras_tfam.utils.rows_product`), two bytes per weight: the kernel
      transposed once per compiled call (XLA hoists it out of a decoding
      loop), then read as rows. The product is float32, as XLA's.
    - **A few rows** (2 to 64: decoding a batch, or beams). XLA's CPU
      product of `x (M, K)` by the `(K, N)` kernel reads it at about half the
      speed of the product of the kernel's rows `(N, K)` by `x^T`. Inside
      `keras_tfam.utils.kernels_as_rows` (the generator's decoding loop) the
      kernel is transposed once before the loop, and the layer computes
      `(rows @ x^T + bias)^T` (`keras_tfam.utils.columns_product`): the same
      sums, in another order (within float32 rounding of Keras' product). A
      bfloat16 or float16 kernel is copied to float32 rows, in place of the
      float32 copy XLA's own 16-bit product makes, and the product is
      rounded to the layer's dtype before the bias, as Keras' is.

    More rows take Keras' own computation, on the same variables.

    Args:
        units: output width.
        **kwargs: every other argument of `keras.layers.Dense`
            (`activation`, `use_bias`, initializers, `lora_rank`, `dtype`, ...).

    Examples:
        >>> layer = Dense(4, bias_initializer="ones")
        >>> x = keras.ops.ones((1, 1, 3))
        >>> bool(keras.ops.all(layer(x) == keras.ops.matmul(x, layer.kernel) + layer.bias))
        True
    """

    def build(self, input_shape):
        super().build(input_shape)
        if getattr(self, "_kernel", None) is not None:
            register_row_kernel(self._kernel)  # `kernels_as_rows` may transpose it (float kernels; see `call`)

    def call(self, inputs, training=None):
        rows = kernel_rows(self._kernel)
        plain = rows is not None and self.quantization_mode is None and not self.lora_enabled
        if plain and takes_columns_product(inputs, self._kernel):
            return self._activate(columns_product(inputs, rows, self.bias))
        if takes_bfloat16_rows_product(inputs, self._kernel):
            x = rows_product(inputs, ops.transpose(self.kernel), self.compute_dtype)
            return self._activate(x if self.bias is None else ops.add(x, self.bias))
        if plain and takes_one_row_by_rows(inputs, self._kernel):
            x = one_row_by_rows(inputs, rows)
        elif self.bias is not None and is_single_row(inputs):
            x = ops.matmul(inputs, self.kernel)
        else:
            return super().call(inputs, training=training)
        # One row: the bias added as `x - (-bias)`, which XLA does not output-fuse (see above).
        return self._activate(x if self.bias is None else ops.subtract(x, ops.negative(self.bias)))

    def _activate(self, x):
        return x if self.activation is None else self.activation(x)

    # int8: Keras' quantization, its kernel stored as rows `(units, input_dim)`.

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras refuses subclasses unless they opt in. int8 is Keras' own quantization (its default
        # quantizer, its policy), the kernel stored transposed.
        if mode != "int8":
            return super().quantize(mode, type_check=False, config=config)
        self.quantization_config = config
        quantizer = quantizers.QuantizationConfig.weight_quantizer_or_default(
            config, quantizers.AbsMaxQuantizer(axis=0)
        )
        columns, scale = quantizer(self._kernel, to_numpy=True)
        del self._kernel
        self.quantized_build(tuple(columns.shape), mode, config)
        self._kernel.assign(ops.transpose(columns))
        self.kernel_scale.assign(ops.squeeze(scale, axis=0))
        if self.dtype_policy.quantization_mode is None:
            self.dtype_policy = keras.dtype_policies.get(f"int8_from_{self.dtype_policy.name}")

    def _int8_build(self, kernel_shape, config=None):
        # Keras' `_int8_build` uses `kernel_shape` for `_kernel` only: rows `(units, input_dim)`.
        super()._int8_build(tuple(reversed(kernel_shape)), config)

    @property
    def kernel(self):
        if not (self.built and self.quantization_mode == "int8"):
            return super().kernel
        kernel = ops.transpose(self._kernel)
        if self.lora_enabled:
            lora = ops.matmul(self.lora_kernel_a, self.lora_kernel_b)
            kernel = ops.cast(ops.add(kernel, (self.lora_alpha / self.lora_rank) * lora), self.compute_dtype)
        return kernel

    def _get_kernel_with_merged_lora(self):
        if self.quantization_mode != "int8":
            return super()._get_kernel_with_merged_lora()
        columns = ops.transpose(self._kernel)
        if not self.lora_enabled:
            return columns, self.kernel_scale, None
        lora = (self.lora_alpha / self.lora_rank) * ops.matmul(self.lora_kernel_a, self.lora_kernel_b)
        merged = ops.add(ops.divide(ops.cast(columns, self.compute_dtype), self.kernel_scale), lora)
        kernel, scale = quantizers.abs_max_quantize(
            merged, axis=0, value_range=(-127, 127), dtype="int8", to_numpy=True
        )
        return kernel, ops.squeeze(scale, axis=0), None

    def load_own_variables(self, store):
        if self.built and self.quantization_mode == "int8":
            # The file holds Keras' `(input_dim, units)` kernel first (`variable_serialization_spec`).
            store = {key: np.asarray(store[key]) for key in store.keys()}
            store["0"] = store["0"].T
        super().load_own_variables(store)

    def _int8_call(self, inputs, training=None):
        rows_path = takes_int8_rows_product(inputs)

        @ops.custom_gradient
        def product(inputs, rows, kernel_scale):
            def grad_fn(*args, upstream=None):
                upstream = args[0] if upstream is None else upstream
                float_rows = ops.divide(ops.cast(rows, self.compute_dtype), ops.expand_dims(kernel_scale, -1))
                return ops.matmul(upstream, float_rows), None, None

            output_scale = kernel_scale
            if self.inputs_quantizer:
                inputs, inputs_scale = self.inputs_quantizer(inputs, axis=-1)
                output_scale = ops.multiply(output_scale, inputs_scale)
            if rows_path:
                x = rows_product(inputs, rows, self.compute_dtype)
            else:
                x = ops.cast(ops.matmul(inputs, ops.transpose(rows)), self.compute_dtype)
            return ops.divide(x, output_scale), grad_fn

        x = product(inputs, ops.convert_to_tensor(self._kernel), ops.convert_to_tensor(self.kernel_scale))
        if self.lora_enabled:
            lora_x = ops.matmul(ops.matmul(inputs, self.lora_kernel_a), self.lora_kernel_b)
            x = ops.cast(ops.add(x, (self.lora_alpha / self.lora_rank) * lora_x), self.compute_dtype)
        if self.bias is not None:
            x = ops.add(x, self.bias)
        if self.activation is not None:
            x = self.activation(x)
        return x
