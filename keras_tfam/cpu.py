"""The CPU keras_tfam runs on: its feature flags, the vector width XLA compiles for, and how
TensorFlow holds tensor memory there.

XLA's CPU backend prefers 256-bit vectors on x86 (`--xla_cpu_prefer_vector_width`,
default 256), a default made for the Intel CPUs whose clocks drop under 512-bit
instructions. On a CPU with AVX-512, `prefer_wide_vectors()` asks for 512: the
product that decodes int8 weights one token at a time converts each weight as
it reads it, and at 512 bits each instruction converts twice as many. Measured
on a 2-core Xeon with AVX-512 and AMX (BENCHMARKS.md, "Wider vectors"), GPT-2
small's int8 decoding at batch 1 ran 1.07-1.25x faster, training did not move,
and float32 decoding at batch 8 ran about 10% slower; so it is a choice for a
process that decodes int8 weights one sequence at a time, not a default.

XLA reads `XLA_FLAGS` once, at its first compilation, for TensorFlow's XLA and
JAX's alike: call `prefer_wide_vectors()` before anything compiles (a process
that compiled with XLA before keeps what it had). `XLA_FLAGS` that already name
a width are kept. `TFAM_CPU_FLAGS` (space-separated `/proc/cpuinfo` flags)
stands in for the CPU's flags, to try a choice on another machine's features.

Examples:
    >>> import keras_tfam
    >>> keras_tfam.cpu.prefer_wide_vectors()  # first thing, on a CPU with AVX-512
    True
    >>> keras_tfam.cpu.xla_cpu_vector_width()
    '512'
"""

import os

_WIDTH_FLAG = "--xla_cpu_prefer_vector_width"
# TensorFlow's switch for its pooling (BFC) allocator of CPU tensor memory, read at its first op, and the
# most that allocator holds, in MB (default: 65,536, less than the memory of some machines).
POOL_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"
POOL_LIMIT_VARIABLE = "TF_CPU_BFC_MEM_LIMIT_IN_MB"
_DEFAULT_POOL_LIMIT_MB = 65536


def cpu_flags():
    """The CPU's feature flags (`/proc/cpuinfo`, or `TFAM_CPU_FLAGS`), a set; empty where unknown.

    Examples:
        >>> sorted(cpu_flags() & {"avx2", "avx512f", "amx_bf16"})  # on a Xeon with AMX
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
    """Adds 512-bit vectors to `XLA_FLAGS` on a CPU with AVX-512, before anything compiles (see the module).

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
    """Whether one-row products here read bfloat16 weights as rows widened by their bits (see below).

    XLA's CPU backend has no bfloat16 matrix-vector kernel: it multiplies
    float32 copies of bfloat16 weights, so a bfloat16 model decodes one
    sequence no faster than float32. `keras_tfam.utils.rows_product` reads
    them at two bytes each instead, widening each weight by a 16-bit shift
    inside a product that runs on one thread. Measured in a decoding loop
    (`benchmarks/weight_rows.py`, BENCHMARKS.md "bfloat16 weights as rows"):
    2.0x the float32 product on a 2-core AVX2 EPYC; on a 2-core AVX-512
    Xeon 1.38x at 512-bit vectors, but 0.7-0.85x at XLA's default 256. So:
    on an x86 CPU with AVX2 and without AVX-512, or whose XLA compiles for
    512-bit vectors (`prefer_wide_vectors`); not where the CPU is unknown.
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


def pool_cpu_tensor_memory():
    """Asks TensorFlow to pool the CPU memory of its tensors, unless `TF_CPU_ALLOCATOR_USE_BFC` is set.

    TensorFlow's default CPU allocator hands each large freed block back to
    the system, so every training step maps its temporaries afresh and
    faults them in page by page: 300 steps of a 2-layer, 64-wide GPT-2 took
    2.9 million page faults and 10 of their 48 CPU-seconds in the kernel on
    a 2-core AMD EPYC. Its BFC allocator (the one it uses on GPUs) keeps
    freed blocks for the next step: 0.2 million faults, 2 kernel seconds,
    and nanoGPT's CPU recipe trained at 12,151-13,679 tokens/s against
    9,314-9,379 (BENCHMARKS.md, "Pooled tensor memory"). Freed memory then
    stays with the process for its next use; the peak resident memory of
    those runs moved by under 6%.

    Decoding too: each `generate` call's compiled loop allocates its
    temporaries (the weights copied as rows, a 16-bit model's weights widened
    for the prompt's products) afresh, and GPT-2 small's setup before the
    first token took a median 263 ms in float32 and 444 ms in bfloat16 with
    TensorFlow's default allocator, against 143 and 150 ms pooled, on a
    2-core EPYC (BENCHMARKS.md, "Pooled tensor memory for generation").

    TensorFlow reads the variable when it makes its first tensor: call this
    before that (importing TensorFlow, Keras or keras_tfam makes none).
    Importing keras_tfam calls it, and so do the `tfam` pipelines. A value
    already set, even `false`, is kept. TensorFlow caps its pool at 64 GB
    unless `TF_CPU_BFC_MEM_LIMIT_IN_MB` says otherwise; when pooling on a
    machine with more memory, that variable is set to it unless already set.

    Returns:
        Whether TensorFlow will pool (the variable is `true` or `1`).

    Examples:
        >>> import keras_tfam
        >>> keras_tfam.cpu.pool_cpu_tensor_memory()  # first thing, before any tensor
        True
    """
    os.environ.setdefault(POOL_VARIABLE, "true")
    if os.environ[POOL_VARIABLE].strip().lower() not in ("true", "1"):
        return False
    memory_mb = (physical_memory_bytes() or 0) // 2**20
    if memory_mb > _DEFAULT_POOL_LIMIT_MB:
        os.environ.setdefault(POOL_LIMIT_VARIABLE, str(memory_mb))
    return True


def physical_memory_bytes():
    """The machine's memory in bytes (`sysconf`), or `None` where unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
