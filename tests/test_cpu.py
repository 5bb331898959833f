"""The vector width XLA compiles for on this CPU: 512 bits on request where the CPU has AVX-512, never on
import alone, kept where the user set one, and taken by XLA itself (its dumped debug options). Whether it
is faster is the benchmarks' business."""

import glob
import os
import subprocess
import sys
import textwrap

import keras
import pytest

from keras_tfam import cpu
from keras_tfam.cpu import (
    POOL_LIMIT_VARIABLE,
    POOL_VARIABLE,
    bfloat16_rows_pay,
    cpu_flags,
    pool_cpu_tensor_memory,
    prefer_wide_vectors,
    xla_cpu_vector_width,
    xla_flags_with_vector_width,
)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


@pytest.mark.parametrize(
    "xla_flags, flags, expected",
    [
        ("", {"avx2", "avx512f"}, "--xla_cpu_prefer_vector_width=512"),
        ("--xla_dump_to=/tmp/d", {"avx512f"}, "--xla_dump_to=/tmp/d --xla_cpu_prefer_vector_width=512"),
        ("", {"avx2", "fma"}, ""),  # no AVX-512: XLA's default
        ("--xla_cpu_prefer_vector_width=256", {"avx512f"}, "--xla_cpu_prefer_vector_width=256"),  # the user's
        ("--xla_cpu_prefer_vector_width=512", {"avx2"}, "--xla_cpu_prefer_vector_width=512"),
    ],
)
def test_512_bit_vectors_are_added_only_with_avx512_and_no_width_set(xla_flags, flags, expected):
    assert xla_flags_with_vector_width(xla_flags, flags) == expected


@pytest.mark.parametrize(
    "flags, xla_flags, expected",
    [
        ("avx2 fma", "", True),  # measured 2.0x float32 on an AVX2 EPYC
        ("avx2 avx512f", "", False),  # 0.7-0.85x on an AVX-512 Xeon at XLA's default 256 bits
        ("avx2 avx512f", "--xla_cpu_prefer_vector_width=512", True),  # 1.38x there at 512
        ("", "", False),  # features unknown (another architecture)
    ],
)
def test_bfloat16_rows_are_chosen_where_they_measured_faster(monkeypatch, flags, xla_flags, expected):
    monkeypatch.setenv("TFAM_CPU_FLAGS", flags)
    monkeypatch.setenv("XLA_FLAGS", xla_flags)
    assert bfloat16_rows_pay() is expected


def test_the_width_in_force_is_read_back(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/d --xla_cpu_prefer_vector_width=512")
    assert xla_cpu_vector_width() == "512"
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/d")
    assert xla_cpu_vector_width() == "256"
    monkeypatch.setenv("TFAM_CPU_FLAGS", "sse4_2 avx512f")
    assert cpu_flags() == {"sse4_2", "avx512f"}


def test_asking_for_wide_vectors_says_whether_xla_will_use_them(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_prefer_vector_width=256")
    monkeypatch.setenv("TFAM_CPU_FLAGS", "avx2 avx512f")
    assert prefer_wide_vectors() is False and os.environ["XLA_FLAGS"] == "--xla_cpu_prefer_vector_width=256"
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setenv("TFAM_CPU_FLAGS", "avx2")
    assert prefer_wide_vectors() is False and os.environ["XLA_FLAGS"] == ""
    monkeypatch.setenv("TFAM_CPU_FLAGS", "avx2 avx512f")
    assert prefer_wide_vectors() is True and os.environ["XLA_FLAGS"] == "--xla_cpu_prefer_vector_width=512"


@pytest.mark.skipif(keras.config.backend() not in ("tensorflow", "jax"), reason="XLA compiles on TensorFlow and JAX")
def test_asking_for_wide_vectors_sets_the_width_xla_compiles_with(tmp_path):
    script = textwrap.dedent(
        """
        import os, keras_tfam, keras, numpy as np
        assert "vector_width" not in os.environ["XLA_FLAGS"], os.environ["XLA_FLAGS"]  # not on import alone
        assert keras_tfam.cpu.prefer_wide_vectors()
        if keras.config.backend() == "tensorflow":
            import tensorflow as tf
            tf.function(lambda x: x * 2.0, jit_compile=True)(np.ones(8, "float32"))
        else:
            import jax
            jax.jit(lambda x: x * 2.0)(np.ones(8, "float32")).block_until_ready()
        """
    )
    environment = {
        **os.environ,
        "TFAM_CPU_FLAGS": "avx2 avx512f",  # whatever this machine has
        "XLA_FLAGS": f"--xla_dump_to={tmp_path}",
        "KERAS_BACKEND": keras.config.backend(),
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO, env=environment
    )
    assert result.returncode == 0, result.stderr[-3000:]
    options = glob.glob(os.path.join(tmp_path, "*debug_options"))
    assert options, os.listdir(tmp_path)
    for path in options:
        with open(path) as f:
            assert "xla_cpu_prefer_vector_width: 512" in f.read()


@pytest.mark.parametrize("value, pooled", [(None, True), ("false", False), ("0", False), ("1", True), ("TRUE", True)])
def test_pooled_tensor_memory_is_asked_for_unless_the_user_said_otherwise(monkeypatch, value, pooled):
    if value is None:
        monkeypatch.delenv(POOL_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(POOL_VARIABLE, value)
    assert pool_cpu_tensor_memory() is pooled
    assert os.environ[POOL_VARIABLE] == ("true" if value is None else value)  # a value set is kept


@pytest.mark.parametrize("memory_gib, limit", [(128, "131072"), (16, None), (None, None)])
def test_the_pool_may_hold_the_machine_s_memory_where_it_has_more_than_tensorflow_s_64_gb(monkeypatch, memory_gib,
                                                                                         limit):
    monkeypatch.setenv(POOL_VARIABLE, "true")
    monkeypatch.delenv(POOL_LIMIT_VARIABLE, raising=False)
    monkeypatch.setattr(cpu, "physical_memory_bytes", lambda: memory_gib and memory_gib * 2**30)
    assert pool_cpu_tensor_memory()
    assert os.environ.get(POOL_LIMIT_VARIABLE) == limit
    monkeypatch.setenv(POOL_LIMIT_VARIABLE, "1000")  # the user's limit is kept
    pool_cpu_tensor_memory()
    assert os.environ[POOL_LIMIT_VARIABLE] == "1000"


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="TensorFlow's allocator")
def test_importing_keras_tfam_pools_tensorflow_s_cpu_memory():
    # TensorFlow reports memory statistics for its pooling (BFC) allocator only. (The pipelines pool on their
    # own, so the process imports keras_tfam alone; a user's `false` is kept: test_kernel_path.py.)
    script = textwrap.dedent(
        """
        import keras_tfam
        import tensorflow as tf
        tf.zeros(3)
        print(tf.config.experimental.get_memory_info("CPU:0")["current"] >= 0)
        """
    )
    environment = {key: value for key, value in os.environ.items() if key != POOL_VARIABLE}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO,
                            env={**environment, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True"]
