"""Efficient attention: time and memory vs length, reversible memory vs depth, mini-protocol quality.

    python benchmarks/efficient_attention.py speed [--lengths 1024 2048 4096 8192 16384] [--mode both]
    python benchmarks/efficient_attention.py reversible [--depths 2 12 --length 1024 --batch 4]
    python benchmarks/efficient_attention.py quality [--cpu-minutes 4]

`speed`: one attention layer (batch 1, width 256, 4 heads of 64), forward +
backward (gradients for the input and every weight) in one XLA-compiled
`tf.function`, for each family: `softmax` (keras_tfam's exact
`MultiHeadAttention`), `linear` (exact linear attention, elu), `performer`
(FAVOR+, 256 features), `rfa` (128 random frequencies, gated when causal),
`linformer` (k = 256; bidirectional only: it is not causal), `lsh`
(2 rounds, chunks of 64, T/32 buckets as Reformer's b = 2T/chunk), `routing`
(sqrt(T) clusters, chunks of 64). Each configuration runs in its own process:
median time of the warm step, TensorFlow's allocator peak during the warm
steps (live tensors and XLA buffers), and the process's peak resident memory
from the first step (compilation included) on, above what it held before
(Linux `VmHWM`, reset through `/proc/self/clear_refs`). Ratios against
softmax and against linear attention, measured in the same run.

`reversible`: peak memory of a training step (loss, gradients of every
weight, XLA) of `ReversibleStack`s of 2 and 12 causal blocks (width 128,
4 heads, batch 4 x 1024 tokens), recomputing (`reversible=True`) or storing
activations (the same blocks, `reversible=False`: a standard residual stack).

`quality`: the mini protocol (vocabulary and training on the WikiText-2
*validation* split, evaluation on the *test* split: not WikiText-2 test
perplexity): GPT-2 tiny (4 layers, width 256, 4 heads, 128-token blocks,
batch 16, AdamW, dropout 0.1, XLA) with each causal family, the same
budget of training each, then word-level perplexity on the whole test split
in 128-token blocks (as `tfam eval`). The budget is CPU time of the training
process after its first (compiling) step, the stand-in for wall-clock on a
machine that others share: 4 CPU-minutes are about 2 minutes of an idle
2-core CPU.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILIES = ("softmax", "linear", "performer", "rfa", "linformer", "lsh", "routing")
CAUSAL_FAMILIES = tuple(f for f in FAMILIES if f != "linformer")
WIDTH, HEADS = 256, 4


def make_attention(family, length, causal, width=WIDTH, heads=HEADS):
    """One attention layer of `family` for sequences of `length`."""
    from keras_tfam.layers import (
        LinearAttention,
        LinformerAttention,
        LSHAttention,
        MultiHeadAttention,
        PerformerAttention,
        RandomFeatureAttention,
        RoutingAttention,
    )

    head = width // heads
    return {
        "softmax": lambda: MultiHeadAttention(heads, head),
        "linear": lambda: LinearAttention(heads, head),
        "performer": lambda: PerformerAttention(heads, head, num_features=256, seed=0),
        "rfa": lambda: RandomFeatureAttention(heads, head, num_features=128, gating=causal, seed=0),
        "linformer": lambda: LinformerAttention(heads, head, sequence_length=length, projected_length=256),
        "lsh": lambda: LSHAttention(
            heads, head, num_buckets=max(2, length // 32), num_hashes=2, chunk_length=64, seed=0
        ),
        "routing": lambda: RoutingAttention(
            heads, head, num_clusters=max(2, round(math.sqrt(length))), chunk_length=64, seed=0
        ),
    }[family]()


# ---------------------------------------------------------------- measurement in a child process


class CpuBudget(keras.callbacks.Callback):
    """Stops training once the steps after the first have used `seconds` of the process's CPU time.

    CPU time (all threads), not wall-clock: on a shared machine the
    wall-clock a step takes depends on the other users, its CPU time much
    less. On an idle 2-core machine a CPU budget `s` is about `s / 2` of
    wall-clock. The first step, XLA compilation, is not counted.
    """

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def on_train_begin(self, logs=None):
        self.start, self.steps, self.used = None, 0, 0.0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.start is None:
            self.start = time.process_time()
            return
        self.used = time.process_time() - self.start
        if self.used > self.seconds:
            self.model.stop_training = True


def _memory_status():
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "VmHWM")}


def _measure_step(step, args, repeats):
    """Median seconds of the warm `step(*args)` and its memory (bytes).

    `allocator_peak`: TensorFlow's allocator peak during the warm steps (the
    live tensors and XLA buffers of a step). `resident_peak`: the process's
    peak resident memory over the compilation and all steps, above what it
    held before the first step (TensorFlow, the data and the weights).
    """
    import tensorflow as tf
    from timing import median_seconds

    with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM to the current resident memory
        f.write("5")
    resident = _memory_status()["VmRSS"]
    step(*args)  # compiles
    device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
    tf.config.experimental.reset_memory_stats(device)
    seconds = median_seconds(lambda: [t.numpy() for t in step(*args)[:1]], warmup=1, repeats=repeats)
    return {
        "seconds": seconds,
        "allocator_peak": tf.config.experimental.get_memory_info(device)["peak"],
        "resident_peak": _memory_status()["VmHWM"] - resident,
    }


def child_speed(spec):
    import tensorflow as tf

    layer = make_attention(spec["family"], spec["length"], spec["causal"])
    x = tf.random.normal((1, spec["length"], WIDTH), seed=0)
    layer(x, use_causal_mask=spec["causal"])

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer(x, use_causal_mask=spec["causal"]))
        return tape.gradient(loss, [x] + layer.trainable_variables)

    return _measure_step(step, (x,), spec["repeats"])


def child_reversible(spec):
    import tensorflow as tf

    from keras_tfam.layers import ReversibleBlock, ReversibleStack

    width = spec["width"]
    blocks = [ReversibleBlock(4, 4 * width, use_causal_mask=True) for _ in range(spec["depth"])]
    stack = ReversibleStack(blocks, reversible=spec["reversible"])
    x = tf.random.normal((spec["batch"], spec["length"], width), seed=0)
    stack(x[:, :8])

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(stack(x)))
        return [loss] + tape.gradient(loss, stack.trainable_variables)

    return _measure_step(step, (x,), spec["repeats"])


def child_quality(spec):
    from pooling_vs_gpt2 import compile_model

    from keras_tfam.models import GPT2LM
    from pipelines.data.lm_stream import lm_dataset, tokenize_lines
    from pipelines.data.tokenizers import WordTokenizer
    from pipelines.data.wikitext import count_words, find_split, read_lines
    from pipelines.evaluation import evaluate_perplexity

    train_lines = read_lines(find_split(spec["data_dir"], "valid"))
    test_lines = read_lines(find_split(spec["data_dir"], "test"))
    tokenizer = WordTokenizer.train(train_lines)
    train_tokens, test_tokens = tokenize_lines(tokenizer, train_lines), tokenize_lines(tokenizer, test_lines)
    keras.utils.set_random_seed(0)
    model = GPT2LM(
        tokenizer.vocabulary_size,
        **spec["sizes"],
        max_sequence_length=128,
        dropout=0.1,
        attention=spec["family"],
        attention_options=QUALITY_OPTIONS[spec["family"]],
    )
    compile_model(model, 2000)
    data = lm_dataset(train_tokens, 128, 16, tokenizer.eos_id, shuffle=True, seed=0, drop_remainder=True, repeat=True)
    budget = CpuBudget(spec["cpu_minutes"] * 60)
    start = time.perf_counter()
    model.fit(data, steps_per_epoch=1_000_000, epochs=1, shuffle=False, callbacks=[budget], verbose=0)
    trained = time.perf_counter() - start
    result = evaluate_perplexity(model, lm_dataset(test_tokens, 128, 16, tokenizer.eos_id), count_words(test_lines))
    return {
        "steps": budget.steps,
        "wall_seconds": trained,
        "cpu_seconds": budget.used,
        "tokens": budget.steps * 16 * 128,
        "loss": result["loss"],
        "word_perplexity": result["word_perplexity"],
        "test_tokens": result["tokens"],
    }


QUALITY_SIZES = {"num_layers": 4, "num_heads": 4, "hidden_dim": 256}  # GPT-2 tiny
# Each family's options in the quality runs (GPT-2 tiny: heads of 64, 128-token blocks).
QUALITY_OPTIONS = {
    "softmax": {},
    "linear": {},
    "performer": {"num_features": 256, "redraw": 100, "seed": 0},
    "rfa": {"num_features": 128, "gating": True, "seed": 0},
    "lsh": {"num_buckets": 4, "num_hashes": 2, "chunk_length": 64, "redraw": 1, "seed": 0},
    "routing": {"num_clusters": 4, "chunk_length": 64, "seed": 0},
}

CHILDREN = {"speed": child_speed, "reversible": child_reversible, "quality": child_quality}


def run_child(kind, spec, timeout):
    """Runs one measurement in a fresh process: a dict, or `{"error": ...}`."""
    command = [sys.executable, os.path.abspath(__file__), "child", kind, json.dumps(spec)]
    # A fixed mmap threshold: glibc then returns every large block to the system when it is freed, so the
    # resident memory follows what is live and its peak measures the step (not blocks kept from compilation).
    environment = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=HERE, env=environment)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        memory = "ResourceExhausted" in done.stderr or "MemoryError" in done.stderr or done.returncode == -9
        return {"error": "out of memory" if memory else (done.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    return json.loads(lines[-1])


# ---------------------------------------------------------------- the three benchmarks


def _mib(value):
    return f"{value / 2**20:8.1f}"


def speed(args):
    modes = {"causal": [True], "bidirectional": [False], "both": [True, False]}[args.mode]
    for causal in modes:
        families = args.families if args.smoke else CAUSAL_FAMILIES if causal else FAMILIES
        print(f"\n{'causal' if causal else 'bidirectional'}: batch 1, width {WIDTH}, {HEADS} heads, fwd+bwd, XLA")
        print(f"{'T':>6} {'family':>10} {'ms':>9} {'alloc MiB':>9} {'RSS MiB':>8} {'t/softmax':>9} {'t/linear':>8}")
        for length in args.lengths:
            results = {}
            for family in families:
                if family == "softmax" and length > args.max_softmax_length:
                    results[family] = {"error": f"skipped (> {args.max_softmax_length}: ~12 GiB at 16384)"}
                else:
                    spec = {"family": family, "length": length, "causal": causal, "repeats": args.repeats}
                    results[family] = run_child("speed", spec, args.timeout)
                r = results[family]
                if "error" in r:
                    print(f"{length:6} {family:>10}   {r['error']}", flush=True)
                    continue
                ratios = [
                    f"{r['seconds'] / results[peer]['seconds']:9.2f}"
                    if "seconds" in results.get(peer, {})
                    else f"{'-':>9}"
                    for peer in ("softmax", "linear")
                ]
                print(
                    f"{length:6} {family:>10} {r['seconds'] * 1e3:9.1f} {_mib(r['allocator_peak'])} "
                    f"{_mib(r['resident_peak'])} {ratios[0]} {ratios[1]}",
                    flush=True,
                )


def reversible(args):
    print(
        f"\ntraining step of a ReversibleStack: batch {args.batch} x {args.length}, width {args.width}, 4 heads, "
        "causal softmax attention, XLA"
    )
    print(f"{'depth':>5} {'activations':>12} {'ms':>9} {'alloc MiB':>9} {'RSS MiB':>8}")
    peaks = {}
    for recompute in (True,) if args.smoke else (True, False):
        for depth in args.depths:
            spec = {
                "depth": depth,
                "reversible": recompute,
                "length": args.length,
                "batch": args.batch,
                "width": args.width,
                "repeats": args.repeats,
            }
            r = run_child("reversible", spec, args.timeout)
            label = "recomputed" if recompute else "stored"
            if "error" in r:
                print(f"{depth:5} {label:>12}   {r['error']}", flush=True)
                continue
            peaks[label, depth] = r
            print(
                f"{depth:5} {label:>12} {r['seconds'] * 1e3:9.1f} {_mib(r['allocator_peak'])} "
                f"{_mib(r['resident_peak'])}",
                flush=True,
            )
    low, high = min(args.depths), max(args.depths)
    for label in ("recomputed", "stored"):
        if (label, low) in peaks and (label, high) in peaks:
            growth = [peaks[label, high][key] / peaks[label, low][key] for key in ("allocator_peak", "resident_peak")]
            print(f"{label}: peak memory {high} vs {low} layers: allocator {growth[0]:.2f}x, resident {growth[1]:.2f}x")


def quality(args):
    from timing import SMOKE_SIZES

    print(
        f"\nmini protocol (train on WikiText-2 valid, evaluate on test; not WikiText-2 test perplexity): "
        f"GPT-2 tiny, {args.cpu_minutes} CPU-minutes of training each"
    )
    print(f"{'family':>10} {'steps':>6} {'tokens':>10} {'CPU s':>7} {'wall s':>7} {'test loss':>9} {'word ppl':>9}")
    for family in args.families:
        spec = {"family": family, "cpu_minutes": args.cpu_minutes, "data_dir": os.path.abspath(args.data_dir)}
        spec["sizes"] = SMOKE_SIZES if args.smoke else QUALITY_SIZES
        r = run_child("quality", spec, timeout=int(args.cpu_minutes * 60 * 8 + 3600))
        if "error" in r:
            print(f"{family:>10}   {r['error']}", flush=True)
            continue
        print(
            f"{family:>10} {r['steps']:6} {r['tokens']:10} {r['cpu_seconds']:7.0f} {r['wall_seconds']:7.0f} "
            f"{r['loss']:9.4f} {r['word_perplexity']:9.1f}",
            flush=True,
        )


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        sys.path.insert(0, HERE)
        print(json.dumps(CHILDREN[sys.argv[2]](json.loads(sys.argv[3]))))
        return
    sys.path.insert(0, HERE)
    from timing import add_smoke, machine, small_wikitext, smoke_folder, smoke_settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_smoke(parser)  # without a part: each of the three, one measurement each
    parts = parser.add_subparsers(dest="part")
    part = parts.add_parser("speed")
    part.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    part.add_argument("--mode", choices=("causal", "bidirectional", "both"), default="both")
    part.add_argument("--max-softmax-length", type=int, default=8192)
    part.add_argument("--repeats", type=int, default=3)
    part.add_argument("--timeout", type=int, default=900)
    part = parts.add_parser("reversible")
    part.add_argument("--depths", type=int, nargs="+", default=[2, 12])
    part.add_argument("--length", type=int, default=1024)
    part.add_argument("--batch", type=int, default=4)
    part.add_argument("--width", type=int, default=128)
    part.add_argument("--repeats", type=int, default=3)
    part.add_argument("--timeout", type=int, default=900)
    part = parts.add_parser("quality")
    part.add_argument("--cpu-minutes", type=float, default=4.0)
    part.add_argument("--families", nargs="+", default=list(CAUSAL_FAMILIES), choices=CAUSAL_FAMILIES)
    part.add_argument("--data-dir", default=os.path.join(HERE, "..", "..", "shared", "data", "wikitext-2"))
    args = parser.parse_args()
    if args.part is None and not args.smoke:
        parser.error("the following arguments are required: part")
    smoke = dict(lengths=[64], mode="causal", max_softmax_length=64, repeats=1, timeout=900, families=["softmax"])
    smoke.update(depths=[1], length=16, batch=1, width=32, cpu_minutes=0.001)
    if args.smoke:
        smoke["data_dir"] = small_wikitext(os.path.join(smoke_folder("efficient_attention"), "wikitext-2"))
    smoke_settings(args, **smoke)
    print(f"machine: {machine()}")
    for part in [args.part] if args.part else ["speed", "reversible", "quality"]:
        {"speed": speed, "reversible": reversible, "quality": quality}[part](args)


if __name__ == "__main__":
    main()
