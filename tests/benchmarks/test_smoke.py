"""Every maintained benchmark script (the table of benchmarks/README.md) runs end to end under `--smoke`.

A tiny model and a few steps, the peers outside the test install skipped: a refactor of the library that
breaks a script fails here, not on the day its table is remade. Each check reads what the run printed.
"""

import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.benchmarks

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BENCHMARKS = os.path.join(REPO, "benchmarks")
README = os.path.join(BENCHMARKS, "README.md")
TIMEOUT = 600  # seconds a smoke run may take on a slow, shared machine


def readme():
    with open(README, encoding="utf-8") as f:
        return f.read()


def maintained_scripts():
    """The backticked scripts in the first column of the README's table, in its order."""
    scripts = []
    for line in readme().splitlines():
        if line.startswith("| `"):
            scripts += re.findall(r"`([\w.-]+\.py)`", line.split("|")[1])
    return scripts


def helpers():
    """The files the README names as helpers (its paragraph "Helpers, not run on their own")."""
    paragraph = readme().split("Helpers, not run on their own:", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"`([\w.-]+)`", paragraph)


SCRIPTS = maintained_scripts()


def environment():
    """The smoke runs' environment: TensorFlow quiet, XLA compiling quickly rather than well, and the kernel path
    of a CPU without bfloat16 units (no measured choice)."""
    from pipelines.kernel_path import BFLOAT16_FLAGS, cpu_flags

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow", "PYTHONUNBUFFERED": "1"}
    if "xla_backend_optimization_level" not in env.get("XLA_FLAGS", ""):
        fast = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
        env["XLA_FLAGS"] = f"{fast} {env.get('XLA_FLAGS', '')}".strip()
    env.setdefault("TFAM_CPU_FLAGS", " ".join(sorted(cpu_flags() - set(BFLOAT16_FLAGS))))
    return env


def last_json(output):
    return json.loads(output.strip().splitlines()[-1])


def check_served(output):
    served = last_json(output)["served-float32"][0]
    return served["tokens_per_s"]["1"] > 0 and "keras_tfam" not in served["modules"]


def check_lengths(output):
    bounded, one_per_length = last_json(output)
    return 1 <= bounded["loops_kept"] <= one_per_length["loops_kept"] and one_per_length["seconds"] > 0


# What each script's smoke run must print: lines of its tables (the first group of a pattern, where it has one, a
# positive figure), or a check of the JSON of its last line. A script added to the README's table needs its entry.
CHECKS = {
    "run_all.py": [r"^#### Greedy decoding", r"^#### Training, nanoGPT", r"^\| keras_tfam-float32 \| ([\d.]+) \|"],
    "generate_vs_transformers.py": [r"^\| keras_tfam-int8 \| ([\d.]+) \|"],
    "nanogpt_cpu.py": lambda output: last_json(output)["keras_tfam"]["tokens_per_s"] > 0,
    "gpu_train.py": lambda output: next(iter(last_json(output)["results"].values()))["tokens_per_s"] > 0,
    "gpu_step_profile.py": [r"^token-loss-bf16-logits: [\d.]+ ms/step, ([\d,]+) tokens/s"],
    "generate.py": [r"^batch 1: keras_tfam +([\d.]+) tokens/s .* identical outputs: True$"],
    "train_step.py": [r"^ratio keras_tfam / keras-hub: ([\d.]+)x$"],
    "train_e2e.py": [r"^tfam train +\d+ tok/s .* ratio ([\d.]+)x$"],
    "attention.py": [r"^causal=True +keras_tfam +([\d.]+) ms"],
    "llama_import.py": [r"^greedy tok/s, batch 8 +([\d.]+)"],
    "long_attention.py": [
        r"^T= +32 +keras dense mask +([\d.]+) ms",
        r"^decode from position +32: ring .* ([\d.]+) us/",
    ],
    "attention_scaling.py": [r"^T= +16 +softmax +[\d.]+ ms .* linear +([\d.]+) ms"],
    "efficient_attention.py": [r"^ +64 +softmax +([\d.]+)", r"^ +1 +recomputed +([\d.]+)", r"^ +softmax .* ([\d.]+)$"],
    "transformer_xl.py": [r"speed-up ([\d.]+)x$"],
    "pooling_vs_gpt2.py": [r"^attention pooling .* test word perplexity +([\d.]+)$"],
    "knn_lm.py": [r"kNN-LM token ppl ([\d.]+) in"],
    "early_exit.py": [r"^\| classifier \| 0.50 \| ([\d.]+) \|", r"^reference: GPT2LM.generate .*: (\d+) tokens/s$"],
    "quantized_generate.py": [r"^float32 +[\d.]+ +\d+ +([\d.]+)", r"^int4 .* ([\d.]+) +[+-][\d.]+%$"],
    "quantize_time.py": [r"^\| keras-hub \| ([\d.]+) \|"],
    "served_generate.py": check_served,
    "speculative.py": [r"^\| keras_tfam \| lookup-2 \| 4 \| ([\d.]+) \| [\d.]+x \| True \|"],
    "prompt_lookup.py": [r"^\| keras_tfam-lookup-2 \| 4 \| ([\d.]+) \| .* True \|$"],
    "datastore_memory.py": [r"^ +from_model +([\d.]+)x"],
    "generate_lengths_memory.py": check_lengths,
    "data_pipeline.py": [r"^bpe .* stream/training +([\d,]+)x$"],
}


def passes(check, output):
    """Whether `output` passes `check` (an entry of `CHECKS`)."""
    if callable(check):
        return check(output)
    for pattern in check:
        match = re.search(pattern, output, re.M)
        assert match, f"no line matches {pattern!r}"
        if match.groups():
            assert float(match.group(1).replace(",", "")) > 0, f"not positive: {match.group(0)!r}"
    return True


def test_every_benchmark_script_is_in_the_readme_table_or_a_helper():
    named = set(SCRIPTS) | set(helpers())
    scripts = {name for name in os.listdir(BENCHMARKS) if name.endswith(".py")}
    assert scripts - named == set(), "benchmarks/README.md: add these to the table (or to the helpers)"
    assert set(SCRIPTS) - scripts == set(), "benchmarks/README.md names scripts that are not there"
    assert set(CHECKS) == set(SCRIPTS), "CHECKS: one line per script of the README's table"


# `--help` of every script in one process: TensorFlow (which several import first) is imported once.
HELP = """
import contextlib, io, json, runpy, sys
sys.path.insert(0, sys.argv[1])
helps = {}
for script in sys.argv[2:]:
    sys.argv, text = [script, "--help"], io.StringIO()
    try:
        with contextlib.redirect_stdout(text):
            runpy.run_path(script, run_name="__main__")
        code = "no exit"
    except SystemExit as exit_:
        code = exit_.code or 0
    helps[script] = {"code": code, "text": text.getvalue()}
print(json.dumps(helps))
"""


def test_every_script_has_a_help_with_the_smoke_switch():
    paths = [os.path.join(BENCHMARKS, script) for script in SCRIPTS]
    done = subprocess.run(
        [sys.executable, "-c", HELP, BENCHMARKS, *paths],
        cwd=REPO,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    helps = json.loads(done.stdout.strip().splitlines()[-1])
    for path in paths:
        assert helps[path]["code"] == 0, f"{path} --help: exit code {helps[path]['code']}"
        assert "--smoke" in helps[path]["text"], f"{path} --help names no --smoke:\n{helps[path]['text']}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_script_runs_end_to_end_in_smoke_mode(script):
    assert script in CHECKS, f"CHECKS has no line for {script}: what its smoke run must print"
    benchmarks_md = os.path.join(REPO, "BENCHMARKS.md")
    with open(benchmarks_md, "rb") as f:
        before = f.read()
    done = subprocess.run(
        [sys.executable, os.path.join("benchmarks", script), "--smoke"],
        cwd=REPO,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, f"{script} --smoke: exit code {done.returncode}\n{done.stderr[-4000:]}"
    assert passes(CHECKS[script], done.stdout), f"{script} --smoke printed:\n{done.stdout[-3000:]}"
    with open(benchmarks_md, "rb") as f:
        assert f.read() == before, f"{script} --smoke wrote into BENCHMARKS.md"
