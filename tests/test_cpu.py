"""Process settings: nothing changed on import (the user's backend and environment are theirs), pooled tensor
memory and 512-bit vectors on request (`cpu.configure`), a user's own settings kept, and the width taken by XLA
itself (its dumped debug options). Whether any of it is faster is the benchmarks' business."""

import glob
import json
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
    configure,
    cpu_flags,
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
        ("avx2 fma", "", True),
        ("avx2 avx512f", "", False),  # XLA's default 256 bits on an AVX-512 CPU
        ("avx2 avx512f", "--xla_cpu_prefer_vector_width=512", True),
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
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert configure() == {"pooled_tensor_memory": pooled, "xla_cpu_vector_width": "256"}
    assert os.environ[POOL_VARIABLE] == ("true" if value is None else value)  # a value set is kept
    assert "XLA_FLAGS" not in os.environ  # no vectors asked for


def test_configure_asks_for_wide_vectors_only_when_told_and_refuses_non_booleans(monkeypatch):
    monkeypatch.setenv("TFAM_CPU_FLAGS", "avx2 avx512f")
    monkeypatch.setenv(POOL_VARIABLE, "false")
    monkeypatch.setenv("XLA_FLAGS", "")
    assert configure(pool_tensor_memory=False, wide_vectors=True) == {
        "pooled_tensor_memory": False,
        "xla_cpu_vector_width": "512",
    }
    for name in ("pool_tensor_memory", "wide_vectors"):
        with pytest.raises(ValueError, match=f"`{name}` must be True or False. Received: {name}='yes'"):
            configure(**{name: "yes"})


@pytest.mark.parametrize("memory_gib, limit", [(128, "131072"), (16, None), (None, None)])
def test_the_pool_may_hold_the_machine_s_memory_where_it_has_more_than_tensorflow_s_64_gb(
    monkeypatch, memory_gib, limit
):
    monkeypatch.setenv(POOL_VARIABLE, "true")
    monkeypatch.delenv(POOL_LIMIT_VARIABLE, raising=False)
    monkeypatch.setattr(cpu, "physical_memory_bytes", lambda: memory_gib and memory_gib * 2**30)
    assert configure()["pooled_tensor_memory"]
    assert os.environ.get(POOL_LIMIT_VARIABLE) == limit
    monkeypatch.setenv(POOL_LIMIT_VARIABLE, "1000")  # the user's limit is kept
    configure()
    assert os.environ[POOL_LIMIT_VARIABLE] == "1000"


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_importing_keras_tfam_first_keeps_the_user_s_backend_and_environment(tmp_path, backend):
    # The backend `~/.keras/keras.json` names, with no KERAS_BACKEND set. The environment after importing keras_tfam
    # and the pipelines first is the one importing Keras alone leaves (Keras sets a few variables of its own).
    (tmp_path / ".keras").mkdir()
    (tmp_path / ".keras" / "keras.json").write_text(json.dumps({"backend": backend}))
    script = textwrap.dedent(
        """
        import json, os, sys
        before = dict(os.environ)
        if sys.argv[1] == "keras_tfam":
            import keras_tfam, pipelines
        import keras
        changed = {k: os.environ.get(k) for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)}
        print(json.dumps([keras.config.backend(), changed]))
        """
    )
    environment = {key: value for key, value in os.environ.items() if key not in ("KERAS_BACKEND", "KERAS_HOME")}
    environment.update(HOME=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="3")
    answers = []
    for first in ("keras_tfam", "keras"):
        result = subprocess.run(
            [sys.executable, "-c", script, first],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
            env=environment,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        answers.append(json.loads(result.stdout.splitlines()[-1]))
    assert answers[0] == answers[1] and answers[0][0] == backend
