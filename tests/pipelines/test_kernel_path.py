"""The kernel path a run picks (XLA or oneDNN, float32 or bfloat16): it runs, it keeps what the user set,
it is recorded, and a resumed run keeps it. Which path is faster is the benchmarks' business, not the tests'."""

import importlib
import json
import os
import subprocess
import sys
import textwrap

import keras
import pytest
import tensorflow as tf

from keras_tfam.models import GPT2LM
from pipelines.config import TrainConfig
from pipelines.kernel_path import choose_kernel_path, cpu_flags, describe, training_step_seconds, with_cpu_settings
from pipelines.training import KERNEL_PATH_FILE, _kernel_path

ONE_DEVICE = tf.distribute.get_strategy()


def not_measured(jit_compile, policy):
    raise AssertionError(f"measured {jit_compile}/{policy} where nothing was to be measured")


def timings(table):
    """A `step_seconds` answering from `{"xla/float32": seconds, ...}`, recording what was asked."""
    asked = []

    def step_seconds(jit_compile, policy):
        key = f"{'xla' if jit_compile else 'onednn'}/{policy}"
        asked.append(key)
        return table[key]

    return step_seconds, asked


def test_without_bfloat16_units_the_cpu_runs_xla_in_float32(monkeypatch):
    monkeypatch.setenv("TFAM_CPU_FLAGS", "sse4_2 avx2 fma")
    path = choose_kernel_path("auto", "auto", ONE_DEVICE, not_measured)
    assert (path["jit_compile"], path["precision"]) == (True, "float32")
    assert "without bfloat16 units (avx2)" in path["reason"] and "measured_ms" not in path
    # What the user set is kept.
    path = choose_kernel_path("off", "mixed_bfloat16", ONE_DEVICE, not_measured)
    assert (path["jit_compile"], path["precision"]) == (False, "mixed_bfloat16")
    assert describe(path).startswith("kernel path: TensorFlow graph (oneDNN), mixed_bfloat16 (")


@pytest.mark.parametrize(
    "table, chosen",
    [
        # A small model (nanoGPT's CPU recipe on an AMX Xeon): XLA's fused float32 step wins.
        (
            {
                "xla/float32": 0.046,
                "xla/mixed_bfloat16": 0.051,
                "onednn/float32": 0.057,
                "onednn/mixed_bfloat16": 0.053,
            },
            "xla/float32",
        ),
        # A large one: oneDNN's bfloat16 matmuls win by more than the margin.
        (
            {"xla/float32": 2.0, "xla/mixed_bfloat16": 2.4, "onednn/float32": 2.2, "onednn/mixed_bfloat16": 1.0},
            "onednn/mixed_bfloat16",
        ),
        # bfloat16 faster, but by less than the margin: float32 (it does not round the activations).
        (
            {"xla/float32": 1.1, "xla/mixed_bfloat16": 1.3, "onednn/float32": 1.5, "onednn/mixed_bfloat16": 1.0},
            "xla/float32",
        ),
    ],
)
def test_with_bfloat16_units_each_open_path_is_measured_and_the_fastest_kept(monkeypatch, table, chosen):
    monkeypatch.setenv("TFAM_CPU_FLAGS", "avx2 avx512f avx512_bf16")
    assert "avx512_bf16" in cpu_flags()
    step_seconds, asked = timings(table)
    path = choose_kernel_path("auto", "auto", ONE_DEVICE, step_seconds)
    assert sorted(asked) == sorted(table)
    assert f"{'xla' if path['jit_compile'] else 'onednn'}/{path['precision']}" == chosen
    assert path["measured_ms"] == {key: round(seconds * 1e3, 3) for key, seconds in table.items()}
    # A setting the user gave is not measured against.
    step_seconds, asked = timings(table)
    path = choose_kernel_path("off", "float32", ONE_DEVICE, step_seconds)
    assert asked == [] and (path["jit_compile"], path["precision"]) == (False, "float32")
    step_seconds, asked = timings(table)
    path = choose_kernel_path("off", "auto", ONE_DEVICE, step_seconds)
    assert sorted(asked) == ["onednn/float32", "onednn/mixed_bfloat16"] and path["jit_compile"] is False


def test_the_measurement_times_the_runs_own_step_and_restores_the_dtype_policy():
    built = []

    def build():
        built.append(keras.mixed_precision.global_policy().name)
        return GPT2LM(vocabulary_size=32, num_layers=1, num_heads=2, hidden_dim=16, max_sequence_length=8)

    seconds = training_step_seconds(
        build, lambda: keras.optimizers.AdamW(1e-3), 2, 8, 32, False, "mixed_bfloat16", min_steps=2, min_seconds=0.0
    )
    assert seconds > 0 and built == ["mixed_bfloat16"]
    assert keras.mixed_precision.global_policy().name == "float32"


def test_a_run_measures_its_own_model_and_optimizer_on_each_open_path(tmp_path, monkeypatch):
    monkeypatch.setenv("TFAM_CPU_FLAGS", "avx2 avx512f amx_bf16")
    config = TrainConfig(
        out=str(tmp_path),
        jit="off",
        sequence_length=8,
        batch_size=2,
        model_options={"num_layers": 1, "num_heads": 2, "hidden_dim": 16},
    )
    path = _kernel_path(str(tmp_path), config, ONE_DEVICE, 64)
    assert set(path["measured_ms"]) == {"onednn/float32", "onednn/mixed_bfloat16"}
    assert path["jit_compile"] is False and "amx_bf16: measured (the training step" in path["reason"]
    assert keras.mixed_precision.global_policy().name == "float32"  # the run sets its own afterwards


def test_a_run_records_its_kernel_path(trained_run):
    with open(os.path.join(trained_run, "summary.json")) as f:
        path = json.load(f)["kernel_path"]
    with open(os.path.join(trained_run, "config.json")) as f:
        config = json.load(f)
    assert config["precision"] == "auto" and config["jit"] == "off"
    assert path["jit_compile"] is False  # as the run asked
    assert path["precision"] in ("float32", "mixed_bfloat16") and path["reason"]
    with open(os.path.join(trained_run, KERNEL_PATH_FILE)) as f:
        assert json.load(f) == path


def test_a_resumed_run_keeps_the_path_it_started_with(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TFAM_CPU_FLAGS", "avx2")  # a new choice would be XLA, float32
    config = TrainConfig(out=str(tmp_path))
    recorded = {"jit_compile": False, "precision": "mixed_bfloat16", "reason": "measured at the run's start"}
    (tmp_path / KERNEL_PATH_FILE).write_text(json.dumps(recorded))
    assert _kernel_path(str(tmp_path), config, ONE_DEVICE, 64) == recorded
    # A damaged record is not trusted: the path is chosen again.
    for damaged in ('{"jit_compile": fal', '{"jit_compile": "no", "precision": "float32"}'):
        (tmp_path / KERNEL_PATH_FILE).write_text(damaged)
        path = _kernel_path(str(tmp_path), config, ONE_DEVICE, 64)
        assert (path["jit_compile"], path["precision"]) == (True, "float32")
        assert f"{KERNEL_PATH_FILE} is damaged: choosing the kernel path again" in capsys.readouterr().err


def test_an_xla_path_on_a_cpu_records_the_vector_width_in_force(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_prefer_vector_width=512")
    path = with_cpu_settings(choose_kernel_path("on", "float32", ONE_DEVICE, not_measured))
    assert path["xla_cpu_vector_width"] == 512
    assert describe(path).startswith("kernel path: XLA, 512-bit vectors, float32")
    # A resumed run's record is brought up to this process; the graph path has no XLA vectors.
    monkeypatch.setenv("XLA_FLAGS", "")
    assert with_cpu_settings(path)["xla_cpu_vector_width"] == 256
    graph = with_cpu_settings({**path, "jit_compile": False})
    assert "xla_cpu_vector_width" not in graph and "vectors" not in describe(graph)


def test_importing_the_pipelines_leaves_the_environment_alone(monkeypatch):
    import pipelines

    monkeypatch.delenv("TF_CPU_ALLOCATOR_USE_BFC", raising=False)
    before = dict(os.environ)
    importlib.reload(pipelines)
    assert dict(os.environ) == before


# (TF_CPU_ALLOCATOR_USE_BFC, TF_ENABLE_ONEDNN_OPTS) -> pooled. oneDNN is on by default on the CPUs with AVX-512
# VNNI, BF16 or AMX and off elsewhere, so each case names it: the same answers on every machine kind. With oneDNN
# on, TensorFlow's CPU allocator is oneDNN's, which pools large blocks whatever the first variable says.
POOLING = [("false", "0", False), ("true", "0", True), ("false", "1", True), ("true", "1", True)]


@pytest.mark.parametrize("use_bfc, onednn, pooled", POOLING)
def test_a_cpu_run_records_whether_tensorflow_pools_its_tensor_memory(use_bfc, onednn, pooled):
    # Asked in a fresh process (the allocator is chosen at a process's first tensor), and checked against what
    # the process's resident memory does when a large tensor is freed: kept when pooled, given back otherwise.
    script = textwrap.dedent("""
        import json, os
        import tensorflow as tf
        from pipelines.kernel_path import cpu_tensor_memory_pooled, describe, with_cpu_settings

        def resident():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

        tf.ones((512, 512)) @ tf.ones((512, 512))
        path = with_cpu_settings({"jit_compile": True, "precision": "float32", "reason": "as set"})
        blocks = [tf.fill([2**25], 2.0) for _ in range(4)]  # 512 MiB, resident
        held = resident()
        del blocks
        kept = held - resident() < 2**28
        print(json.dumps([cpu_tensor_memory_pooled(), kept, path, describe(path)]))
    """)
    environment = {
        **os.environ,
        "TF_CPU_ALLOCATOR_USE_BFC": use_bfc,
        "TF_ENABLE_ONEDNN_OPTS": onednn,
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        env=environment,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    recorded, kept, path, line = json.loads(done.stdout.splitlines()[-1])
    assert recorded is kept is pooled
    assert path["cpu_tensor_memory"] == ("pooled" if pooled else "TensorFlow's default")
    assert ("pooled" in line) is pooled
