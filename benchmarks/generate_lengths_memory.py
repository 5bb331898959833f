"""Memory of `generate` called with many distinct `max_new_tokens`: bounded by the compiled loops kept.

    python benchmarks/generate_lengths_memory.py [--lengths 40 --preset gpt2_tiny]

Each compiled decoding loop holds its traced graph and, under XLA, its
executable. One loop was once kept per distinct `max_new_tokens`, so memory
grew with every new length (+677 MB after 40 lengths in the issue's probe).
Now a length is rounded up to a bucket (`length_bucket`: 16, 20, 24, 28, 32,
40, ...) and at most `MAX_COMPILED_LOOPS` loops are kept (least recently used
out). Two configurations run, each in a fresh process, over the same lengths:

- `bucketed, bounded`: the library as it is;
- `one loop per length`: buckets of one token and no bound (what it did before).

Printed per configuration: the loops kept at the end, the growth of the resident
memory over the 40 calls, held at the end (`VmRSS` after a garbage collection)
and at its peak (`ru_maxrss`, which includes XLA's transient compile memory),
and the seconds they took.
"""

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

CONFIGURATIONS = ("bucketed, bounded", "one loop per length")


def resident_mb():
    """The process's resident memory now (`VmRSS`), in MB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def measure(configuration, count, preset, sizes):
    import gc
    import resource
    import time

    import numpy as np

    import keras_tfam.generation.generator as generator_module
    from keras_tfam.models import GPT2LM

    if configuration == "one loop per length":
        generator_module.length_bucket = lambda n: n
        generator_module.MAX_COMPILED_LOOPS = 10**9
    model = GPT2LM.from_preset(preset, vocabulary_size=2048, **sizes)
    prompt = [[5, 8, 13, 21]]
    model.generate(prompt, 2)  # warm-up: the first trace loads TensorFlow's kernels
    lengths = [int(n) for n in np.linspace(3, 200, count).round()]
    gc.collect()
    before, held_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resident_mb()
    start = time.perf_counter()
    for n in lengths:
        model.generate(prompt, n)
    seconds = time.perf_counter() - start
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    gc.collect()
    held = resident_mb() - held_before
    loops = len(generator_module.Generator.for_model(model)._functions)
    return {
        "configuration": configuration,
        "lengths": count,
        "loops_kept": loops,
        "held_rss_growth_mb": held,
        "peak_rss_growth_mb": grown / 1024,
        "seconds": seconds,
    }


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, default=40, help="distinct max_new_tokens, 3 .. 200")
    parser.add_argument("--preset", default="gpt2_tiny")
    parser.add_argument("--child", choices=CONFIGURATIONS, help=argparse.SUPPRESS)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timing import SMOKE_SIZES, add_smoke, smoke_settings

    add_smoke(parser)
    args = smoke_settings(parser.parse_args(), lengths=3)
    if args.child:
        print(json.dumps(measure(args.child, args.lengths, args.preset, SMOKE_SIZES if args.smoke else {})))
        return
    results = []
    for configuration in CONFIGURATIONS:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                configuration,
                "--lengths",
                str(args.lengths),
                "--preset",
                args.preset,
                *(["--smoke"] if args.smoke else []),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'configuration':<22} {'loops kept':>10} {'RSS growth held':>16} {'peak':>10} {'seconds':>8}")
    for r in results:
        print(
            f"{r['configuration']:<22} {r['loops_kept']:>10} {r['held_rss_growth_mb']:>13.0f} MB "
            f"{r['peak_rss_growth_mb']:>7.0f} MB {r['seconds']:>8.1f}"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
