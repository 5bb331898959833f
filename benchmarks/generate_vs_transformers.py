"""GPT-2 small greedy generation: keras_tfam against the engines a CPU user would otherwise pick.

    bash benchmarks/install_peers.sh            # a venv of the peers: torch (CPU), transformers, ONNX Runtime
    python benchmarks/generate_vs_transformers.py [--batch 1 8] [--prompt 32] [--new 128] [--peers-python PATH]

GPT-2 small (124M) from a random initialisation, written by transformers'
`save_pretrained` (safetensors). Every engine runs in its own process (torch and
TensorFlow in one process crash) and prints its result as JSON; this script,
which imports neither, compares them:

- `keras_tfam-float32`: `GPT2LM.from_huggingface`, XLA-compiled generate loop;
- `keras_tfam-bfloat16`: the same with bfloat16 weights (`generation.with_dtype`, the tied head included);
- `keras_tfam-int8`: the same after Keras' `model.quantize("int8")` (Dense layers and the tied embedding/head);
- `transformers-float32` / `-bfloat16`: `GPT2LMHeadModel.generate(do_sample=False, use_cache=True)`;
- `onnxruntime-float32` / `-int8`: the checkpoint exported by optimum (`ORTModelForCausalLM`, KV cache),
  int8 by ONNX Runtime's dynamic quantization of the exported graph (only where the peers' Python has
  `optimum` and `onnxruntime`);
- `llama.cpp-f32` / `-f16` / `-q8_0`: the checkpoint written as GGUF with the `gguf` package (the tensors
  and types `convert_hf_to_gguf.py` writes for GPT-2: matrices in the named type, position table, norms and
  biases in float32, the head tied to the token table) and decoded through llama-cpp-python's C API, every
  row of the batch a sequence of its own in one `llama_decode` per step (only where the peers' Python has
  `llama_cpp` and `gguf`). The checkpoint has no tokenizer and only ids are used: a byte-level one of the
  right size (256 bytes, 50,000 pair merges, `<|endoftext|>`) fills the GGUF's vocabulary.

Greedy, `--prompt` random prompt ids, `--new` new tokens, no stop token. Tokens/s
count new tokens, median of `--repeats` calls after a compiling call. float32
engines must produce transformers' float32 tokens; the others report the share
of positions whose tokens equal it. The machine (CPU model, flags, cores) heads
the output: figures from another machine kind are not comparable.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# Each engine family and the weight widths it runs at: its engines are FAMILY-WIDTH.
WIDTHS = {
    "keras_tfam": ("float32", "bfloat16", "int8"),
    "transformers": ("float32", "bfloat16"),
    "onnxruntime": ("float32", "int8"),
    "llama.cpp": ("f32", "f16", "q8_0"),
}
ENGINES = tuple(f"{family}-{width}" for family, widths in WIDTHS.items() for width in widths)
BF16_UNITS = ("avx512_bf16", "amx_bf16")
SMOKE_SKIPPED = ("keras_tfam-bfloat16",)  # ours that --smoke leaves out: a process less
VOCABULARY = 50257


def prompts(batch, length):
    import numpy as np

    return np.random.default_rng(batch).integers(0, VOCABULARY, size=(batch, length)).astype("int64")


def timed(generate, batches, length, new, repeats):
    """{batch: tokens/s} and {batch: generated ids} of `generate(prompt_ids) -> ids (batch, length + new)`."""
    from timing import median_seconds

    speeds, tokens = {}, {}
    for batch in batches:
        ids = prompts(batch, length)
        out = generate(ids)  # compiles, when the engine compiles
        seconds = median_seconds(lambda: generate(ids), warmup=0, repeats=repeats)
        speeds[batch] = batch * new / seconds
        tokens[batch] = [[int(t) for t in row[length:]] for row in out]
    return speeds, tokens


def write_checkpoint(directory):
    import torch
    import transformers

    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config()).save_pretrained(directory, safe_serialization=True)
    return {"transformers": transformers.__version__, "torch": torch.__version__}


def run_keras_tfam(directory, precision, args):
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # `KERAS_BACKEND=jax` on the GPU machine (no TensorFlow)
    import keras
    import numpy as np

    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs

    from keras_tfam.generation import with_dtype
    from keras_tfam.models import GPT2LM

    model = GPT2LM.from_huggingface(directory)
    if precision == "bfloat16":
        model = with_dtype(model, "bfloat16")
    elif precision == "int8":
        model.quantize("int8")  # Keras' own: the Dense layers and the tied embedding/head
    speeds, tokens = timed(
        lambda ids: np.asarray(model.generate(ids.astype("int32"), max_new_tokens=args.new)),
        args.batch,
        args.prompt,
        args.new,
        args.repeats,
    )
    backend = keras.config.backend()
    version = __import__(backend).__version__
    return {"tokens_per_s": speeds, "tokens": tokens, "version": f"keras {keras.__version__}, {backend} {version}"}


def hf_greedy(model, new, device="cpu"):
    """`ids -> ids` through a Hugging Face `generate` (transformers' or optimum's): greedy, `new` tokens, KV cache."""
    import torch

    def generate(ids):
        inputs = torch.tensor(ids, device=device)
        with torch.no_grad():
            return (
                model.generate(
                    inputs,
                    attention_mask=torch.ones_like(inputs),
                    max_new_tokens=new,
                    min_new_tokens=new,
                    do_sample=False,
                    use_cache=True,
                    pad_token_id=0,
                    eos_token_id=None,
                )
                .cpu()
                .numpy()
            )  # waits for the device

    return generate


def run_transformers(directory, precision, args):
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count())
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[precision]
    model = transformers.GPT2LMHeadModel.from_pretrained(directory, dtype=dtype).eval().to(args.device)

    speeds, tokens = timed(hf_greedy(model, args.new, args.device), args.batch, args.prompt, args.new, args.repeats)
    return {"tokens_per_s": speeds, "tokens": tokens, "version": f"transformers {transformers.__version__}"}


def run_onnxruntime(directory, precision, args):
    import onnxruntime
    from optimum.onnxruntime import ORTModelForCausalLM

    exported = tempfile.mkdtemp()
    ORTModelForCausalLM.from_pretrained(directory, export=True, use_cache=True).save_pretrained(exported)
    if precision == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        source = os.path.join(exported, "model.onnx")
        quantize_dynamic(source, os.path.join(exported, "model_int8.onnx"), weight_type=QuantType.QInt8)
        model = ORTModelForCausalLM.from_pretrained(exported, file_name="model_int8.onnx", use_cache=True)
    else:
        model = ORTModelForCausalLM.from_pretrained(exported, use_cache=True)

    speeds, tokens = timed(hf_greedy(model, args.new), args.batch, args.prompt, args.new, args.repeats)
    return {"tokens_per_s": speeds, "tokens": tokens, "version": f"onnxruntime {onnxruntime.__version__}"}


def byte_level_vocabulary(size):
    """A byte-level BPE vocabulary of `size` tokens: GPT-2's 256 byte characters, then merged pairs of them,
    then `<|endoftext|>`. `(tokens, merges)`."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    extra = iter(range(256, 512))
    chars = [chr(b) if b in printable else chr(next(extra)) for b in range(256)]
    pairs = [(a, b) for a in chars for b in chars][: size - 257]
    return chars + [a + b for a, b in pairs] + ["<|endoftext|>"], [f"{a} {b}" for a, b in pairs]


def write_gguf(directory, precision, path):
    """The transformers checkpoint in `directory` as a llama.cpp GGUF file, matrices in `precision`."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    width = config["n_embd"]
    writer = gguf.GGUFWriter(path, "gpt2")
    writer.add_context_length(config["n_positions"])
    writer.add_embedding_length(width)
    writer.add_feed_forward_length(config.get("n_inner") or 4 * width)
    writer.add_block_count(config["n_layer"])
    writer.add_head_count(config["n_head"])
    writer.add_layer_norm_eps(config["layer_norm_epsilon"])
    file_type = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }[precision]
    writer.add_file_type(file_type)
    tokens, merges = byte_level_vocabulary(config["vocab_size"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - 1) + [gguf.TokenType.CONTROL])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(len(tokens) - 1)
    writer.add_eos_token_id(len(tokens) - 1)

    names = {
        "wte": "token_embd",
        "wpe": "position_embd",
        "ln_f": "output_norm",
        "ln_1": "attn_norm",
        "attn.c_attn": "attn_qkv",
        "attn.c_proj": "attn_output",
        "ln_2": "ffn_norm",
        "mlp.c_fc": "ffn_up",
        "mlp.c_proj": "ffn_down",
    }
    for name, value in load_file(os.path.join(directory, "model.safetensors")).items():
        name = name.removeprefix("transformer.")
        if name.startswith("lm_head.") or name.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # the head is the token table (tied); the others are causal-mask buffers
        parts = name.split(".")
        prefix, kind = (f"blk.{parts[1]}.", ".".join(parts[2:-1])) if parts[0] == "h" else ("", ".".join(parts[:-1]))
        target = f"{prefix}{names[kind]}.{parts[-1]}"
        value = value.astype(np.float32)
        if prefix and value.ndim == 2:
            value = np.ascontiguousarray(value.T)  # transformers' Conv1D stores (in, out); GGUF rows are outputs
        if value.ndim == 1 or kind == "wpe" or precision == "f32":
            writer.add_tensor(target, value)
        elif precision == "f16":
            writer.add_tensor(target, value.astype(np.float16))
        else:
            quantized = gguf.quants.quantize(value, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(target, quantized, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def run_llama_cpp(directory, precision, args):
    import llama_cpp
    import numpy as np

    path = os.path.join(tempfile.mkdtemp(), f"gpt2-{precision}.gguf")
    write_gguf(directory, precision, path)
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = not args.no_extra_buffers
    model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    vocabulary = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    contexts = {}

    def context(batch):
        """A context of `batch` sequences, each with room for the prompt and the new tokens."""
        if batch not in contexts:
            params = llama_cpp.llama_context_default_params()
            params.n_seq_max = batch
            params.n_ctx = batch * 256 * -(-(args.prompt + args.new) // 256)
            params.n_batch = params.n_ubatch = max(512, batch * args.prompt)
            params.n_threads = params.n_threads_batch = os.cpu_count()
            contexts[batch] = (
                llama_cpp.llama_init_from_model(model, params),
                llama_cpp.llama_batch_init(params.n_batch, 0, batch),
            )
        return contexts[batch]

    def generate(ids):
        rows, length = ids.shape
        ctx, tokens = context(rows)
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)

        def step(block, start):
            """Feeds `block (rows, t)` at positions `start..`, row r as sequence r: the greedy next tokens."""
            n = 0
            for row, values in enumerate(block):
                for offset, token in enumerate(values):
                    tokens.token[n], tokens.pos[n] = int(token), start + offset
                    tokens.n_seq_id[n], tokens.seq_id[n][0] = 1, row
                    tokens.logits[n] = offset == len(values) - 1
                    n += 1
            tokens.n_tokens = n
            if llama_cpp.llama_decode(ctx, tokens) != 0:
                raise RuntimeError("llama_decode failed")
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(rows, vocabulary))
            return logits.argmax(-1)

        out = [step(ids, 0)]
        for position in range(length, length + args.new - 1):
            out.append(step(out[-1][:, None], position))
        return np.concatenate([ids, np.stack(out, axis=1)], axis=1)

    speeds, tokens = timed(generate, args.batch, args.prompt, args.new, args.repeats)
    version = f"llama-cpp-python {llama_cpp.__version__}" + (", no extra buffer types" if args.no_extra_buffers else "")
    return {"tokens_per_s": speeds, "tokens": tokens, "version": version}


RUNNERS = {
    "keras_tfam": run_keras_tfam,
    "transformers": run_transformers,
    "onnxruntime": run_onnxruntime,
    "llama.cpp": run_llama_cpp,
}


def has_modules(python, *modules):
    check = "import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))"
    return subprocess.run([python, "-c", check, *modules], capture_output=True).returncode == 0


def default_engines(device):
    """Every engine, less transformers' bfloat16 on a CPU without bfloat16 units (PyTorch emulates its products there:
    more than 15 minutes for one run of that engine on a 2-core AVX2 EPYC, against about one for float32)."""
    from timing import cpu_flags

    if device != "cpu" or cpu_flags() & set(BF16_UNITS):
        return list(ENGINES)
    print(
        f"transformers-bfloat16: skipped (this CPU has none of {', '.join(BF16_UNITS)}; name it in --engines to run it)"
    )
    return [engine for engine in ENGINES if engine != "transformers-bfloat16"]


def compare(args):
    from timing import SMOKE_SKIP, cpu, run_json, skipped, smoke_folder, tiny_gpt2_checkpoint

    peers = args.peers_python or sys.executable
    needs = {
        "transformers": ("torch", "transformers"),
        "onnxruntime": ("optimum.onnxruntime", "onnxruntime"),
        "llama.cpp": ("llama_cpp", "gguf", "safetensors"),
    }
    directory = smoke_folder("generate_vs_transformers") if args.smoke else tempfile.mkdtemp()
    common = ["--batch", *args.batch, "--prompt", args.prompt, "--new", args.new, "--repeats", args.repeats]
    common += ["--device", args.device]
    if args.smoke:  # a tiny GPT-2 of our own; the peers do not run
        tiny_gpt2_checkpoint(directory, positions=args.prompt + args.new)
        versions = {"torch": "not run", "transformers": "not run (--smoke)"}
    else:
        versions = run_json(__file__, "--engine", "write", "--checkpoint", directory, python=peers)
    results = {}
    for engine in args.engines or default_engines(args.device):
        family = engine.split("-")[0]
        python = sys.executable if family == "keras_tfam" else peers
        if args.smoke and (family != "keras_tfam" or engine in SMOKE_SKIPPED):
            skipped(engine, SMOKE_SKIP if family != "keras_tfam" else "--smoke runs ours in float32 and int8")
            continue
        if family in needs and not has_modules(python, *needs[family]):
            print(f"{engine}: skipped ({python} lacks {', '.join(needs[family])}: see benchmarks/install_peers.sh)")
            continue
        # llama.cpp's repacked and AMX kernels (its "extra buffer types") can stop on an instruction a virtual
        # machine's CPU reports but does not run (AMX int8 here): then once more on its plain CPU kernels.
        attempts = ([], ["--no-extra-buffers"]) if family == "llama.cpp" else ([],)
        for extra in attempts:
            try:
                run = ("--engine", engine, "--checkpoint", directory, *common, *extra)
                results[engine] = run_json(__file__, *run, python=python, timeout=args.timeout)
                break
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                print(f"{' '.join([engine, *extra])}: no result ({str(error).splitlines()[0]})", flush=True)
        if engine not in results:
            continue
        print(f"{engine}: done ({results[engine]['version']})", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": cpu(), "settings": vars(args), "results": results}, f)

    where = cpu() if args.device == "cpu" else f"{gpu_name()} (host: {cpu()})"
    print(f"\nmachine: {where}; torch {versions['torch']}, transformers {versions['transformers']}")
    print(
        f"GPT-2 small, random weights, prompt {args.prompt}, {args.new} new tokens, greedy, median of {args.repeats}\n"
    )
    reference = results.get("transformers-float32")
    for batch in map(str, args.batch):
        print(
            f"batch {batch}:\n\n| engine | tok/s | keras_tfam float32 / it | tokens = transformers float32 |\n"
            "|---|---:|---:|---:|"
        )
        ours = results.get("keras_tfam-float32", {}).get("tokens_per_s", {}).get(batch)
        for engine, result in results.items():
            speed = result["tokens_per_s"][batch]
            ratio = f"{ours / speed:.2f}x" if ours else "-"
            same = "-"
            if reference:
                a, b = result["tokens"][batch], reference["tokens"][batch]
                same = f"{100 * sum(x == y for r, s in zip(a, b) for x, y in zip(r, s)) / sum(map(len, b)):.1f}%"
            print(f"| {engine} | {speed:.1f} | {ratio} | {same} |")
        print()
    if reference and "keras_tfam-float32" in results:
        for batch in map(str, args.batch):
            if results["keras_tfam-float32"]["tokens"][batch] != reference["tokens"][batch]:
                raise SystemExit(f"batch {batch}: keras_tfam float32 tokens differ from transformers' float32 tokens")


def gpu_name():
    query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
    try:
        return subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "a GPU"


def main():
    from timing import add_smoke, smoke_settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--engines",
        nargs="+",
        choices=ENGINES,
        help="default: all, less transformers-bfloat16 on a CPU without bfloat16 units",
    )
    parser.add_argument("--peers-python", help="the Python of the peers (default: this one)")
    parser.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="the peers' device; ours runs where its backend does (JAX on a GPU: KERAS_BACKEND=jax)",
    )
    parser.add_argument("--timeout", type=float, default=1200, help="seconds an engine may take (then: no result)")
    parser.add_argument("--json", help="also write the results there, engine by engine")
    add_smoke(parser)
    parser.add_argument("--no-extra-buffers", action="store_true", help=argparse.SUPPRESS)  # llama.cpp (internal)
    parser.add_argument("--engine", help=argparse.SUPPRESS)  # one engine, in this process (internal)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = smoke_settings(parser.parse_args(), batch=[1], prompt=8, new=4, repeats=1)
    if args.engine is None:
        return compare(args)
    if args.engine == "write":
        result = write_checkpoint(args.checkpoint)
    else:
        family, precision = args.engine.split("-")
        result = RUNNERS[family](args.checkpoint, precision, args)
    print(json.dumps(result))


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main()
