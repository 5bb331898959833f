"""The kernel path of a run: XLA or TensorFlow's own (oneDNN) graph, float32 or bfloat16 compute.

`tfam train --jit auto --precision auto` (the defaults) picks them per machine:

- On a GPU: XLA, and `mixed_bfloat16` where the GPU has bfloat16 units (compute capability 8.0 and up).
- On a CPU without bfloat16 units (AVX2; AVX-512 without BF16): XLA and float32, since bfloat16 is
  emulated there and XLA fuses the float32 step.
- On a CPU with bfloat16 units (AMX, AVX-512 BF16): a short measurement of the run's own training step
  (its model, optimizer and batch shape, on random ids) on each open path. oneDNN has AMX kernels for
  large bfloat16 products but runs the step op by op; XLA fuses it but has no AMX kernels, so which wins
  depends on the model. bfloat16 wins only where it beats float32 by `BFLOAT16_MARGIN`, since it also
  rounds the activations. Setting both `--jit` and `--precision` skips the measurement.
- Across several devices on CPUs (MirroredStrategy, multi-worker): no XLA (its collectives are not
  there), float32.

On a CPU, an XLA path records the vector width XLA compiles for (`xla_cpu_vector_width`: 256 bits
unless `XLA_FLAGS` names another, `keras_tfam.cpu`), and every path whether TensorFlow pools its tensor
memory (`cpu_tensor_memory`, as TensorFlow is seen to behave: `cpu_tensor_memory_pooled`). The choice
and why are printed and written to the run's summary (`kernel_path`); an explicit `--jit on|off` or
`--precision ...` is kept as given. A resumed run keeps the path it started with (`kernel_path.json` in
the run directory), so its steps compute as before the interruption. Master weights, softmax, norms and
the loss stay float32 under `mixed_bfloat16`, as Keras' mixed precision does.

The flags can be overridden with `TFAM_CPU_FLAGS` (space-separated `/proc/cpuinfo` flags), to check
the measured path on a machine without the units.
"""

import os
import time

import keras
import numpy as np
import tensorflow as tf

from keras_tfam.cpu import cpu_flags, xla_cpu_vector_width
from keras_tfam.losses import TokenCrossEntropy

# Flags of CPUs with bfloat16 matrix units: AMX tiles, or AVX-512 BF16 dot products.
BFLOAT16_FLAGS = ("amx_bf16", "avx512_bf16")
# bfloat16 is chosen only when its step is this much faster than float32's.
BFLOAT16_MARGIN = 1.15


def training_step_seconds(
    build_model, build_optimizer, batch_size, length, vocabulary_size, jit_compile, policy, min_steps=2, min_seconds=0.5
):
    """Median seconds of `train_on_batch` of a fresh `build_model()` under the dtype `policy`, on random ids.

    At least `min_steps` steps, and more (up to 50) until `min_seconds` have passed: small models are
    timed over many steps, large ones over a few.

    The model and optimizer are built for the measurement only (then dropped),
    under `policy` as the run would build them; the first step compiles and is
    not counted. The global dtype policy is restored afterwards.
    """
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = build_model()
        model.compile(
            optimizer=build_optimizer(),
            loss=TokenCrossEntropy(),
            jit_compile=jit_compile,
        )
        ids = np.random.default_rng(0).integers(0, vocabulary_size, size=(batch_size, length + 1)).astype("int32")
        inputs, targets = ids[:, :-1], ids[:, 1:]
        model.train_on_batch(inputs, targets)  # compiles
        times = []
        while len(times) < min_steps or sum(times) < min_seconds and len(times) < 50:
            start = time.perf_counter()
            model.train_on_batch(inputs, targets)
            times.append(time.perf_counter() - start)
        return float(np.median(times))
    finally:
        keras.mixed_precision.set_global_policy(previous)


def _gpu_has_bfloat16():
    for gpu in tf.config.list_physical_devices("GPU"):
        capability = tf.config.experimental.get_device_details(gpu).get("compute_capability", (0, 0))
        if tuple(capability) < (8, 0):
            return False
    return True


def choose_kernel_path(jit, precision, strategy, step_seconds):
    """`{"jit_compile": bool, "precision": str, "reason": str, ...}` for a run's settings.

    `jit` is "auto", "on" or "off"; `precision` "auto" or a Keras dtype policy name;
    `step_seconds(jit_compile, policy)` times the run's training step on a path
    (`training_step_seconds`), called only where a measurement decides.
    """
    multi_device = strategy.num_replicas_in_sync > 1 or isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    chosen = {
        "jit_compile": None if jit == "auto" else jit == "on",
        "precision": None if precision == "auto" else precision,
    }
    if None not in chosen.values():
        return _fill(chosen, None, None, "as set")
    if tf.config.list_logical_devices("GPU"):
        return _fill(chosen, True, "mixed_bfloat16" if _gpu_has_bfloat16() else "float32", "GPU")
    if multi_device:
        return _fill(chosen, False, "float32", "several CPU devices: no XLA collectives")
    flags = cpu_flags()
    units = [flag for flag in BFLOAT16_FLAGS if flag in flags]
    if not units:
        return _fill(chosen, True, "float32", "CPU without bfloat16 units (" + _isa(flags) + "): XLA, float32")
    # bfloat16 units: measure the paths still open.
    jits = [chosen["jit_compile"]] if chosen["jit_compile"] is not None else [True, False]
    precisions = [chosen["precision"]] if chosen["precision"] is not None else ["float32", "mixed_bfloat16"]
    timings = {
        (jit_compile, policy): step_seconds(jit_compile, policy) for jit_compile in jits for policy in precisions
    }
    # Per precision, its fastest (seconds, jit_compile).
    best = {p: min((s, j) for (j, q), s in timings.items() if q == p) for p in precisions}
    if len(best) == 1:
        (policy,) = best
    else:
        faster = best["float32"][0] > BFLOAT16_MARGIN * best["mixed_bfloat16"][0]
        policy = "mixed_bfloat16" if faster else "float32"
    measured = {f"{'xla' if j else 'onednn'}/{p}": round(s * 1e3, 3) for (j, p), s in timings.items()}
    return {
        "jit_compile": best[policy][1],
        "precision": policy,
        "reason": f"CPU with {', '.join(units)}: measured (the training step, ms)",
        "measured_ms": measured,
    }


def _isa(flags):
    return next((name for name in ("avx512f", "avx2") if name in flags), "no AVX2")


def _fill(chosen, jit_compile, precision, reason):
    return {
        "jit_compile": jit_compile if chosen["jit_compile"] is None else chosen["jit_compile"],
        "precision": precision if chosen["precision"] is None else chosen["precision"],
        "reason": reason,
    }


def with_cpu_settings(path):
    """`path` with how this process runs a step on a CPU, where it runs on one: the vector width XLA compiles
    for (an XLA path; `keras_tfam.cpu`), and whether tensor memory is pooled (`cpu_tensor_memory`)."""
    path = {key: value for key, value in path.items() if key not in ("xla_cpu_vector_width", "cpu_tensor_memory")}
    if tf.config.list_logical_devices("GPU"):
        return path
    if path["jit_compile"]:
        path["xla_cpu_vector_width"] = int(xla_cpu_vector_width())
    path["cpu_tensor_memory"] = "pooled" if cpu_tensor_memory_pooled() else "TensorFlow's default"
    return path


def cpu_tensor_memory_pooled():
    """Whether this process's TensorFlow keeps freed CPU tensor memory for reuse, seen by what it does: a
    tensor larger than any the system allocator keeps is made and freed, and the process's resident memory
    read before and after the free (`_released_bytes`).

    The allocator TensorFlow uses is not public, nor is its choice a single switch: `TF_CPU_ALLOCATOR_USE_BFC`
    counts only when set before the first tensor, and where oneDNN is on (by default on CPUs with AVX-512
    VNNI, BF16 or AMX) TensorFlow's oneDNN allocator pools large blocks whatever that variable says. Where
    resident memory cannot be read (no `/proc`), whether TensorFlow keeps allocator statistics (its pools do).
    """
    released = _released_bytes()
    if released is not None:
        return released < _PROBE_BYTES // 2
    try:
        tf.config.experimental.get_memory_info("CPU:0")
    except ValueError:
        return False
    return True


# Above the largest block the C library's allocator keeps for reuse (its mmap threshold tops out at 32 MiB).
_PROBE_BYTES = 64 * 2**20


def _resident_bytes():
    """The process's resident memory in bytes (`/proc/self/statm`), or `None` where unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _released_bytes():
    """How much resident memory freeing a `_PROBE_BYTES` CPU tensor gave back to the system, or `None`."""
    with tf.device("CPU:0"):
        tensor = tf.fill([_PROBE_BYTES // 4], 1.0)  # written, so every page is resident
    before = _resident_bytes()
    del tensor
    after = _resident_bytes()
    return None if before is None or after is None else before - after


def describe(path):
    """One line for the run's output: `kernel path: XLA, float32 (why)`, with XLA's CPU vector width and
    the pooled tensor memory where known."""
    vectors = f", {path['xla_cpu_vector_width']}-bit vectors" if path.get("xla_cpu_vector_width") else ""
    pooled = ", pooled tensor memory" if path.get("cpu_tensor_memory") == "pooled" else ""
    kind = "XLA" if path["jit_compile"] else "TensorFlow graph (oneDNN)"
    return f"kernel path: {kind}{vectors}, {path['precision']}{pooled} ({path['reason']})"
