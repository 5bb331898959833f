"""The kernel path a run picks (XLA or oneDNN, float32 or bfloat16): it runs, it keeps what the user set,
and it is recorded. Which path is faster is the benchmarks' business, not the tests'."""

import json
import os

import tensorflow as tf

from pipelines.kernel_path import choose_kernel_path, cpu_flags, describe

ONE_DEVICE = tf.distribute.get_strategy()


def test_without_bfloat16_units_the_cpu_runs_xla_in_float32(monkeypatch):
    monkeypatch.setenv("TFAM_CPU_FLAGS", "sse4_2 avx2 fma")
    path = choose_kernel_path("auto", "auto", ONE_DEVICE, rows=64, width=32)
    assert (path["jit_compile"], path["precision"]) == (True, "float32")
    assert "without bfloat16 units (avx2)" in path["reason"] and "measured_ms" not in path
    # What the user set is kept.
    path = choose_kernel_path("off", "mixed_bfloat16", ONE_DEVICE, rows=64, width=32)
    assert (path["jit_compile"], path["precision"]) == (False, "mixed_bfloat16")
    assert describe(path).startswith("kernel path: TensorFlow graph (oneDNN), mixed_bfloat16 (")


def test_with_bfloat16_units_each_open_path_is_measured_and_the_fastest_kept(monkeypatch):
    monkeypatch.setenv("TFAM_CPU_FLAGS", "avx2 avx512f avx512_bf16")
    assert "avx512_bf16" in cpu_flags()
    path = choose_kernel_path("auto", "auto", ONE_DEVICE, rows=64, width=32)
    measured = path["measured_ms"]
    assert set(measured) == {"xla/float32", "xla/mixed_bfloat16", "onednn/float32", "onednn/mixed_bfloat16"}
    assert all(ms > 0 for ms in measured.values())
    chosen = f"{'xla' if path['jit_compile'] else 'onednn'}/{path['precision']}"
    # The fastest of the chosen precision; bfloat16 only if it beat float32's best by the margin.
    assert measured[chosen] == min(ms for key, ms in measured.items() if key.endswith(path["precision"]))
    if path["precision"] == "mixed_bfloat16":
        assert min(measured["xla/float32"], measured["onednn/float32"]) > 1.15 * measured[chosen]
    # A setting the user gave is not measured against.
    path = choose_kernel_path("off", "float32", ONE_DEVICE, rows=64, width=32)
    assert set(path["measured_ms"]) == {"onednn/float32"}
    assert (path["jit_compile"], path["precision"]) == (False, "float32")


def test_a_run_records_its_kernel_path(trained_run):
    with open(os.path.join(trained_run, "summary.json")) as f:
        path = json.load(f)["kernel_path"]
    with open(os.path.join(trained_run, "config.json")) as f:
        config = json.load(f)
    assert config["precision"] == "auto" and config["jit"] == "off"
    assert path["jit_compile"] is False  # as the run asked
    assert path["precision"] in ("float32", "mixed_bfloat16") and path["reason"]
