"""GPT-2 small greedy generation: keras_tfam vs Hugging Face transformers (PyTorch, CPU, KV cache).

    pip install -e '.[bench]'     # torch (CPU) and transformers: peers, not in the test install
    python benchmarks/generate_vs_transformers.py [--batch 1 8] [--prompt 32] [--new 128]

GPT-2 small (124M) from a random initialisation, written by transformers'
`save_pretrained` (safetensors) and read by `GPT2LM.from_huggingface`; greedy,
prompt 32, 128 new tokens, no stop token. The float32 tokens must be
identical to transformers' `generate(do_sample=False, use_cache=True)`.
Tokens/s count new tokens only, median of 3 calls after a compiling call.

Also timed: decoding with bfloat16 weights (`keras_tfam.generation.with_dtype`,
the tied head included), whose greedy tokens are compared with float32's
position by position, teacher-forced on the float32 output, and two floors:
the bytes of the weights read once per step at the memory bandwidth measured
here (a float32 copy of the weights), which bounds batch-1 decoding of this
model, and the decoding loop of the model's matmuls alone under XLA
(`generate.matmul_floor_seconds` at GPT-2 small's sizes), which bounds any
float32 implementation compiled by XLA at each batch size.
"""

import argparse
import os
import tempfile

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from generate import matmul_floor_seconds  # noqa: E402
from timing import machine, median_seconds  # noqa: E402

from keras_tfam.generation import with_dtype  # noqa: E402
from keras_tfam.models import GPT2LM  # noqa: E402


def memory_bandwidth_gb_per_s(megabytes=512):
    """Read bandwidth: the median time of summing a large float32 array (NumPy, all cores)."""
    array = np.ones(megabytes * 2**20 // 4, np.float32)
    seconds = median_seconds(lambda: array.sum(), warmup=2, repeats=7)
    return array.nbytes / seconds / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count())
    theirs = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    directory = tempfile.mkdtemp()
    theirs.save_pretrained(directory, safe_serialization=True)
    ours = GPT2LM.from_huggingface(directory)
    fast = with_dtype(ours, "bfloat16")
    weights = sum(int(np.prod(w.shape)) for w in ours.weights)
    bandwidth = memory_bandwidth_gb_per_s()
    print(f"machine: {machine()}, torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"GPT-2 small ({weights:,} parameters), prompt {args.prompt}, {args.new} new tokens, greedy")
    print(f"memory read bandwidth {bandwidth:.1f} GB/s: float32 weights once per token = "
          f"{bandwidth * 1e9 / (4 * weights):.1f} steps/s at most")
    for batch in args.batch:
        prompts = np.random.default_rng(batch).integers(0, 50257, size=(batch, args.prompt)).astype("int32")
        inputs = torch.tensor(prompts, dtype=torch.long)

        def run_theirs():
            with torch.no_grad():
                return theirs.generate(
                    inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=args.new, min_new_tokens=args.new,
                    do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None,
                ).numpy()

        def run_ours():
            return ours.generate(prompts, max_new_tokens=args.new)

        def run_fast():
            return fast.generate(prompts, max_new_tokens=args.new)

        expected, got, reduced = run_theirs(), run_ours(), run_fast()
        same = np.array_equal(got, expected)
        # bfloat16's choices, each from float32's own prefix (teacher-forced): the share that agree.
        logits = np.asarray(fast(got[:, :-1]))[:, args.prompt - 1 :]
        agreement = float(np.mean(logits.argmax(-1) == got[:, args.prompt :]))
        free_running = float(np.mean(reduced[:, args.prompt :] == got[:, args.prompt :]))
        t_theirs = median_seconds(run_theirs, warmup=0, repeats=args.repeats)
        t_ours = median_seconds(run_ours, warmup=0, repeats=args.repeats)
        t_fast = median_seconds(run_fast, warmup=0, repeats=args.repeats)
        tokens = batch * args.new
        print(
            f"batch {batch}: keras_tfam {tokens / t_ours:8.1f} tok/s  transformers {tokens / t_theirs:8.1f} tok/s  "
            f"speed-up {t_theirs / t_ours:5.2f}x  identical tokens: {same}"
        )
        print(
            f"batch {batch}: keras_tfam bfloat16 weights {tokens / t_fast:8.1f} tok/s = {t_theirs / t_fast:5.2f}x "
            f"transformers; greedy choices equal to float32's at {100 * agreement:.1f}% of positions "
            f"(teacher-forced), {100 * free_running:.1f}% free-running"
        )
        print(
            f"batch {batch}: float32 steps/s {args.new / t_ours:6.1f} = "
            f"{100 * (args.new / t_ours) / (bandwidth * 1e9 / (4 * weights)):.0f}% of the weight-reading bound"
        )
        floor = args.new / matmul_floor_seconds(batch, args.new, width=768, layers=12, vocab=50257)
        print(
            f"batch {batch}: matmuls only (floor) {floor:6.1f} steps/s = {batch * floor:7.1f} tok/s = "
            f"{batch * floor * t_theirs / tokens:5.2f}x transformers; keras_tfam float32 at "
            f"{100 * (args.new / t_ours) / floor:.0f}% of it"
        )
        if not same:
            raise SystemExit("float32 tokens differ from transformers'")


if __name__ == "__main__":
    main()
