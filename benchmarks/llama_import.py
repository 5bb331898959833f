"""Importing a Llama-shaped checkpoint: load time, peak memory and greedy decoding, ours vs transformers.

A random Llama of a few hundred million parameters (grouped-query heads,
untied head) is written by transformers in safetensors shards; then, each in
its own process (TensorFlow and torch in one process crash):

- ours: `keras_tfam.models.from_huggingface(dir)` (TensorFlow backend), then
  `generate` (compiled, cached) at batch 1 and 8;
- transformers: `AutoModelForCausalLM.from_pretrained(dir)`, then `generate`
  (greedy, KV cache) at batch 1 and 8.

Both in float32 on the CPU, same prompts, same number of new tokens; the
greedy tokens are compared. Load time is wall time from the call to a model
ready to run; peak memory is the process' maximum resident set, also given
above what the process held after importing its framework, and after
generating (transformers maps the weights from the files and touches them on
first use, so its peak after loading alone understates what it holds).

    .venv/bin/python benchmarks/llama_import.py [--layers 16 --hidden 1024] [--json out.json]
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

PROMPT, NEW = 32, 32


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_checkpoint(directory, layers, hidden, vocabulary):
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocabulary,
        hidden_size=hidden,
        intermediate_size=int(hidden * 2.75),
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 256,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(directory, max_shard_size="200MB")
    return sum(p.numel() for p in model.parameters())


def write_smoke_checkpoint(directory, layers, hidden, vocabulary):
    """A random Llama of the shape `write_checkpoint` makes, written with NumPy (`--smoke`: no torch); its
    parameter count."""
    import numpy as np
    from safetensors.numpy import save_file

    heads, groups, inner = hidden // 64, hidden // 256, int(hidden * 2.75)
    config = {"model_type": "llama", "vocab_size": vocabulary, "hidden_size": hidden, "intermediate_size": inner}
    config.update(num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=groups)
    config.update(max_position_embeddings=2048, tie_word_embeddings=False, hidden_act="silu", rms_norm_eps=1e-6)
    shapes = {"model.embed_tokens.weight": (vocabulary, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, shape in (
            ("self_attn.q_proj", (hidden, hidden)),
            ("self_attn.k_proj", (groups * 64, hidden)),
            ("self_attn.v_proj", (groups * 64, hidden)),
            ("self_attn.o_proj", (hidden, hidden)),
            ("mlp.gate_proj", (inner, hidden)),
            ("mlp.up_proj", (inner, hidden)),
            ("mlp.down_proj", (hidden, inner)),
            ("input_layernorm", (hidden,)),
            ("post_attention_layernorm", (hidden,)),
        ):
            shapes[f"{p}{name}.weight"] = shape
    shapes["lm_head.weight"] = (vocabulary, hidden)
    rng = np.random.default_rng(0)
    tensors = {name: rng.normal(1.0 if len(s) == 1 else 0.0, 0.02, s).astype("f4") for name, s in shapes.items()}
    save_file(tensors, os.path.join(directory, "model.safetensors"))
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    return sum(tensor.size for tensor in tensors.values())


def prompts(batch, vocabulary):
    import numpy as np

    return np.random.default_rng(0).integers(3, vocabulary, (batch, PROMPT))


def run_ours(directory, vocabulary):
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import numpy as np

    from keras_tfam.models import from_huggingface

    base = peak_mb()
    start = time.perf_counter()
    model = from_huggingface(directory)
    load = time.perf_counter() - start
    memory = peak_mb()
    result = {"load_s": load, "peak_mb": memory, "peak_above_imports_mb": memory - base}
    for batch in (1, 8):
        ids = prompts(batch, vocabulary).astype("int32")
        model.generate(ids, max_new_tokens=NEW)  # compiles
        start = time.perf_counter()
        tokens = np.asarray(model.generate(ids, max_new_tokens=NEW))
        result[f"tokens_per_s_b{batch}"] = batch * NEW / (time.perf_counter() - start)
        result[f"tokens_b{batch}"] = tokens[:, PROMPT:].tolist()
    result["peak_after_generate_mb"] = peak_mb()
    return result


def run_transformers(directory, vocabulary):
    import torch
    import transformers

    base = peak_mb()
    start = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    load = time.perf_counter() - start
    memory = peak_mb()
    result = {"load_s": load, "peak_mb": memory, "peak_above_imports_mb": memory - base}
    for batch in (1, 8):
        ids = torch.tensor(prompts(batch, vocabulary))
        arguments = dict(
            attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0
        )
        with torch.no_grad():
            model.generate(ids, **arguments)
            start = time.perf_counter()
            tokens = model.generate(ids, **arguments)
        result[f"tokens_per_s_b{batch}"] = batch * NEW / (time.perf_counter() - start)
        result[f"tokens_b{batch}"] = tokens[:, PROMPT:].tolist()
    result["peak_after_generate_mb"] = peak_mb()
    return result


def child(engine, directory, vocabulary):
    """Runs one engine in a fresh process; its result as a dict."""
    from timing import run_json

    return run_json(__file__, "--engine", engine, "--directory", directory, "--vocabulary", vocabulary)


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--vocabulary", type=int, default=32000)
    parser.add_argument("--json", default=None)
    parser.add_argument("--engine", choices=("ours", "transformers"), help=argparse.SUPPRESS)
    parser.add_argument("--directory", help=argparse.SUPPRESS)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timing import add_smoke, cpu, skipped, smoke_settings

    add_smoke(parser)
    args = smoke_settings(parser.parse_args(), layers=1, hidden=256, vocabulary=512)
    if args.engine:
        run = run_ours if args.engine == "ours" else run_transformers
        print(json.dumps(run(args.directory, args.vocabulary)))
        return
    engines = ("ours",) if args.smoke else ("ours", "transformers")
    with tempfile.TemporaryDirectory() as directory:
        if args.smoke:
            parameters = write_smoke_checkpoint(directory, args.layers, args.hidden, args.vocabulary)
            skipped("transformers")
        else:
            parameters = child_write(directory, args)
        results = {engine: child(engine, directory, args.vocabulary) for engine in engines}
    ours, peer = results["ours"], results.get("transformers")

    print(f"machine: {cpu()}")
    print(f"checkpoint: Llama-shaped, {parameters / 1e6:.0f}M parameters, float32 shards; prompts {PROMPT}, new {NEW}")
    print(f"{'':28s}{'ours':>12s}{'transformers':>14s}{'ratio':>8s}")
    rows = [
        ("load time (s)", "load_s", False),
        ("peak RSS after load (MB)", "peak_mb", False),
        ("  of which above imports (MB)", "peak_above_imports_mb", False),
        ("peak RSS after generating (MB)", "peak_after_generate_mb", False),
        ("greedy tok/s, batch 1", "tokens_per_s_b1", True),
        ("greedy tok/s, batch 8", "tokens_per_s_b8", True),
    ]
    for label, key, higher_is_better in rows:
        if peer is None:
            print(f"{label:28s}{ours[key]:12.2f}{'-':>14s}{'-':>8s}")
            continue
        ratio = ours[key] / peer[key] if higher_is_better else peer[key] / ours[key]
        print(f"{label:28s}{ours[key]:12.2f}{peer[key]:14.2f}{ratio:7.2f}x")
    for batch in (1, 8) if peer else ():
        same = ours[f"tokens_b{batch}"] == peer[f"tokens_b{batch}"]
        print(f"same greedy tokens at batch {batch}: {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": cpu(), "parameters": parameters, **results}, f, indent=1)


def child_write(directory, args):
    code = (
        "import sys; sys.path.insert(0, {here!r}); import llama_import as b; "
        "print(b.write_checkpoint({directory!r}, {layers}, {hidden}, {vocabulary}))"
    ).format(
        here=os.path.dirname(os.path.abspath(__file__)),
        directory=directory,
        layers=args.layers,
        hidden=args.hidden,
        vocabulary=args.vocabulary,
    )
    output = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return int(output.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
