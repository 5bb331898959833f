"""The CPU keras_tfam runs on: its feature flags, and the vector width XLA compiles for.

XLA's CPU backend prefers 256-bit vectors on x86 (`--xla_cpu_prefer_vector_width`,
default 256), a default made for the Intel CPUs whose clocks drop under 512-bit
instructions. On a CPU with AVX-512, importing keras_tfam adds
`--xla_cpu_prefer_vector_width=512` to `XLA_FLAGS`, for TensorFlow's XLA and
JAX's alike. The product that decodes int8 weights one token at a time
converts each weight as it reads it, and twice as many conversions per
instruction make GPT-2 small's int8 decoding at batch 1 about 1.2x faster on a
2-core Xeon with AVX-512 (BENCHMARKS.md, "Wider vectors"); float32 decoding
moves a little, and training not beyond the machine's noise.

`XLA_FLAGS` that already name a width are kept (`--xla_cpu_prefer_vector_width=256`
keeps XLA's default). XLA reads `XLA_FLAGS` once, at its first compilation: a
process that compiled with XLA before importing keras_tfam keeps what it had.
`TFAM_CPU_FLAGS` (space-separated `/proc/cpuinfo` flags) stands in for the
CPU's flags, to try a choice on another machine's features.
"""

import os

_WIDTH_FLAG = "--xla_cpu_prefer_vector_width"


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
    """Adds 512-bit vectors to `XLA_FLAGS` on a CPU with AVX-512 (see the module); called on import."""
    current = os.environ.get("XLA_FLAGS", "")
    chosen = xla_flags_with_vector_width(current, cpu_flags())
    if chosen != current:
        os.environ["XLA_FLAGS"] = chosen


def xla_cpu_vector_width():
    """The vector width XLA's CPU backend compiles for in this process, as `XLA_FLAGS` sets it
    (`"256"` when it names none: XLA's default on x86), a string for a run's record."""
    for flag in os.environ.get("XLA_FLAGS", "").split():
        if flag.startswith(_WIDTH_FLAG + "="):
            return flag.split("=", 1)[1]
    return "256"
