"""GPT-2 small training on one GPU, JAX backend: tokens/s and model FLOPs utilisation, against nanoGPT.

    KERAS_BACKEND=jax python benchmarks/gpu_train.py [--nanogpt DIR] [--batch 16 --length 1024 --steps 30]
    bash scripts/gpu_bench.sh      # the same, prepared for the lent GPU machine (see its header)

Ours: `GPT2LM.from_preset("gpt2_small")` with nanoGPT's padded vocabulary (50304), dropout 0, AdamW,
`mixed_bfloat16`, `keras_tfam.losses.TokenCrossEntropy` (`--loss keras`: Keras' sparse cross-entropy),
XLA-compiled `fit` on the JAX backend. The peer: nanoGPT's own `train.py` and
`model.py` (a checkout passed with `--nanogpt`; not part of this repository), in its own process,
GPT-2 small, `dtype=bfloat16`, `compile=True`, the same batch and length, no gradient accumulation.
Both train on the same random token ids (throughput does not depend on the text; nothing is
downloaded).

Tokens/s: the steps after `--warmup` compiling ones, timed end to end (the device synchronised).
MFU: 6 x parameters + 12 x layers x length x width FLOPs per token (PaLM's count, the one nanoGPT
reports), over the GPU's dense bfloat16 peak (`--peak-tflops`; H100 and H200 SXM: 989).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

VOCABULARY = 50304  # GPT-2's 50257 padded to a multiple of 64, as nanoGPT trains it
PEAKS_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}
SMALL = {"n_layer": 12, "n_head": 12, "n_embd": 768}


def flops_per_token(parameters, layers, length, width):
    return 6 * parameters + 12 * layers * length * width


def random_tokens(count, seed=0):
    return np.random.default_rng(seed).integers(0, 50257, size=count).astype(np.uint16)


def run_ours(args):
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    from keras_tfam.losses import TokenCrossEntropy
    from keras_tfam.models import GPT2LM
    from keras_tfam.ops.attention import flash_attention_fits

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    keras.utils.set_random_seed(0)
    sizes = {} if args.size == "small" else {"num_layers": 2, "num_heads": 2, "hidden_dim": 64}

    def build(**options):
        return GPT2LM.from_preset(
            "gpt2_small", vocabulary_size=VOCABULARY, max_sequence_length=args.length, dropout=0.0, **sizes, **options
        )

    model = build()
    heads = keras.ops.zeros((1, 8, model.num_heads, model.hidden_dim // model.num_heads), "bfloat16")
    flash = flash_attention_fits(heads, heads) and not args.no_flash
    # The fused kernel against the explicit path on the same weights: largest logit difference (bfloat16).
    sample = random_tokens(2 * args.length, seed=2).astype("int32").reshape(2, args.length)
    fused_logits = np.asarray(model.predict_on_batch(sample), np.float32)
    explicit = build(attention_options={"attention_kernel": "query_blocks"})
    explicit.set_weights(model.get_weights())
    explicit_logits = np.asarray(explicit.predict_on_batch(sample), np.float32)
    if not flash:
        model = explicit
    model.compile(
        keras.optimizers.AdamW(6e-4, beta_2=0.95, weight_decay=0.1),
        TokenCrossEntropy() if args.loss == "token" else keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    tokens = random_tokens((args.warmup + args.steps) * args.batch * (args.length + 1)).astype("int32")
    windows = tokens.reshape(-1, args.length + 1)
    x, y = windows[:, :-1], windows[:, 1:]
    warm = args.warmup * args.batch
    model.fit(x[:warm], y[:warm], batch_size=args.batch, epochs=1, shuffle=False, verbose=0)
    start = time.perf_counter()
    history = model.fit(x[warm:], y[warm:], batch_size=args.batch, epochs=1, shuffle=False, verbose=0)
    float(history.history["loss"][-1])  # waits for the last step
    seconds = (time.perf_counter() - start) / args.steps
    parameters = model.count_params() - args.length * model.hidden_dim  # nanoGPT counts without positions
    return {
        "tokens_per_s": args.batch * args.length / seconds,
        "parameters": parameters,
        "layers": model.num_layers,
        "width": model.hidden_dim,
        "backend": keras.config.backend(),
        "flash_attention": flash,
        "fused_vs_explicit_max_logit_difference": float(np.max(np.abs(fused_logits - explicit_logits))),
        "logit_scale": float(np.max(np.abs(explicit_logits))),
        "final_loss": float(history.history["loss"][-1]),
        "loss_function": args.loss,
    }


def run_nanogpt(args):
    """nanoGPT's train.py on random ids (its own process, its own Python)."""
    workdir = tempfile.mkdtemp()
    for name in ("train.py", "model.py", "configurator.py"):
        shutil.copy(os.path.join(args.nanogpt, name), workdir)
    data = os.path.join(workdir, "data", "random")
    os.makedirs(data)
    random_tokens(4 * args.batch * args.length * (args.steps + args.warmup)).tofile(os.path.join(data, "train.bin"))
    random_tokens(args.batch * args.length * 8, seed=1).tofile(os.path.join(data, "val.bin"))
    sizes = SMALL if args.size == "small" else {"n_layer": 2, "n_head": 2, "n_embd": 64}
    iters = args.warmup + args.steps
    options = {
        **sizes,
        "dataset": "random",
        "batch_size": args.batch,
        "block_size": args.length,
        "dropout": 0.0,
        "gradient_accumulation_steps": 1,
        "max_iters": iters,
        "lr_decay_iters": iters,
        "eval_interval": 10**9,
        "eval_iters": 1,
        "log_interval": 1,
        "dtype": "bfloat16",
        "compile": args.device == "cuda",
        "device": args.device,
        "out_dir": os.path.join(workdir, "out"),
        "always_save_checkpoint": False,
    }
    output = subprocess.run(
        [args.peers_python, "train.py", *[f"--{k}={v}" for k, v in options.items()]],
        cwd=workdir,
        capture_output=True,
        text=True,
    )
    if output.returncode != 0:
        raise SystemExit(f"nanoGPT's train.py failed:\n{output.stderr[-3000:]}")
    output = output.stdout
    times = [float(t) for t in re.findall(r"^iter \d+: loss [\d.]+, time ([\d.]+)ms", output, re.M)]
    seconds = statistics.median(times[args.warmup :]) / 1e3
    return {"tokens_per_s": args.batch * args.length / seconds}


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--size", choices=("small", "tiny"), default="small", help="tiny: to try the script on a CPU")
    parser.add_argument("--nanogpt", help="a checkout of karpathy/nanoGPT: also run the peer")
    parser.add_argument("--peers-python", default=sys.executable)
    parser.add_argument("--device", default="cuda", help="the peer's device (cuda; cpu to try the script)")
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense bfloat16 peak (default: by its name)")
    parser.add_argument("--no-flash", action="store_true", help="ours without the fused attention kernel (ablation)")
    parser.add_argument(
        "--loss",
        choices=("token", "keras"),
        default="token",
        help="ours with keras_tfam.losses.TokenCrossEntropy (default) or Keras' sparse cross-entropy",
    )
    parser.add_argument("--engine", choices=("ours", "nanogpt"), help=argparse.SUPPRESS)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timing import add_smoke, forwarded_options, run_json, skipped, smoke_settings

    add_smoke(parser)
    args = smoke_settings(parser.parse_args(), size="tiny", batch=2, length=16, steps=2, warmup=1, device="cpu")
    if args.engine:
        print(json.dumps(run_ours(args) if args.engine == "ours" else run_nanogpt(args)))
        return
    forwarded = forwarded_options(args, "engine")
    ours = run_json(__file__, "--engine", "ours", *forwarded)
    name = "keras_tfam (JAX" + (", flash attention)" if ours["flash_attention"] else ")")
    results = {name: ours}
    if args.nanogpt and args.smoke:
        skipped("nanoGPT")
    elif args.nanogpt:
        results["nanoGPT (torch.compile)" if args.device == "cuda" else "nanoGPT"] = run_json(
            __file__, "--engine", "nanogpt", *forwarded
        )
    device, peak = _device(args)
    per_token = flops_per_token(ours["parameters"], ours["layers"], args.length, ours["width"])
    print(
        f"device: {device}; GPT-2 {args.size}, batch {args.batch} x {args.length}, bfloat16, {args.steps} timed steps\n"
    )
    print("| engine | tokens/s | keras_tfam / it | MFU |\n|---|---:|---:|---:|")
    for name, result in results.items():
        mfu = f"{100 * result['tokens_per_s'] * per_token / (peak * 1e12):.1f}%" if peak else "-"
        print(
            f"| {name} | {result['tokens_per_s']:,.0f} | {ours['tokens_per_s'] / result['tokens_per_s']:.2f}x | {mfu} |"
        )
    print(json.dumps({"device": device, "peak_tflops": peak, "results": results}))


def _device(args):
    try:
        name = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "no GPU", args.peak_tflops
    peak = args.peak_tflops or next((p for key, p in PEAKS_TFLOPS.items() if key in name), None)
    return name, peak


if __name__ == "__main__":
    main()
