"""Small timing helpers shared by the benchmarks."""

import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WIKITEXT2 = os.path.join(HERE, "..", "..", "shared", "data", "wikitext-2")
SMOKE_HELP = "a tiny model and a few steps, the library's side only: checks the script runs; its figures mean nothing"
SMOKE_SKIP = "--smoke runs the library's side only"
SMOKE_TOKENS = 4  # new tokens per generation under --smoke
SMOKE_SIZES = {"num_layers": 1, "num_heads": 2, "hidden_dim": 32}  # the model under --smoke


def add_smoke(parser):
    """Adds `--smoke` (`SMOKE_HELP`) to the argparse `parser`."""
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)


def smoke_settings(args, **settings):
    """`args` (an argparse namespace) with `settings` in place of its options where `args.smoke` is on: the
    smallest model, lengths, steps and repeats that still run every part of the script."""
    if args.smoke:
        vars(args).update(settings)
    return args


def skipped(name, reason=SMOKE_SKIP):
    """Says that a case or peer did not run, and why."""
    print(f"{name}: skipped ({reason})", flush=True)


def smoke_folder(prefix):
    """A new temporary folder for what a `--smoke` run writes, removed when the process ends."""
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix=f"{prefix}-smoke-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def small_wikitext(folder, valid_lines=200, test_lines=80):
    """A WikiText-2 folder made in `folder` of the first lines of the shared validation and test splits (for
    `--smoke`); its path."""
    os.makedirs(folder, exist_ok=True)
    for split, count in (("valid", valid_lines), ("test", test_lines)):
        with open(os.path.join(WIKITEXT2, f"wiki.{split}.tokens"), encoding="utf-8") as f:
            lines = f.read().split("\n")[:count]
        with open(os.path.join(folder, f"wiki.{split}.tokens"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return folder


def tiny_gpt2_checkpoint(directory, vocabulary=50257, positions=128, width=16, layers=1, heads=2):
    """A GPT-2 of these sizes with random weights as a Hugging Face directory (`config.json`, `model.safetensors`),
    written with NumPy: what `--smoke` decodes in place of the GPT-2 small that transformers writes."""
    import numpy as np
    from safetensors.numpy import save_file

    shapes = {"wte.weight": (vocabulary, width), "wpe.weight": (positions, width)}
    for i in range(layers):
        for name, shape in (
            ("ln_1.weight", (width,)),
            ("attn.c_attn.weight", (width, 3 * width)),
            ("attn.c_proj.weight", (width, width)),
            ("ln_2.weight", (width,)),
            ("mlp.c_fc.weight", (width, 4 * width)),
            ("mlp.c_proj.weight", (4 * width, width)),
        ):
            shapes[f"h.{i}.{name}"] = shape
            shapes[f"h.{i}.{name.replace('weight', 'bias')}"] = shape[-1:]
    shapes.update({"ln_f.weight": (width,), "ln_f.bias": (width,)})
    rng = np.random.default_rng(0)
    norms = ("ln_1.weight", "ln_2.weight", "ln_f.weight")
    tensors = {
        f"transformer.{name}": (np.ones(shape) if name.endswith(norms) else rng.normal(0.0, 0.02, shape)).astype("f4")
        for name, shape in shapes.items()
    }
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, "model.safetensors"))
    config = {
        "model_type": "gpt2",
        "vocab_size": vocabulary,
        "n_positions": positions,
        "n_embd": width,
        "n_layer": layers,
        "n_head": heads,
    }
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def run_json(script, *arguments, cwd=None, python=None, timeout=None):
    """Runs `python script *arguments` in a fresh process (a peer or a precision of its own: torch and
    TensorFlow never share one), with this Python or `python` (a peers' venv); the JSON object its last
    line of output prints."""
    result = subprocess.run(
        [python or sys.executable, script, *map(str, arguments)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        timeout=timeout,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"{os.path.basename(script)} {' '.join(map(str, arguments))} failed (exit code {result.returncode}):\n"
            f"{result.stderr[-3000:]}"
        )
    return json.loads(result.stdout.strip().splitlines()[-1])


def interleaved_processes(script, cases, repeats, *arguments, python=None, smoke=False):
    """`{case: [result, ...]}`: `script --case CASE *arguments` run `repeats` times per case, each in a fresh
    process (`run_json`, with `python` if given), the cases alternating so that the machine's drift hits every
    case alike; with `smoke`, `--smoke` too."""
    arguments = (*arguments, "--smoke") if smoke else arguments
    results = {case: [] for case in cases}
    for _ in range(repeats):
        for case in cases:
            results[case].append(run_json(script, "--case", case, *arguments, python=python))
    return results


def case_arguments(description, cases, tokens=None, repeats=2, peers=False, options=None):
    """The options of a script that measures `cases` in fresh alternating processes (`interleaved_processes`):
    `--repeats` (processes per case, default `repeats`; the best counts), `--tokens` (new tokens per
    generation, default `tokens`; only where `tokens` is given), `--peers-python` (with `peers`: the Python of
    the peers' cases, default this one), `--smoke` (one process per case, `SMOKE_TOKENS` new tokens) and the
    hidden `--case` that one such process measures, the counts checked positive; `options(parser)`, if given,
    adds the script's own. In a `--case` process, Keras' warning for each layer without a `quantize` (norms,
    dropout) is silenced."""
    import argparse
    import warnings

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repeats", type=int, default=repeats, help="fresh processes per case; the best counts")
    counts = ["repeats"]
    if tokens is not None:
        parser.add_argument("--tokens", type=int, default=tokens, help="new tokens per generation")
        counts.append("tokens")
    if peers:
        parser.add_argument(
            "--peers-python", default=sys.executable, help="the Python of the peers (default: this one)"
        )
    add_smoke(parser)
    if options is not None:
        options(parser)
    parser.add_argument("--case", choices=cases, help=argparse.SUPPRESS)  # one measurement, in this process
    args = parser.parse_args()
    smoke_settings(args, repeats=1, **({"tokens": SMOKE_TOKENS} if tokens is not None else {}))
    for name in counts:
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer. Received: {getattr(args, name)}")
    if args.case:
        warnings.simplefilter("ignore")
    return args


def forwarded_options(args, *skip):
    """`args` (an argparse namespace) as command-line options for a script's own engine processes:
    `--name=value` for each set option, `--name` for a switch that is on; none of `skip` (names)."""
    options = []
    for key, value in vars(args).items():
        if key not in skip and value not in (None, False):
            flag = "--" + key.replace("_", "-")
            options.append(flag if value is True else f"{flag}={value}")
    return options


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


def refuse_non_positive(parser, args, *names):
    """`parser.error` (exit 2, one line) for the first option among `names` below 1."""
    for name in names:
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer. Received: {getattr(args, name)}")


def best_interleaved(functions, repeats, per_call=1):
    """`{name: best seconds per unit}` of each `fn()` in `functions`, called in turn `repeats` times.

    Interleaving the calls lets the machine's drift hit every function alike; `fn` must block until
    done (and be compiled already); `per_call` is how many units (steps) one call runs.
    """
    best = dict.fromkeys(functions, float("inf"))
    for _ in range(repeats):
        for name, fn in functions.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], (time.perf_counter() - start) / per_call)
    return best


def cpu_flags():
    """The CPU's feature flags from `/proc/cpuinfo`, a set (empty where unknown); read without importing TensorFlow."""
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    return set()


def cpu():
    """The CPU model, core count and the flags that pick kernels (AVX2, AVX-512, AVX-512 BF16, AMX)."""
    model, flags = platform.processor() or platform.machine(), cpu_flags()
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model in (platform.processor(), platform.machine()):
                    model = line.split(":", 1)[1].strip()
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
    present = " ".join(flag for flag in wanted if flag in flags) or "none of " + "/".join(wanted)
    return f"{model}, {os.cpu_count()} cores, flags: {present}"


def machine():
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    device = ", ".join(tf.config.experimental.get_device_details(g).get("device_name", "GPU") for g in gpus)
    return cpu() + (f", {device}" if device else ", no GPU") + f", TF {tf.__version__}"


def gpt2_small(precision="float32", **sizes):
    """GPT-2 small with random weights (seed 0) at `precision`: float32, bfloat16 or float16 weights
    (`keras_tfam.generation.with_dtype`), or int8 (Keras' `quantize("int8")`); `sizes` in place of its own."""
    import keras

    from keras_tfam.generation import with_dtype
    from keras_tfam.models import GPT2LM

    keras.utils.set_random_seed(0)
    model = GPT2LM.from_preset("gpt2_small", **sizes)
    if precision in ("bfloat16", "float16"):
        model = with_dtype(model, precision)
    elif precision == "int8":
        model.quantize("int8")
    elif precision != "float32":
        raise ValueError(f"precision must be float32, bfloat16, float16 or int8. Received: precision={precision!r}")
    return model


# GPT-2 small's 24 feed-forward kernels, `(K, N)`: what the one-row loops below multiply.
FEED_FORWARD_WIDTH, FEED_FORWARD_LAYERS = 768, 12
FEED_FORWARD_SHAPES = [
    (FEED_FORWARD_WIDTH, 4 * FEED_FORWARD_WIDTH),
    (4 * FEED_FORWARD_WIDTH, FEED_FORWARD_WIDTH),
] * FEED_FORWARD_LAYERS


def feed_forward_kernels(rng):
    """GPT-2 small's feed-forward kernels (`FEED_FORWARD_SHAPES`), float32 drawn from N(0, 0.02) by `rng`."""
    return [rng.standard_normal(shape).astype("float32") * 0.02 for shape in FEED_FORWARD_SHAPES]


def time_feed_forward_forms(products, rng, repeats, steps):
    """`(outputs, best)` of each form `{name: product(x, i)}` of the feed-forward products: its compiled
    `feed_forward_loop` of `steps` steps over one row drawn from `rng`, the loop's output (NumPy), and its best
    seconds per step over `repeats` interleaved series."""
    import numpy as np
    import tensorflow as tf

    x = tf.constant(rng.standard_normal((1, FEED_FORWARD_WIDTH)).astype("float32"))
    compiled = {name: feed_forward_loop(product, len(FEED_FORWARD_SHAPES), steps) for name, product in products.items()}
    outputs = {name: np.asarray(run(x)) for name, run in compiled.items()}  # compiles each
    best = best_interleaved(
        {name: lambda run=run: run(x).numpy() for name, run in compiled.items()}, repeats, per_call=steps
    )
    return outputs, best


def feed_forward_loop(product, count, steps):
    """A compiled `tf.while_loop` of `steps` steps over one row `h`, each step running `count // 2`
    feed-forward blocks with a residual, as decoding does: `h + 0.01 * product(relu(product(h, i)), i + 1)`
    for i = 0, 2, ... (`product(x, i)` multiplies by the i-th weight matrix)."""
    import tensorflow as tf

    @tf.function(jit_compile=True, autograph=False)
    def run(x):
        def body(step, h):
            for i in range(0, count, 2):
                h = h + 0.01 * product(tf.nn.relu(product(h, i)), i + 1)
            return step + 1, h

        return tf.while_loop(lambda step, h: step < steps, body, (tf.constant(0), x))[1]

    return run


def step_and_setup(model, ids, short=8, long=136, calls=4):
    """`{"step_ms", "setup_ms", "tokens_per_s", "tokens"}` of `model.generate(ids)`: the step from the best
    calls of `short` and `long` new tokens (`calls` each, interleaved, after a compiling call of each), the
    setup what the best `short` call took beyond its steps, tokens/s of a call of `long - short` new tokens,
    and the `long` call's tokens (a list per row)."""
    import numpy as np

    tokens = {new: np.asarray(model.generate(ids, max_new_tokens=new)) for new in (short, long)}  # compiles
    best = {}
    for _ in range(calls):
        for new in (short, long):
            start = time.perf_counter()
            np.asarray(model.generate(ids, max_new_tokens=new))
            best[new] = min(best.get(new, float("inf")), time.perf_counter() - start)
    step, setup = step_and_setup_of(best, short, long)
    new = long - short
    return {
        "step_ms": step * 1e3,
        "setup_ms": setup * 1e3,
        "tokens_per_s": new / (setup + new * step),
        "tokens": tokens[long].tolist(),
    }


def step_and_setup_of(best, short=8, long=136):
    """`(step, setup)` seconds from the best calls of `short` and `long` new tokens, `best[short]` and
    `best[long]`: the step their difference per token, the setup what the `short` call took beyond its steps."""
    step = (best[long] - best[short]) / (long - short)
    return step, best[short] - short * step


def median_step_and_setup(runs):
    """`(medians, setups)` of `step_and_setup` results from several processes: the median of each number
    over the processes (a dict), and each process's setup in ms, as text ("155, 187, 166")."""
    numbers = [key for key, value in runs[0].items() if isinstance(value, (int, float))]
    medians = {key: statistics.median(run[key] for run in runs) for key in numbers}
    return medians, ", ".join(f"{run['setup_ms']:.0f}" for run in runs)


def loop_arguments(description):
    """`--repeats` (interleaved series, default 5; the best counts) and `--steps` (loop steps per call, default
    32) of a script that times forms of a product in one compiled loop, both checked positive."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repeats", type=int, default=5, help="series of --steps steps each; the best counts")
    parser.add_argument("--steps", type=int, default=32, help="loop steps per call")
    args = parser.parse_args()
    refuse_non_positive(parser, args, "repeats", "steps")
    return args
