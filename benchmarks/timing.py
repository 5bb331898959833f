"""Small timing helpers shared by the benchmarks."""

import platform
import statistics
import time

import os


def median_seconds(fn, warmup=3, repeats=10):
    """Median wall time of `fn()` after `warmup` calls; `fn` must block until done."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def machine():
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    device = ", ".join(tf.config.experimental.get_device_details(g).get("device_name", "GPU") for g in gpus)
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores" + (
        f", {device}" if device else ", no GPU"
    ) + f", TF {tf.__version__}"
