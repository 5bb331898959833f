"""Long-context attention: sliding window (banded) vs full causal vs Keras' MultiHeadAttention with a dense mask.

    python benchmarks/long_attention.py [--lengths 1024 4096 16384 65536] [--window 256] [--memory-cap-gib 16]

One attention layer, batch 1, width 256, 4 heads, float32, forward + backward
(the loss summed over the outputs; gradients for the input and all weights)
in one XLA-compiled `tf.function`; median of a few steps after a compiling one.

- `window`: keras_tfam `MultiHeadAttention(pattern=SlidingWindow(w))`, causal:
  banded, blocks of `w` queries over `2w` keys.
- `full causal`: keras_tfam `MultiHeadAttention`, causal (4 query blocks over
  the keys up to each block's end; O(T^2)).
- `keras dense mask` (the peer a user would otherwise pick):
  `keras.layers.MultiHeadAttention` with a dense `(1, T, T)` sliding-window
  `attention_mask`: the same function as `window`, O(T^2).

Each (implementation, length) runs in its own subprocess, so its memory is its
own: the TensorFlow allocator's peak during the step
(`tf.config.experimental.get_memory_info`) and the growth of the process' peak
RSS (`ru_maxrss`) over its RSS before the first step (compilation included).
The subprocess runs under an address-space limit (`--memory-cap-gib`, at most
what the machine has free), so a size that does not fit fails alone, reported
as "out of memory"; sizes whose `T x T` scores alone exceed the cap are not run
("infeasible").

Decode: time per generated token of one window layer stepping through a ring
cache of `w` slots (compiled loop of `--decode-steps` steps) starting at 1k and
64k positions, next to a full cache (no window) at the same positions; the
positions are timed in turns in one process and the fastest round is kept.
"""

import argparse
import json
import os
import resource
import subprocess
import sys

WIDTH, HEADS = 256, 4
IMPLEMENTATIONS = ("window", "full causal", "keras dense mask")


def _child_environment():
    return {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _available_bytes():
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024


def measure_training_step(implementation, length, window, repeats):
    """Runs in the subprocess: `(seconds, allocator peak, RSS growth)` of one forward+backward step."""
    import keras
    import tensorflow as tf
    from timing import median_seconds

    from keras_tfam.layers import MultiHeadAttention
    from keras_tfam.layers.attention.patterns import SlidingWindow
    from keras_tfam.ops import sliding_window_mask

    keras.utils.set_random_seed(0)
    x = tf.random.normal((1, length, WIDTH))
    if implementation == "keras dense mask":
        layer = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS)
        mask = sliding_window_mask(length, window=window)

        def forward(x):
            return layer(x, x, attention_mask=mask)

        layer(x[:, :8], x[:, :8])
    else:
        pattern = SlidingWindow(window) if implementation == "window" else None
        layer = MultiHeadAttention(HEADS, WIDTH // HEADS, pattern=pattern)

        def forward(x):
            return layer(x, use_causal_mask=True)

        layer(x[:, :8], use_causal_mask=True)

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(forward(x))
        return tape.gradient(loss, [x] + layer.trainable_variables)

    before = _rss_bytes()
    step(x)[0].numpy()
    tf.config.experimental.reset_memory_stats("CPU:0")
    seconds = median_seconds(lambda: step(x)[0].numpy(), warmup=0, repeats=repeats)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    return {"seconds": seconds, "peak": peak, "rss_growth": grown}


def measure_decoding(positions, window, steps, repeats):
    """Runs in the subprocess: seconds per token of `steps` cached steps from each position, ring and full cache.

    The positions are timed in turns (`repeats` rounds), so that load on the
    machine hits them alike; the fastest round is kept.
    """
    import time

    import tensorflow as tf

    from keras_tfam.layers import MultiHeadAttention
    from keras_tfam.layers.attention.patterns import SlidingWindow

    results = {}
    for name, pattern in (("ring", SlidingWindow(window)), ("full cache", None)):
        layer = MultiHeadAttention(HEADS, WIDTH // HEADS, pattern=pattern)
        layer.build((1, 1, WIDTH))
        tokens = tf.random.normal((1, steps, WIDTH))

        @tf.function(jit_compile=True)
        def decode(cache, start):
            def body(i, cache, total):
                # tf.slice: a strided slice `tokens[:, i:i+1]` costs ~3 ms per step under XLA on this CPU.
                token = tf.slice(tokens, [0, i, 0], [1, 1, WIDTH])
                out, cache = layer(token, cache=cache, cache_update_index=start + i, use_causal_mask=True)
                return i + 1, cache, total + tf.reduce_sum(out)

            return tf.while_loop(lambda i, *_: i < steps, body, (0, cache, 0.0))[2]

        # Ring: `window` slots whatever the position; full cache: one slot per position.
        caches = {position: layer.init_cache(1, position + steps) for position in positions}
        for position in positions:
            decode(caches[position], tf.constant(position)).numpy()  # compile
        times = {position: [] for position in positions}
        for _ in range(repeats):
            for position in positions:
                start = time.perf_counter()
                decode(caches[position], tf.constant(position)).numpy()
                times[position].append((time.perf_counter() - start) / steps)
        results[name] = {
            str(position): {"seconds_per_token": min(times[position]), "slots": int(caches[position].shape[2])}
            for position in positions
        }
    return results


def run_child(arguments, cap_bytes):
    """`(result dict, None)` of a subprocess run, or `(None, reason)`."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))

    process = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(arguments)],
        capture_output=True,
        text=True,
        env=_child_environment(),
        preexec_fn=limit,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )
    if process.returncode == 0:
        return json.loads(process.stdout.strip().splitlines()[-1]), None
    text = process.stderr + process.stdout
    if "ResourceExhausted" in text or "MemoryError" in text or "bad_alloc" in text or process.returncode < 0:
        return None, f"out of memory (cap {cap_bytes / 2**30:.0f} GiB)"
    return None, "failed: " + text.strip().splitlines()[-1][:200]


def dense_scores_bytes(length):
    """The `T x T x heads` float32 scores and their gradient, the least a dense computation holds."""
    return 2 * length * length * HEADS * 4


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-cap-gib", type=float, default=16.0)
    parser.add_argument("--decode-positions", type=int, nargs="+", default=[1024, 65536])
    parser.add_argument("--decode-steps", type=int, default=256)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    from timing import add_smoke, smoke_settings

    add_smoke(parser)
    smoke = dict(lengths=[32], window=8, repeats=1, decode_positions=[8, 32], decode_steps=4)
    args = smoke_settings(parser.parse_args(), **smoke)
    if args.child:
        job = json.loads(args.child)
        if job["kind"] == "train":
            result = measure_training_step(job["implementation"], job["length"], job["window"], job["repeats"])
        else:
            result = measure_decoding(job["positions"], job["window"], job["steps"], job["repeats"])
        print(json.dumps(result))
        return

    from timing import machine, skipped

    # Under --smoke, the library's full causal layer runs in the decoding process only (its full cache).
    implementations = [i for i in IMPLEMENTATIONS if i != "full causal"] if args.smoke else IMPLEMENTATIONS
    if args.smoke:
        skipped("full causal training step", "--smoke: a process less")
    cap = int(min(args.memory_cap_gib * 2**30, _available_bytes() - 2 * 2**30))
    print(f"machine: {machine()}; {_available_bytes() / 2**30:.1f} GiB free, subprocess cap {cap / 2**30:.1f} GiB")
    print(f"batch 1, width {WIDTH}, {HEADS} heads, window {args.window}, causal, float32, forward+backward, XLA")
    results = {}
    for length in args.lengths:
        for implementation in implementations:
            if implementation != "window" and dense_scores_bytes(length) > cap:
                reason = f"infeasible: dense scores need {dense_scores_bytes(length) / 2**30:.0f} GiB"
                result = None
            else:
                job = {
                    "kind": "train",
                    "implementation": implementation,
                    "length": length,
                    "window": args.window,
                    "repeats": args.repeats,
                }
                result, reason = run_child(job, cap)
            results[implementation, length] = result
            if result is None:
                print(f"T={length:6}  {implementation:17} {reason}", flush=True)
            else:
                peak, grown = result["peak"] / 2**20, result["rss_growth"] / 2**20
                print(
                    f"T={length:6}  {implementation:17} {result['seconds'] * 1e3:10.1f} ms  "
                    f"allocator peak {peak:9.1f} MiB  RSS growth {grown:9.1f} MiB",
                    flush=True,
                )
    window = {length: results["window", length] for length in args.lengths if results["window", length]}
    if 4096 in window and 65536 in window:
        ratio = window[65536]["peak"] / window[4096]["peak"]
        rss = window[65536]["rss_growth"] / window[4096]["rss_growth"]
        print(f"window memory(64k) / memory(4k): allocator peak {ratio:.1f}, RSS growth {rss:.1f} (16x the tokens)")
    for length in args.lengths:
        for peer in ("full causal", "keras dense mask"):
            if results["window", length] and results.get((peer, length)):
                speedup = results[peer, length]["seconds"] / results["window", length]["seconds"]
                print(f"T={length}: window is {speedup:.1f}x faster than {peer}")

    job = {
        "kind": "decode",
        "positions": args.decode_positions,
        "window": args.window,
        "steps": args.decode_steps,
        "repeats": args.repeats,
    }
    decode, reason = run_child(job, cap)
    if decode is None:
        print(f"decode: {reason}")
        return
    first, last = (str(position) for position in (args.decode_positions[0], args.decode_positions[-1]))
    for name, by_position in decode.items():
        for position, values in by_position.items():
            print(
                f"decode from position {position:>6}: {name:10} ({values['slots']:6} slots) "
                f"{values['seconds_per_token'] * 1e6:9.1f} us/token",
                flush=True,
            )
        ratio = by_position[last]["seconds_per_token"] / by_position[first]["seconds_per_token"]
        print(f"decode time per token at {last} / at {first}: {name} {ratio:.2f}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
