"""The XLA-CPU engine: the product forms and cache storage that XLA's CPU backend runs faster when decoding.

Decoding multiplies one row, or a few (a batch, beams), by every weight matrix at each step, inside a
compiled loop. XLA's CPU backend treats those products apart from a matrix product: it fuses and emits a
one-row `dot + bias` as a single-threaded loop, multiplies `(M, K) @ (K, N)` more slowly than
`(N, K) @ (K, M)` for a few rows, converts int8 and bfloat16 weights to 32 bits before its dots, and writes
into a 16-bit float tensor through a float32 copy. Each form below computes Keras' sums (in another order, or
exactly) in the form XLA runs faster. `XLA_CPU` is the engine the generator enters on TensorFlow and JAX when
every device is a CPU (`runs_here`).
"""

import contextlib
import math

import keras
from keras import ops

from keras_tfam.cpu import bfloat16_rows_pay, physical_memory_bytes
from keras_tfam.engine import Engine, current_decoding
from keras_tfam.utils import static_dim

__all__ = ["XLA_CPU", "XlaCpuEngine", "columns_product", "int8_sums", "one_row_by_rows", "rows_product"]

# The most rows `columns_product` takes: past it, XLA's own product is as fast.
MAX_FEW_ROWS = 64
# Float dtypes `columns_product` multiplies: float32 as it is, the 16-bit ones in float32.
COLUMNS_PRODUCT_DTYPES = ("float32", "bfloat16", "float16")
# A 16-bit float cache is stored as its bits, in the integer type of the same width (`XlaCpuEngine.cache_dtype`).
BITS_OF = {"bfloat16": "uint16", "float16": "int16"}
# XLA's CPU backend in recent jaxlibs hands reductions and dots to YNNPACK ("YNN fusions"), which runs the
# attention of one decoded token over its cache slowly; an empty list turns them off for the decoding loop.
JAX_CPU_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}
# The most terms of int8 products a float32 sum holds exactly: 1024 * 128**2 == 2**24.
EXACT_INT8_TERMS = 1024


def is_single_row(tensor):
    """Whether `tensor` is statically one row: every dimension but the last is known and 1.

    Examples:
        >>> is_single_row(np.zeros((1, 1, 8))), is_single_row(np.zeros((2, 1, 8)))
        (True, False)
    """
    dims = [static_dim(d) for d in tensor.shape[:-1]]
    return None not in dims and math.prod(dims) == 1


def few_rows(tensor):
    """The number of rows of `tensor` (every dimension but the last) when static and 2 to `MAX_FEW_ROWS`, else
    `None`.

    Examples:
        >>> few_rows(np.zeros((8, 1, 16))), few_rows(np.zeros((1, 1, 16))), few_rows(np.zeros((4, 32, 16)))
        (8, None, None)
    """
    dims = [static_dim(d) for d in tensor.shape[:-1]]
    if None in dims:
        return None
    count = math.prod(dims)
    return count if 2 <= count <= MAX_FEW_ROWS else None


def computes_on_cpu_only():
    """Whether the backend is TensorFlow or JAX and its devices are all CPUs."""
    if keras.backend.backend() not in ("tensorflow", "jax"):
        return False
    return all(str(device).lower().startswith("cpu") for device in keras.distribution.list_devices())


def _dtype(tensor):
    return keras.backend.standardize_dtype(tensor.dtype)


def _activate(layer, x):
    """`x` through the layer's activation, as Keras' `Dense.call` applies it."""
    return x if layer.activation is None else layer.activation(x)


def columns_product(inputs, rows, bias=None):
    """`inputs @ rows^T (+ bias)` for a few rows of `inputs` `(..., K)` by weights held as rows `(N, K)`.

    Computed column-wise, as `(rows @ x^T + c)^T` with `x` the rows of `inputs` `(M, K)`, which XLA's CPU
    backend multiplies faster than `(M, K) @ (K, N)`; the transpose of the `(N, M)` result is cheap. `c` is
    `bias` as a column, or else a zero computed from each row (`x[:, 0] * 0`), which keeps XLA from folding
    the transpose back into the product; the zero is 0 for every finite input (a NaN or infinity in a row
    makes that row's outputs NaN, as it nearly always does in the product itself).

    bfloat16 or float16 `inputs` are multiplied as XLA's CPU backend multiplies 16-bit matrices: in float32
    (by `rows` as they are if float32, else widened), the product rounded to the inputs' dtype, `bias` then
    added in it.

    Examples:
        >>> rows = np.array([[1.0, -2.0], [3.0, 4.0], [0.0, 5.0]], "float32")
        >>> keras.ops.convert_to_numpy(columns_product(np.array([[2.0, 1.0], [0.0, 1.0]], "float32"), rows))
        array([[ 0., 10.,  5.],
               [-2.,  4.,  5.]], dtype=float32)
    """
    count = few_rows(inputs)
    if count is None:
        raise ValueError(
            f"columns_product multiplies 2 to {MAX_FEW_ROWS} rows. Received: inputs of shape {tuple(inputs.shape)}"
        )
    dtype = _dtype(inputs)
    narrow = dtype != "float32"
    flat = ops.reshape(inputs, (count, inputs.shape[-1]))
    if narrow:
        flat, rows = ops.cast(flat, "float32"), ops.cast(rows, "float32")
    column = ops.multiply(flat[:, 0], 0)[None, :] if bias is None or narrow else ops.expand_dims(bias, -1)
    # The column first: Keras' TensorFlow `add(x, y)` takes a `y` that squeezes to a vector as a bias of
    # `x`'s last axis, so `add(product, bias[:, None])` of a square product adds the bias along its rows.
    columns = ops.add(column, ops.matmul(rows, ops.transpose(flat)))
    outputs = ops.reshape(ops.transpose(columns), tuple(inputs.shape[:-1]) + (rows.shape[0],))
    if not narrow:
        return outputs
    outputs = ops.cast(outputs, dtype)
    return outputs if bias is None else ops.add(outputs, ops.cast(bias, dtype))


def one_row_by_rows(inputs, rows):
    """`inputs @ rows^T` for one row of `inputs` `(1, ..., K)` by weights held as rows `(N, K)`.

    Computed as the matrix-vector product `rows @ x`, which XLA's CPU backend reads row by row (`x @ rows^T`
    is not the same product there: XLA transposes `rows` back inside the loop, element by element).

    Examples:
        >>> rows = np.array([[1.0, -2.0], [3.0, 4.0], [0.0, 5.0]], "float32")
        >>> keras.ops.convert_to_numpy(one_row_by_rows(np.array([[2.0, 1.0]], "float32"), rows))
        array([[ 0., 10.,  5.]], dtype=float32)
    """
    vector = ops.reshape(inputs, (inputs.shape[-1],))
    return ops.reshape(ops.matmul(rows, vector), tuple(inputs.shape[:-1]) + (rows.shape[0],))


def rows_product(inputs, rows, dtype):
    """`inputs @ rows^T` for one row of `inputs` `(1, ..., K)` and int8 or bfloat16 `rows` `(N, K)`, in `dtype`.

    Narrow weights read at their own width: XLA's CPU backend fuses the widening of `rows` into a row-major
    matrix-vector product, where its int8 dot converts the matrix to int32 first and its bfloat16 dot
    multiplies a float32 copy. Inside a decoding loop XLA hoists the cast of a loop-invariant weight out of
    the loop, which would then read a 32-bit copy; so `rows` gets a zero computed from the input
    (`int(x * 0)`), which keeps the widening in the loop, and the input is divided by `1 + x * 0` element by
    element, which keeps whatever computes it out of the product. The zero is 0 for every finite input; a NaN
    or infinity in the one row makes every output NaN or infinite either way.

    - int8 rows are cast.
    - bfloat16 rows are widened by their bits: a bfloat16 is the upper half of the float32 of the same value,
      so `uint32(bits) << 16`, viewed as float32, is exact; XLA vectorizes the shift, where it converts
      bfloat16 element by element. The product is float32, as XLA's bfloat16 dot computes it, then cast to
      `dtype`.

    Examples:
        >>> rows = np.array([[1, -2], [3, 4], [0, 5]], "int8")
        >>> keras.ops.convert_to_numpy(rows_product(np.array([[2.0, 1.0]]), rows, "float32"))
        array([[ 0., 10.,  5.]], dtype=float32)
    """
    if not is_single_row(inputs):
        raise ValueError(f"rows_product multiplies one row. Received: inputs of shape {tuple(inputs.shape)}")
    widened = _dtype(rows) == "bfloat16"
    inputs = ops.cast(inputs, "float32" if widened else dtype)
    vector = ops.reshape(inputs, (1, -1))
    # `vector / 1`, element by element: XLA fuses no such division into the product, which would recompute
    # the producers of `vector` (an activation quantizer, say) for every row of `rows`. (A division by one
    # broadcast scalar becomes a multiplication, which XLA fuses.)
    vector = ops.divide(vector, ops.add(ops.multiply(vector, 0), 1))
    if widened and keras.backend.backend() == "torch":  # no 16-bit unsigned view there; eager: nothing to hoist
        matrix = ops.cast(rows, "float32")
    elif widened:
        zero = ops.cast(ops.multiply(vector[0, 0], 0), "uint16")
        bits = ops.cast(ops.add(ops.view(rows, "uint16"), zero), "uint32")
        matrix = ops.view(ops.left_shift(bits, 16), "float32")
    else:
        zero = ops.cast(ops.multiply(vector[0, 0], 0), rows.dtype)
        matrix = ops.cast(ops.add(rows, zero), dtype)
    product = ops.cast(ops.matmul(vector, ops.transpose(matrix)), dtype)
    return ops.reshape(product, tuple(inputs.shape[:-1]) + (rows.shape[0],))


def int8_sums(inputs, kernel):
    """`inputs @ kernel` of int8 tensors as int32 sums, by float32 products over slices of at most
    `EXACT_INT8_TERMS` terms (each slice's sum exact in float32), which TensorFlow's executor multiplies faster
    than int8 by int8 on CPUs without int8 dot instructions.

    Examples:
        >>> x, w = np.full((2, 3000), -128, np.int8), np.full((3000, 4), -128, np.int8)
        >>> int(keras.ops.convert_to_numpy(int8_sums(x, w))[0, 0]) == 3000 * 128**2
        True
    """
    depth = kernel.shape[0]
    total = None
    for start in range(0, depth, EXACT_INT8_TERMS):
        stop = min(start + EXACT_INT8_TERMS, depth)
        part = ops.matmul(ops.cast(inputs[..., start:stop], "float32"), ops.cast(kernel[start:stop], "float32"))
        part = ops.cast(part, "int32")
        total = part if total is None else ops.add(total, part)
    return total


class XlaCpuEngine(Engine):
    """The forms XLA's CPU backend runs faster when decoding (module docstring), for TensorFlow and JAX.

    - Float kernels copied as float32 rows `(N, K)` once, before the loop (`loop`), which their `Dense`
      layers multiply as `(rows @ x^T + bias)^T` for a few rows, or `rows @ x` for one row under TensorFlow.
    - One row plus a bias as `x - (-bias)`, which XLA does not output-fuse into a single-threaded loop.
    - Int8 kernels copied as int8 rows `(N, K)` once, before a loop of one or a few rows, which their `Dense`
      layers multiply by one row a byte a weight (`rows_product`), or by a few rows as `x @ rows^T`.
    - Int8 kernels by many rows, in a call TensorFlow's executor runs (`compiled=False`, a served prefill),
      as float32 products of slices that sum exactly (`int8_sums`).
    - One row by bfloat16 weights, or by an int8 tied embedding's table, read at their own width (`rows_product`).
    - A tied embedding's logits as `E @ h` for one row, `(E @ h^T)^T` for a few.
    - 16-bit float caches stored as their bits, which XLA writes in place.
    - JAX's loops compiled without YNN fusions (`JAX_CPU_OPTIONS`).

    Every form computes Keras' sums: exactly (the bias, int8 integer sums, the cache) or within float32
    rounding (another order of the same products).

    Args:
        None: the engine is stateless; `XLA_CPU` is its instance.

    Examples:
        >>> model = GPT2LM(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16)
        >>> model.generate([[5, 7]], max_new_tokens=4, engine=XLA_CPU).shape  # what "auto" picks on a CPU
        (1, 6)
    """

    name = "xla_cpu"

    @staticmethod
    def runs_here():
        """Whether this engine is the generator's `"auto"` choice: TensorFlow or JAX, every device a CPU."""
        return computes_on_cpu_only()

    @contextlib.contextmanager
    def loop(self):
        """Copies the kernels the loop's products read as rows, once, here: float kernels to float32 rows
        `(N, K)`, and int8 kernels to int8 rows `(N, K)` for a loop of up to `MAX_FEW_ROWS` rows (or not known).

        A `(K, N)` kernel transposed inside a decoding loop is either transposed at every step or, as XLA
        folds the transpose into the product, read column by column; transposed before the loop, the copies
        are loop invariants the loop reads as rows. A 16-bit kernel's copy takes the place of the float32
        one XLA's CPU product makes of it anyway; an int8 kernel's copy keeps its byte a weight. Nothing is
        copied off a CPU, nor when the copies would take more than a quarter of the machine's memory; copies
        no layer reads are dropped by the compiler. A loop of one row reads the copies of float32 kernels
        under TensorFlow only (`_reads_rows_for_one_row`), so no other float kernel is copied for it.
        """
        decoding = current_decoding()
        if decoding is None or decoding.engine is not self or not computes_on_cpu_only():
            yield
            return
        rows = static_dim(decoding.rows)
        floats = [
            variable
            for variable in decoding.variables
            if len(variable.shape) == 2
            and _dtype(variable) in COLUMNS_PRODUCT_DTYPES
            and (rows != 1 or self._reads_rows_for_one_row(_dtype(variable)))
        ]
        reads_int8 = rows is None or rows <= MAX_FEW_ROWS
        int8 = [v for v in decoding.variables if len(v.shape) == 2 and _dtype(v) == "int8" and reads_int8]
        memory = physical_memory_bytes()
        size = sum(4 * math.prod(v.shape) for v in floats) + sum(math.prod(v.shape) for v in int8)
        if memory is not None and size > memory // 4:
            floats, int8 = [], []
        previous = decoding.prepared.get("rows")
        copies = {id(v): ops.transpose(ops.cast(v, "float32")) for v in floats}
        decoding.prepared["rows"] = copies | {id(v): ops.transpose(v) for v in int8}
        try:
            yield
        finally:
            decoding.prepared["rows"] = previous

    def kernel_rows(self, variable):
        """`variable`'s rows (float32, or int8 for an int8 kernel), copied before the loop (`loop`), or `None`
        outside one (or not copied)."""
        decoding = current_decoding()
        if decoding is None or decoding.engine is not self:
            return None
        return (decoding.prepared.get("rows") or {}).get(id(variable))

    def jax_jit(self, fn):
        """`jax.jit(fn)` with `JAX_CPU_OPTIONS` on a CPU where this JAX and its XLA know them."""
        import jax

        plain = jax.jit(fn)
        if jax.default_backend() != "cpu":
            return plain
        try:
            tuned = jax.jit(fn, compiler_options=JAX_CPU_OPTIONS)
        except TypeError:  # a JAX without per-function compiler options
            return plain
        chosen = [tuned]

        def call(*args):
            try:
                return chosen[0](*args)
            except jax.errors.JaxRuntimeError as error:  # an XLA without the option: compile without it
                if chosen[0] is plain or next(iter(JAX_CPU_OPTIONS)) not in str(error):
                    raise
                chosen[0] = plain
                return plain(*args)

        return call

    def dense(self, layer, inputs):
        """`layer(inputs)` for a few rows by the kernel's rows, one row by bfloat16 rows or by the kernel with
        the bias as `x - (-bias)`; `None` (Keras' `Dense.call`) for more rows."""
        kernel = layer.kernel
        rows = None if layer.lora_enabled else self.kernel_rows(kernel)
        if rows is not None and self._takes_columns_product(inputs, kernel):
            return _activate(layer, columns_product(inputs, rows, layer.bias))
        if self._takes_bfloat16_rows(inputs, kernel):
            x = rows_product(inputs, ops.transpose(kernel), layer.compute_dtype)
            return _activate(layer, x if layer.bias is None else ops.add(x, layer.bias))
        if (
            rows is not None
            and is_single_row(inputs)
            and self._reads_rows_for_one_row(_dtype(kernel))
            and _dtype(inputs) == "float32"
        ):
            x = one_row_by_rows(inputs, rows)
        elif layer.bias is not None and is_single_row(inputs):
            x = ops.matmul(inputs, kernel)
        else:
            return None
        return _activate(layer, x if layer.bias is None else self.one_row_plus_bias(x, layer.bias))

    @staticmethod
    def one_row_plus_bias(x, bias):
        """`x + bias` as `x - (-bias)`, bit for bit: XLA does not output-fuse it with a one-row product."""
        return ops.subtract(x, ops.negative(bias))

    def int8_dense(self, layer, inputs):
        """`layer(inputs)` by the int8 rows of the kernel copied before the loop (`loop`): one row read a byte a
        weight (`rows_product`), a few rows as `x @ rows^T`, which XLA's CPU backend multiplies faster than
        `x @ kernel`; more rows, in a call the executor runs, by `int8_sums`. Keras' int8 `Dense` outputs, the
        same integer sums; `None` (Keras' `_int8_call`) for more rows in a compiled call or with LoRA."""
        if layer.lora_enabled:
            return None
        rows = self.kernel_rows(layer.kernel)
        one_row = is_single_row(inputs)
        if rows is None or not (one_row or few_rows(inputs)):
            decoding = current_decoding()
            if decoding is None or decoding.compiled or not layer.inputs_quantizer:
                return None
            inputs, inputs_scale = layer.inputs_quantizer(inputs, axis=-1)
            x = ops.cast(int8_sums(inputs, ops.convert_to_tensor(layer.kernel)), layer.compute_dtype)
            x = ops.divide(x, ops.multiply(layer.kernel_scale, inputs_scale))
            return _activate(layer, x if layer.bias is None else ops.add(x, layer.bias))
        scale = layer.kernel_scale
        if layer.inputs_quantizer:
            inputs, inputs_scale = layer.inputs_quantizer(inputs, axis=-1)
            scale = ops.multiply(scale, inputs_scale)
        if one_row:
            x = rows_product(inputs, rows, layer.compute_dtype)
        else:
            x = ops.cast(ops.matmul(inputs, ops.transpose(rows)), layer.compute_dtype)
        x = ops.divide(x, scale)
        return _activate(layer, x if layer.bias is None else ops.add(x, layer.bias))

    def reverse_embedding(self, layer, inputs):
        """Logits `E @ h` for one row (bfloat16 `E` widened by its bits where that pays), `(E @ h^T)^T` for a
        few; `None` for more rows, a soft cap or a reverse dtype."""
        if layer.logit_soft_cap is not None or layer.reverse_dtype is not None:
            return None
        table = layer.embeddings
        if self._takes_bfloat16_rows(inputs, table):
            return rows_product(inputs, table, layer.compute_dtype)
        if is_single_row(inputs):
            column = ops.matmul(table, ops.reshape(inputs, (-1, 1)))
            return ops.reshape(column, tuple(inputs.shape[:-1]) + (table.shape[0],))
        if self._takes_columns_product(inputs, table):
            return columns_product(inputs, table)
        return None

    def int8_logits(self, layer, inputs):
        """One row's logits by the int8 table read a byte a weight: Keras' int8 logits, bit for bit; else `None`."""
        if layer.logit_soft_cap is not None or layer.lora_enabled or not is_single_row(inputs):
            return None
        if keras.backend.backend() not in ("tensorflow", "jax"):
            return None
        scale = layer.embeddings_scale
        if layer.inputs_quantizer:
            inputs, inputs_scale = layer.inputs_quantizer(inputs)
            scale = ops.multiply(inputs_scale, scale)
        return ops.divide(rows_product(inputs, layer.embeddings, layer.compute_dtype), scale)

    def cache_dtype(self, dtype):
        """A 16-bit float cache as the bits of its values (`BITS_OF`), which XLA writes in place, on XLA backends."""
        dtype = keras.backend.standardize_dtype(dtype)
        return BITS_OF.get(dtype, dtype) if keras.backend.backend() in ("tensorflow", "jax") else dtype

    def cache_value_dtype(self, stored_dtype):
        """The float dtype whose bits a cache of `stored_dtype` holds, else `stored_dtype`."""
        return next((dtype for dtype, bits in BITS_OF.items() if bits == stored_dtype), stored_dtype)

    def cache_values(self, stored):
        """A stored cache tensor as its values: 16-bit floats held as bits viewed as floats again."""
        dtype = self.cache_value_dtype(_dtype(stored))
        return stored if dtype == _dtype(stored) else ops.view(stored, dtype)

    def cache_stored(self, values, stored_dtype):
        """`values` as a cache of `stored_dtype` stores them: their bits when it holds 16-bit floats as bits."""
        return values if self.cache_value_dtype(stored_dtype) == stored_dtype else ops.view(values, stored_dtype)

    @staticmethod
    def _reads_rows_for_one_row(dtype):
        """Whether a one-row product of a `dtype` kernel reads its float32 rows: float32 under TensorFlow (JAX
        keeps its own product; 16-bit and int8 kernels their own one-row forms)."""
        return keras.backend.backend() == "tensorflow" and dtype == "float32"

    @staticmethod
    def _takes_columns_product(inputs, weights):
        """A few rows on a CPU, `inputs` and `weights` of one float dtype (`COLUMNS_PRODUCT_DTYPES`)."""
        if few_rows(inputs) is None or not computes_on_cpu_only():
            return False
        dtypes = {_dtype(weights), _dtype(inputs)}
        return len(dtypes) == 1 and dtypes <= set(COLUMNS_PRODUCT_DTYPES)

    @staticmethod
    def _takes_bfloat16_rows(inputs, weights):
        """One row by bfloat16 weights under TensorFlow on a CPU where their widened rows read faster than XLA's
        float32 copies (`keras_tfam.cpu.bfloat16_rows_pay`); JAX's XLA writes the widened rows out instead."""
        if keras.backend.backend() != "tensorflow" or _dtype(weights) != "bfloat16" or not is_single_row(inputs):
            return False
        return not keras.distribution.list_devices("gpu") and bfloat16_rows_pay()


XLA_CPU = XlaCpuEngine()
