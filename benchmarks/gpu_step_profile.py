"""Where a GPT-2 small training step goes on one GPU (JAX backend): step time per loss variant, and the
device kernels of a profiled step, largest first.

    KERAS_BACKEND=jax python benchmarks/gpu_step_profile.py [--batch 32] [--out DIR]

Each variant runs in its own process: the model of `benchmarks/gpu_train.py` (GPT-2 small, nanoGPT's
padded vocabulary, `mixed_bfloat16`, AdamW, XLA-compiled `fit`), timed over `--steps` steps after
`--warmup` compiling ones; with `--out`, a profiled variant then traces two more steps with
`jax.profiler` and prints its device time per kernel, and with `--hlo` the XLA fusion each kernel runs
(its shapes and the model operation it comes from).
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import time

import numpy as np

VARIANTS = {
    # name: (loss: Keras' sparse cross-entropy or keras_tfam's TokenCrossEntropy, logits dtype, profiled)
    "keras-loss-f32-logits": ("keras", "float32", True),
    "token-loss-f32-logits": ("token", "float32", False),
    "token-loss-bf16-logits": ("token", "bfloat16", True),
}


def run_variant(args):
    os.environ.setdefault("KERAS_BACKEND", "jax")
    if args.hlo:
        dump = (
            f"--xla_dump_to={os.path.join(args.hlo, args.variant)} --xla_dump_hlo_as_text "
            "--xla_dump_hlo_module_re=.*train.*"
        )
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {dump}"
    import jax
    import keras

    from keras_tfam.losses import TokenCrossEntropy
    from keras_tfam.models import GPT2LM

    loss_kind, logits_dtype, profiled = VARIANTS[args.variant]
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    keras.utils.set_random_seed(0)
    sizes = {} if args.size == "small" else {"num_layers": 2, "num_heads": 2, "hidden_dim": 64}
    model = GPT2LM.from_preset(
        "gpt2_small", vocabulary_size=50304, max_sequence_length=args.length, dropout=0.0, **sizes
    )
    model.token_embedding.logits_dtype = logits_dtype  # bfloat16: the head's product is not cast to float32
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True) if loss_kind == "keras" else TokenCrossEntropy()
    model.compile(keras.optimizers.AdamW(6e-4, beta_2=0.95, weight_decay=0.1), loss, jit_compile=True)
    tokens = np.random.default_rng(0).integers(
        0, 50257, size=(args.batch * (args.warmup + args.steps + 2), args.length + 1)
    )
    x, y = tokens[:, :-1].astype("int32"), tokens[:, 1:].astype("int32")
    warm, timed = args.warmup * args.batch, (args.warmup + args.steps) * args.batch
    model.fit(x[:warm], y[:warm], batch_size=args.batch, verbose=0)
    start = time.perf_counter()
    history = model.fit(x[warm:timed], y[warm:timed], batch_size=args.batch, verbose=0)
    loss_value = float(history.history["loss"][-1])
    seconds = (time.perf_counter() - start) / args.steps
    kernels = {}
    if profiled and args.out:
        trace_dir = os.path.join(args.out, args.variant)
        jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
        model.fit(x[timed:], y[timed:], batch_size=args.batch, verbose=0)
        jax.profiler.stop_trace()
        kernels = gpu_time_per_name(trace_dir)
    fusions = hlo_of_kernels(os.path.join(args.hlo, args.variant), kernels) if args.hlo and kernels else {}
    return {
        "variant": args.variant,
        "step_ms": 1e3 * seconds,
        "tokens_per_s": args.batch * args.length / seconds,
        "loss": loss_value,
        "kernels": kernels,
        "fusions": fusions,
    }


def hlo_of_kernels(dump_dir, kernels, count=30):
    """For the `count` largest kernels named after an HLO instruction of the optimised train step: its
    line (shape, operands) and the operations of the computation it fuses, counted."""
    paths = glob.glob(os.path.join(dump_dir, "*after_optimizations.txt"))
    if not paths:
        return {}
    with open(max(paths, key=os.path.getsize)) as f:
        text = f.read()
    computations = {}
    for match in re.finditer(r"^%?([\w.-]+)[^\n]*\{\n(.*?)^\}", text, re.M | re.S):
        computations[match.group(1)] = match.group(2)
    found = {}
    for key in list(kernels)[:count]:
        name = key.split(" | ")[-1]
        for candidate in (name, re.sub(r"_(\d+)$", r".\1", name)):  # kernel fusion_12 is instruction fusion.12
            line = re.search(rf"^\s*(?:ROOT )?%?{re.escape(candidate)} = ([^\n]*)", text, re.M)
            if line:
                break
        else:
            continue
        called = re.search(r"calls=%?([\w.-]+)", line.group(1))
        body = computations.get(called.group(1), "") if called else ""
        operations = collections.Counter(re.findall(r" = \S+ ([a-z-]+)\(", body))
        origin = re.search(r'op_name="([^"]*)"', line.group(1))
        found[name] = {
            "line": line.group(1).split(", metadata=")[0][:300],
            "op_name": origin.group(1) if origin else "",
            "operations": dict(operations.most_common(10)),
        }
    return found


def gpu_time_per_name(trace_dir):
    """Microseconds per (trace line, event name) on the device lines (not the host's) of a perfetto trace, over the
    profiled steps."""
    (path,) = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    processes, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    totals = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and "/host:" not in processes.get(e["pid"], "/host:"):
            line = threads.get((e["pid"], e["tid"]), str(e["tid"]))
            totals[f"{line} | {e['name'][:120]}"] += e.get("dur", 0)
    return dict(totals.most_common(80))


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--size", choices=("small", "tiny"), default="small", help="tiny: to try the script on a CPU")
    parser.add_argument("--out", help="a folder for the traces")
    parser.add_argument("--hlo", help="a folder for XLA's dump of the train step: the largest kernels' HLO is printed")
    parser.add_argument("--xla-flags", default="", help="XLA_FLAGS for every variant's process (to try XLA's options)")
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--variant", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timing import add_smoke, forwarded_options, run_json, smoke_settings

    add_smoke(parser)
    # One variant under --smoke: the library's loss on bfloat16 logits; no trace.
    smoke = dict(size="tiny", batch=2, length=16, steps=1, warmup=1, out=None, hlo=None)
    args = smoke_settings(parser.parse_args(), **smoke, variants=["token-loss-bf16-logits"])
    if args.variant:
        print(json.dumps(run_variant(args)))
        return

    if args.xla_flags:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {args.xla_flags}"
    forwarded = forwarded_options(args, "variants", "variant", "xla_flags")
    for variant in args.variants:
        try:
            result = run_json(__file__, *forwarded, f"--variant={variant}")
        except RuntimeError as error:
            print(f"{variant}: failed: {str(error)[-1500:]}", flush=True)
            continue
        print(
            f"{variant}: {result['step_ms']:.1f} ms/step, {result['tokens_per_s']:,.0f} tokens/s, "
            f"loss {result['loss']:.4f}",
            flush=True,
        )
        if result["kernels"]:
            lines = collections.Counter()
            for key, us in result["kernels"].items():
                lines[key.split(" | ")[0]] += us
            print("  GPU time per trace line (us, 2 steps):", dict(lines.most_common(8)))
            for key, us in list(result["kernels"].items())[:45]:
                print(f"  {us / 2e3:8.2f} ms/step  {key}")
                fusion = result["fusions"].get(key.split(" | ")[-1])
                if fusion:
                    print(f"      {fusion['line']}\n      {fusion['op_name']}\n      {fusion['operations']}")
        if args.out:
            with open(os.path.join(args.out, f"{variant}.json"), "w") as f:
                json.dump(result, f)


if __name__ == "__main__":
    main()
