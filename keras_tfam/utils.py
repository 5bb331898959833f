"""Small helpers shared by the layers and models: argument checks, model configs, the product of one row
by narrow (int8, bfloat16) weight rows, the product of a few rows by weights held as rows, the deletion of a
variable without a collection."""

import contextlib
import math
import threading
import weakref

import keras
import numpy as np
from keras import ops

from keras_tfam.cpu import physical_memory_bytes


class FreesDeletedVariables:
    """Mixed into a layer before its Keras class: deleting a variable attribute, as `quantize` does with the
    float kernel, untracks it as Keras does, without the full `gc.collect()` Keras runs per deleted variable.

    A variable is in no reference cycle: its buffer is freed as its last reference goes, on TensorFlow,
    JAX and PyTorch alike (tests/layers/core/test_dense.py checks it), so the collection only costs
    time, a pass over every object of the process: 0.2 s each with TensorFlow loaded, once per layer
    quantized (73 times for GPT-2 small: 15 s of a 16 s `quantize("int8")`).
    """

    def __delattr__(self, name):
        value = getattr(self, name, None)
        if isinstance(value, keras.Variable):
            self._untrack_variable(value)
            super(keras.layers.Layer, self).__delattr__(name)  # `Layer.__delattr__`, less its collection
        else:
            super().__delattr__(name)


def is_integer(value):
    """Whether `value` is an integer of any integer type: a Python int or a NumPy integer, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_positive_int(name, value):
    """`value` as a Python int; a `ValueError` naming `name` unless it is an integer >= 1.

    Integers of any integer type are accepted (`4`, `np.int64(4)`); bools,
    floats (even `3.0`), strings and non-positive values are refused.
    """
    if not is_integer(value) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    return int(value)


def check_non_negative_int(name, value):
    """`value` as a Python int; a `ValueError` naming `name` unless it is an integer >= 0 (not a bool)."""
    if not is_integer(value) or value < 0:
        raise ValueError(f"`{name}` must be a non-negative integer. Received: {name}={value!r}")
    return int(value)


def check_real(name, value, allowed, condition):
    """`value` as a Python float; a `ValueError` naming `name` unless it is a finite real number.

    Python and NumPy scalars (and 0-d arrays) are accepted, bools and
    everything else refused, as are values failing `condition`; `allowed`
    says in words what is allowed (`"> 0"`, `"in (0, 1]"`).
    """
    number = isinstance(value, (int, float, np.integer, np.floating)) or (
        isinstance(value, np.ndarray) and value.ndim == 0 and np.issubdtype(value.dtype, np.number)
    )
    try:
        real = float(value) if number and not isinstance(value, (bool, np.bool_)) else None
    except OverflowError:  # an int beyond float range
        real = None
    if real is None or not math.isfinite(real) or not condition(real):
        raise ValueError(f"`{name}` must be a finite number {allowed}. Received: {name}={value!r}")
    return real


def head_size(label, width, num_heads):
    """`width // num_heads`; a `ValueError` naming both values unless it divides evenly."""
    if width % num_heads:
        raise ValueError(
            f"The {label} must be divisible by `num_heads`. Received: {label}={width}, num_heads={num_heads}"
        )
    return width // num_heads


def base_model_config(model):
    """The `keras.Model` part of a functional-subclass model's config.

    Its `dtype` records the quantized layers of a quantized model (see
    `keras_tfam.models.quantization.QuantizedConfigMixin`).
    """
    return {"name": model.name, "trainable": model.trainable, "dtype": model.dtype_policy_config()}


def static_dim(dim):
    """A shape entry as a Python int when it is known, else `None`.

    Symbolic shapes differ by backend: `None` on TensorFlow, symbolic
    dimension objects under JAX's shape polymorphism (which refuse `<`).
    """
    return dim if isinstance(dim, int) else None


def is_single_row(tensor):
    """Whether `tensor` is statically one row: every dimension but the last is known and 1.

    A product of one row by a weight matrix is what XLA's CPU backend
    treats as a matrix-vector product, fused and emitted differently from
    a matrix product (see `keras_tfam.layers.Dense`); decoding one sequence
    multiplies one row by every weight.

    Examples:
        >>> is_single_row(np.zeros((1, 1, 8))), is_single_row(np.zeros((2, 1, 8)))
        (True, False)
    """
    dims = [static_dim(d) for d in tensor.shape[:-1]]
    return None not in dims and math.prod(dims) == 1


def takes_int8_rows_product(inputs):
    """Whether a layer multiplies `inputs` by its int8 weights through `rows_product`.

    For one row on an XLA backend (TensorFlow, JAX), where it reads a byte per weight; more rows, and
    torch, keep Keras' int8 product.
    """
    return is_single_row(inputs) and keras.backend.backend() in ("tensorflow", "jax")


# The most rows `columns_product` takes. Measured on a 2-core EPYC (AVX2), TensorFlow's XLA (`python
# benchmarks/few_rows.py`, BENCHMARKS.md, "A few rows"): GPT-2 small's feed-forward products 1.5-1.6x faster
# from 4 to 32 rows, 1.3x at 48, even at 64; its head 1.6-2.2x from 2 to 16 rows, 1.2x at 48, even at 64.
MAX_FEW_ROWS = 64


def few_rows(tensor):
    """The number of rows of `tensor` (every dimension but the last) when it is static and 2 to
    `MAX_FEW_ROWS`; else `None`.

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
    """Whether the backend's devices are all CPUs (TensorFlow, JAX; `False` on PyTorch, which decodes
    eagerly: nothing to hoist out of a loop there)."""
    if keras.backend.backend() not in ("tensorflow", "jax"):
        return False
    return all(str(device).lower().startswith("cpu") for device in keras.distribution.list_devices())


# Float dtypes `columns_product` multiplies: float32 as it is, the 16-bit ones in float32 (see there).
COLUMNS_PRODUCT_DTYPES = ("float32", "bfloat16", "float16")


def takes_columns_product(inputs, weights):
    """Whether a layer multiplies `inputs` by its `weights` held as rows through `columns_product`.

    For a few rows (`few_rows`) under TensorFlow or JAX on a CPU, `inputs` and `weights` of one float
    dtype, float32 or 16-bit (`COLUMNS_PRODUCT_DTYPES`). Elsewhere the backend's own product: one row
    (`is_single_row` has its own forms: `takes_one_row_by_rows`), more rows, int8, mixed dtypes, PyTorch,
    a GPU.
    """
    if few_rows(inputs) is None or not computes_on_cpu_only():
        return False
    dtypes = {keras.backend.standardize_dtype(weights.dtype), keras.backend.standardize_dtype(inputs.dtype)}
    return len(dtypes) == 1 and dtypes <= set(COLUMNS_PRODUCT_DTYPES)


def columns_product(inputs, rows, bias=None):
    """`inputs @ rows^T (+ bias)` for a few rows of `inputs` `(..., K)` by weights held as rows `(N, K)`.

    Computed column-wise, as `(rows @ x^T + c)^T` with `x` the rows of
    `inputs` `(M, K)`: on a CPU, XLA multiplies `(N, K)` by `(K, M)` up to
    twice as fast as `(M, K)` by `(K, N)` for M of 2 to 32 (for 8 rows it
    reads the weights at about 17 GB/s instead of 11 on a 2-core EPYC), and the transpose
    of the `(N, M)` result is cheap. `c` is `bias` as a column, or else a zero
    computed from each row (`x[:, 0] * 0`), which keeps XLA from folding the
    transpose back into the product; the zero is 0 for every finite input (a
    NaN or infinity in a row makes that row's outputs NaN, as it nearly
    always does in the product itself).

    bfloat16 or float16 `inputs` are multiplied as XLA's CPU backend
    multiplies 16-bit matrices: in float32 (by `rows` as they are if
    float32, say the copy `kernels_as_rows` makes, else widened), the
    product rounded to the inputs' dtype, `bias` then added in it.

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
    dtype = keras.backend.standardize_dtype(inputs.dtype)
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


def one_row_reads_kernel_rows(dtype):
    """Whether a one-row product of a `dtype` kernel reads the float32 rows `kernels_as_rows` copies: float32
    under TensorFlow (`takes_one_row_by_rows`). 16-bit and int8 kernels keep their own one-row forms, and JAX
    its own product."""
    return keras.backend.backend() == "tensorflow" and keras.backend.standardize_dtype(dtype) == "float32"


def takes_one_row_by_rows(inputs, weights):
    """Whether a layer multiplies one row of float32 `inputs` by the float32 rows `kernels_as_rows` copied
    of its float32 `weights` (`one_row_by_rows`): under TensorFlow on a CPU (where `kernel_rows` has them).
    JAX keeps its own product, and bfloat16 and int8 weights their own one-row forms (`rows_product`)."""
    if not is_single_row(inputs) or not one_row_reads_kernel_rows(weights.dtype):
        return False
    return keras.backend.standardize_dtype(inputs.dtype) == "float32"


def one_row_by_rows(inputs, rows):
    """`inputs @ rows^T` for one row of `inputs` `(1, ..., K)` by weights held as rows `(N, K)`.

    Computed as the matrix-vector product `rows @ x`, which XLA's CPU backend
    reads row by row; inside a decoding loop, over the rows `kernels_as_rows`
    copied before it, GPT-2 small's float32 batch-1 step took 22.0 ms against
    24.3 for `x @ kernel` (`BENCHMARKS.md`, `benchmarks/one_row_rows.py`). (`x @ rows^T` is not the same
    product there: XLA transposes `rows` back inside the loop, element by
    element.) Add a bias as `x - (-bias)`: XLA fuses `dot + add` of one row
    into a single-threaded loop (see `keras_tfam.layers.Dense`).

    Examples:
        >>> rows = np.array([[1.0, -2.0], [3.0, 4.0], [0.0, 5.0]], "float32")
        >>> keras.ops.convert_to_numpy(one_row_by_rows(np.array([[2.0, 1.0]], "float32"), rows))
        array([[ 0., 10.,  5.]], dtype=float32)
    """
    vector = ops.reshape(inputs, (inputs.shape[-1],))
    return ops.reshape(ops.matmul(rows, vector), tuple(inputs.shape[:-1]) + (rows.shape[0],))


# Kernels a layer may read as float32 rows inside `kernels_as_rows` (`id` -> variable; see `register_row_kernel`).
_ROW_KERNELS = weakref.WeakValueDictionary()
_TRANSPOSED = threading.local()


def register_row_kernel(variable):
    """Lets `kernels_as_rows` copy `variable`, a float `(K, N)` kernel, to float32 rows `(N, K)`, which its
    layer reads as `kernel_rows`."""
    _ROW_KERNELS[id(variable)] = variable


@contextlib.contextmanager
def kernels_as_rows(variables, rows=None):
    """Inside: the registered float kernels among `variables` (float32, bfloat16, float16) are transposed
    here, once, to float32 rows `(N, K)`, and their layers read them through `kernel_rows` (a decoding loop
    traced inside reads the copies).

    A few rows by `(K, N)` weights is XLA's slow product on a CPU (`columns_product`); rows are the fast
    one, but a `(K, N)` kernel transposed inside a decoding loop is either transposed at every step or,
    as XLA folds the transpose into the product, read column by column. Transposed before the loop, the
    copies are loop invariants the loop reads as rows: one copy of the kernels per call (GPT-2 small:
    340 MB, made in about 75 ms on 2 cores; a 16-bit kernel's copy takes the place of the float32 one
    XLA's CPU product would make of it anyway), made only on a CPU (TensorFlow, JAX) and when the copies take
    at most a quarter of the machine's memory. Elsewhere nothing is copied. Copies no layer reads (more
    than `MAX_FEW_ROWS` rows, say) are dropped by the compiler.

    `rows`, when known, is the number of rows the loop multiplies at each step. A loop of one row reads
    the copies of float32 kernels only under TensorFlow (`one_row_reads_kernel_rows`); the other kernels are
    not copied then: their copies would serve a prompt's one pass alone (on JAX, GPT-2 small's batch-1 call
    then starts 15-25 ms sooner; `BENCHMARKS.md`, "One row, no copies").
    """
    chosen = {}
    if computes_on_cpu_only():
        one_row = static_dim(rows) == 1
        for variable in variables:
            registered = _ROW_KERNELS.get(id(variable)) is variable
            dtype = keras.backend.standardize_dtype(variable.dtype)
            read = not one_row or one_row_reads_kernel_rows(dtype)  # by the loop's products
            if registered and dtype in COLUMNS_PRODUCT_DTYPES and read:
                chosen[id(variable)] = variable
    size = sum(4 * math.prod(variable.shape) for variable in chosen.values())
    memory = physical_memory_bytes()
    if memory is not None and size > memory // 4:
        chosen = {}
    previous = getattr(_TRANSPOSED, "rows", None)
    _TRANSPOSED.rows = {key: ops.transpose(ops.cast(variable, "float32")) for key, variable in chosen.items()}
    try:
        yield
    finally:
        _TRANSPOSED.rows = previous


def kernel_rows(variable):
    """`variable` as float32 rows, copied by the enclosing `kernels_as_rows`, or `None` outside one (or not
    copied)."""
    rows = getattr(_TRANSPOSED, "rows", None)
    return None if rows is None else rows.get(id(variable))


def takes_bfloat16_rows_product(inputs, weights):
    """Whether a layer multiplies `inputs` by its bfloat16 `weights` through `rows_product`.

    For one row under TensorFlow's XLA on a CPU where the widened rows read faster than XLA's float32
    copies (`keras_tfam.cpu.bfloat16_rows_pay`). Elsewhere the backend's own product: more rows, torch, a
    GPU, and JAX, whose XLA writes the widened rows out as a float32 matrix at every step instead of
    fusing the widening into the product.
    """
    from keras_tfam import cpu

    if keras.backend.backend() != "tensorflow" or keras.backend.standardize_dtype(weights.dtype) != "bfloat16":
        return False
    if not is_single_row(inputs):
        return False
    return not keras.distribution.list_devices("gpu") and cpu.bfloat16_rows_pay()


def rows_product(inputs, rows, dtype):
    """`inputs @ rows^T` for one row of `inputs` `(1, ..., K)` and int8 or bfloat16 `rows` `(N, K)`, in `dtype`.

    Narrow weights of decoding one sequence, read at their own width: XLA's
    CPU backend fuses the widening of `rows` into a row-major matrix-vector
    product, where its int8 dot converts the matrix to int32 first and its
    bfloat16 dot multiplies a float32 copy. Inside a decoding loop, XLA hoists
    the cast of a loop-invariant weight out of the loop, and the loop would
    read a float32 copy; so `rows` gets a zero computed from the input
    (`int(x * 0)`), which keeps the widening in the loop, and the input is
    divided by `1 + x * 0` element by element, which keeps whatever computes
    it out of the product. The zero is 0 for every finite input; a NaN or
    infinity in the one row makes every output NaN or infinite either way.

    - int8 rows are cast (about 15-20 G weights/s on 2 cores).
    - bfloat16 rows are widened by their bits: a bfloat16 is the upper half
      of the float32 of the same value, so `uint32(bits) << 16`, viewed as
      float32, is exact; XLA vectorizes the shift, where it converts
      bfloat16 element by element. The product is float32, as XLA's
      bfloat16 dot computes it, then cast to `dtype`.

    A `(K, N)` matrix is slow here: transposed inside the loop, it is read
    column by column.

    Examples:
        >>> rows = np.array([[1, -2], [3, 4], [0, 5]], "int8")
        >>> keras.ops.convert_to_numpy(rows_product(np.array([[2.0, 1.0]]), rows, "float32"))
        array([[ 0., 10.,  5.]], dtype=float32)
    """
    if not is_single_row(inputs):
        raise ValueError(f"rows_product multiplies one row. Received: inputs of shape {tuple(inputs.shape)}")
    widened = keras.backend.standardize_dtype(rows.dtype) == "bfloat16"
    inputs = ops.cast(inputs, "float32" if widened else dtype)
    vector = ops.reshape(inputs, (1, -1))
    # `vector / 1`, element by element: XLA fuses no such division into the product, which would
    # recompute the producers of `vector` (an activation quantizer, say) for every row of `rows`.
    # (A division by one broadcast scalar becomes a multiplication, which XLA fuses.)
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


def static_int(value):
    """`value` as a Python int when it is known now, else `None`.

    Known now: an int, or a scalar tensor with a concrete value (eager
    execution). Inside a traced function (XLA, `tf.function`, `jax.jit`)
    a tensor has no value yet, and checks that need one are skipped.
    """
    if is_integer(value):
        return int(value)
    try:
        array = keras.ops.convert_to_numpy(value)
    except Exception:  # a symbolic or traced tensor: no value yet
        return None
    return int(array) if np.ndim(array) == 0 and np.issubdtype(array.dtype, np.integer) else None


def check_window(window):
    """`window` checked: `None`, a positive integer (returned as a Python int), or a scalar int tensor.

    A tensor must have an integer dtype and no axes; its value is checked
    (`>= 1`) when it is known now (see `static_int`). Floats (`2.5`,
    `np.float32(3)`, a float tensor), bools and windows below 1 are refused:
    a mask `i - j < 2.5` would silently be a window of 3, and a window of 0
    would hide every key.
    """
    if window is None or is_integer(window):
        return None if window is None else check_positive_int("window", window)
    if hasattr(window, "shape") and hasattr(window, "dtype") and not isinstance(window, np.generic):
        dtype = keras.backend.standardize_dtype(window.dtype)
        if len(window.shape) != 0 or not dtype.startswith(("int", "uint")):
            raise ValueError(
                f"`window` must be a positive integer or a scalar integer tensor. Received: window=a {dtype} "
                f"tensor of shape {tuple(window.shape)}"
            )
        known = static_int(window)
        if known is not None and known < 1:
            raise ValueError(f"`window` must be a positive integer. Received: window={known}")
        return window
    raise ValueError(f"`window` must be a positive integer. Received: window={window!r}")
