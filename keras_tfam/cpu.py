"""Process settings for running keras_tfam on a CPU, made by one explicit call: `configure()`.

Importing keras_tfam changes nothing in the process. `configure()` is what the `tfam` command line,
the scripts and the benchmarks call first; a user's program may call it too. It sets environment
variables that TensorFlow and XLA read once, so it must run before the first tensor is made and
before anything is compiled; a variable the user already set is kept.

- Pooled tensor memory (TensorFlow): `TF_CPU_ALLOCATOR_USE_BFC=true`, TensorFlow's BFC allocator,
  which keeps freed blocks for the next step instead of handing each large one back to the system
  (so training steps and `generate` calls do not fault their temporaries in afresh). Its cap,
  `TF_CPU_BFC_MEM_LIMIT_IN_MB`, is raised to the machine's memory where that exceeds TensorFlow's
  default. Other backends ignore both.
- Wide vectors (`wide_vectors=True`, XLA on TensorFlow and JAX): `--xla_cpu_prefer_vector_width=512`
  on a CPU with AVX-512, for processes that decode int8 weights one sequence at a time; XLA's
  default (256) otherwise.

`TFAM_CPU_FLAGS` (space-separated `/proc/cpuinfo` flags) stands in for the CPU's flags, to try a
choice on another machine's features.

Examples:
    >>> import keras_tfam
    >>> keras_tfam.cpu.configure()  # first thing, before any tensor
    {'pooled_tensor_memory': True, 'xla_cpu_vector_width': '256'}
"""

import os

_WIDTH_FLAG = "--xla_cpu_prefer_vector_width"
# TensorFlow's switch for its pooling (BFC) CPU allocator, read at its first tensor, and that pool's cap in MB.
POOL_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"
POOL_LIMIT_VARIABLE = "TF_CPU_BFC_MEM_LIMIT_IN_MB"
_DEFAULT_POOL_LIMIT_MB = 65536  # TensorFlow's own cap


def configure(pool_tensor_memory=True, wide_vectors=False):
    """Sets this process up for keras_tfam on a CPU (see the module); call it before the first tensor.

    Args:
        pool_tensor_memory: ask TensorFlow to pool its CPU tensor memory, unless
            `TF_CPU_ALLOCATOR_USE_BFC` is already set (a value set, even `false`, is kept).
        wide_vectors: ask XLA for 512-bit vectors where the CPU has AVX-512 and
            `XLA_FLAGS` names no width.

    Returns:
        What the process asked for: `{"pooled_tensor_memory": bool, "xla_cpu_vector_width": str}`.
        Whether TensorFlow really pools is known only once it runs (`pipelines.kernel_path`
        measures it): a variable set after the first tensor counts for nothing.
    """
    for name, value in (("pool_tensor_memory", pool_tensor_memory), ("wide_vectors", wide_vectors)):
        if not isinstance(value, bool):
            raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}")
    if pool_tensor_memory:
        os.environ.setdefault(POOL_VARIABLE, "true")
        memory_mb = (physical_memory_bytes() or 0) // 2**20
        if pool_asked() and memory_mb > _DEFAULT_POOL_LIMIT_MB:
            os.environ.setdefault(POOL_LIMIT_VARIABLE, str(memory_mb))
    if wide_vectors:
        prefer_wide_vectors()
    return {"pooled_tensor_memory": pool_asked(), "xla_cpu_vector_width": xla_cpu_vector_width()}


def pool_asked():
    """Whether `TF_CPU_ALLOCATOR_USE_BFC` asks TensorFlow to pool (`true` or `1`)."""
    return os.environ.get(POOL_VARIABLE, "").strip().lower() in ("true", "1")


def cpu_flags():
    """The CPU's feature flags (`/proc/cpuinfo`, or `TFAM_CPU_FLAGS`), a set; empty where unknown.

    Examples:
        >>> sorted(cpu_flags() & {"avx2", "avx512f", "amx_bf16"})  # on a CPU with AVX-512 and AMX
        ['amx_bf16', 'avx2', 'avx512f']
    """
    override = os.environ.get("TFAM_CPU_FLAGS")
    if override is not None:
        return set(override.split())
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def xla_flags_with_vector_width(xla_flags, flags):
    """`xla_flags` (an `XLA_FLAGS` string) with 512-bit vectors added where `flags` has AVX-512
    and `xla_flags` names no width; else `xla_flags` unchanged.

    Examples:
        >>> xla_flags_with_vector_width("--xla_dump_to=/tmp/x", {"avx2", "avx512f"})
        '--xla_dump_to=/tmp/x --xla_cpu_prefer_vector_width=512'
        >>> xla_flags_with_vector_width("--xla_cpu_prefer_vector_width=256", {"avx512f"})
        '--xla_cpu_prefer_vector_width=256'
    """
    if "avx512f" not in flags or _WIDTH_FLAG in xla_flags:
        return xla_flags
    return f"{xla_flags} {_WIDTH_FLAG}=512".strip()


def prefer_wide_vectors():
    """Adds 512-bit vectors to `XLA_FLAGS` on a CPU with AVX-512, before anything compiles.

    XLA reads `XLA_FLAGS` once, at its first compilation: a process that compiled before keeps
    what it had.

    Returns:
        Whether XLA will compile for 512-bit vectors: `False` without AVX-512,
        or where `XLA_FLAGS` already names another width.
    """
    current = os.environ.get("XLA_FLAGS", "")
    chosen = xla_flags_with_vector_width(current, cpu_flags())
    if chosen != current:
        os.environ["XLA_FLAGS"] = chosen
    return xla_cpu_vector_width() == "512"


def bfloat16_rows_pay():
    """Whether one-row products here read bfloat16 weights as rows widened by their bits.

    XLA's CPU backend multiplies float32 copies of bfloat16 weights; reading the bits and widening
    them in the product reads half the bytes. That pays on an x86 CPU with AVX2 and without AVX-512,
    or whose XLA compiles for 512-bit vectors (`prefer_wide_vectors`); not where the CPU is unknown.
    """
    flags = cpu_flags()
    return "avx2" in flags and ("avx512f" not in flags or xla_cpu_vector_width() == "512")


def xla_cpu_vector_width():
    """The vector width XLA's CPU backend compiles for in this process, as `XLA_FLAGS` sets it
    (`"256"` when it names none: XLA's default on x86), a string for a run's record."""
    for flag in os.environ.get("XLA_FLAGS", "").split():
        if flag.startswith(_WIDTH_FLAG + "="):
            return flag.split("=", 1)[1]
    return "256"


def physical_memory_bytes():
    """The machine's memory in bytes (`sysconf`), or `None` where unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
