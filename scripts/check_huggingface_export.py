"""Checks that transformers runs what `save_to_huggingface` writes as the library does: logits and greedy tokens.

    python scripts/check_huggingface_export.py [--peers-python .venv-peers/bin/python] [--out DIR]

1. In this interpreter (the project's environment): imports every Hugging Face
   fixture (tests/fixtures/hf-*-tiny, ../shared/fixtures/hf-*-tiny), builds a
   GPT2LM and a Qwen2-convention DecoderLM (a sliding window on one layer)
   from scratch, the `gpt2_tiny` preset with a byte-level BPE
   tokenizer trained by the pipelines, exports each to `DIR/<name>`, and saves
   our logits and greedy tokens for a fixed prompt (and our ids of a text where
   tokenizer files were written) to `DIR/<name>/ours.npz`.
2. Under `--peers-python` (an environment with transformers and torch), loads
   each directory with `AutoModelForCausalLM.from_pretrained` (and
   `AutoTokenizer`), saves the weights of a model it builds from the config
   with `save_pretrained` in about three shards, and writes transformers'
   results to `DIR/<name>/theirs.npz`.

Prints one line per model: the largest logit difference, whether the greedy
tokens (and tokenizer ids) match, and whether importing the export back gives
our logits exactly, and whether our export split into shards of the same size
has transformers' index. Exits 1 on any mismatch.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import keras
import numpy as np

from keras_tfam.convert import HuggingFaceTokenizer
from keras_tfam.models import GPT2LM, DecoderLM, from_huggingface

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE_FOLDERS = (os.path.join(ROOT, "tests", "fixtures"), os.path.join(ROOT, "..", "shared", "fixtures"))
NEW_TOKENS = 8
TOLERANCE = 1e-5  # float32 logits
TEXT = "The game began development in 2010, carrying over a large portion of the work."
BPE_LINES = [
    "The game began development in 2010, carrying over a large portion of the work done on its predecessor.",
    "It was released in January 2011 in Japan, and was the third game in the series.",
    "The tower is 324 metres tall, about the same height as an 81-storey building.",
] * 20

# Run by the peers' interpreter: transformers' logits, greedy tokens and tokenizer ids for each directory.
PEERS = r"""
import os, sys
import numpy as np, torch, transformers
for directory in sys.argv[1:]:
    ours = np.load(os.path.join(directory, "ours.npz"))
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    prompt = torch.tensor(ours["prompt"])
    with torch.no_grad():
        logits = model(prompt).logits.float().numpy()
    model.generation_config.eos_token_id = None  # ours generates without stopping; so do theirs
    tokens = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=int(ours["new_tokens"]),
        do_sample=False, pad_token_id=0,
    ).numpy()
    result = {"logits": logits, "tokens": tokens, "architecture": np.array(type(model).__name__)}
    if "text_ids" in ours:
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
        result["text_ids"] = np.array(tokenizer(str(ours["text"]))["input_ids"])
    sharded = os.path.join(directory, "transformers-sharded")
    fresh = transformers.AutoModelForCausalLM.from_config(model.config)  # a loaded model keeps the file's order
    fresh.load_state_dict(model.state_dict())
    fresh.save_pretrained(sharded, max_shard_size=int(ours["shard_size"]))
    index = os.path.join(sharded, "model.safetensors.index.json")
    result["shards"] = np.array(open(index).read() if os.path.isfile(index) else "{}")
    np.savez(os.path.join(directory, "theirs.npz"), **result)
"""


def _perturbed(model):
    """`model` with its norms and biases away from ones and zeros."""
    rng = np.random.default_rng(0)
    for variable in model.weights:
        if re.search(r"(gamma|beta|scale|bias)$", variable.path):
            variable.assign(rng.normal(0.5, 0.2, variable.shape).astype("float32"))
    return model


def _scratch_gpt2():
    """A GPT2LM from scratch."""
    keras.utils.set_random_seed(0)
    return _perturbed(GPT2LM(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16, max_sequence_length=32))


def _scratch_qwen2():
    """A Qwen2-convention DecoderLM from scratch: q/k/v biases, an untied head, a sliding window on layer 1."""
    keras.utils.set_random_seed(0)
    model = DecoderLM(
        vocabulary_size=64,
        num_layers=2,
        num_heads=4,
        hidden_dim=32,
        num_key_value_heads=2,
        position="rotary",
        position_options={"max_wavelength": 10000.0, "pairing": "half"},
        norm="rms",
        activation="swiglu",
        use_bias=False,
        attention_options={"qkv_bias": True},
        local_window=3,
        local_layers=[1],
        tie_embeddings=False,
        max_sequence_length=64,
    )
    return _perturbed(model)


def _preset_with_bpe():
    """The `gpt2_tiny` preset over a byte-level BPE tokenizer trained by the pipelines, and our ids of `TEXT`."""
    from pipelines.data.tokenizers import BPETokenizer

    tokenizer = BPETokenizer.train(BPE_LINES, vocabulary_size=320, min_frequency=2)
    keras.utils.set_random_seed(0)
    model = GPT2LM.from_preset("gpt2_tiny", vocabulary_size=tokenizer.vocabulary_size)
    ids = tokenizer.tokenize_prompt([TEXT])
    return model, tokenizer, (ids.to_list() if hasattr(ids, "to_list") else ids)[0]


def models():
    """`(name, model, tokenizer, our ids of TEXT or None)` of every model the check exports."""
    for folder in FIXTURE_FOLDERS:
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
            directory = os.path.join(folder, name)
            if re.fullmatch(r"hf-.*-tiny", name) and os.path.isfile(os.path.join(directory, "config.json")):
                tokenizer = None
                if os.path.isfile(os.path.join(directory, "tokenizer.json")):
                    tokenizer = HuggingFaceTokenizer(directory)
                text_ids = None if tokenizer is None else tokenizer.encode(TEXT)
                yield name, from_huggingface(directory), tokenizer, text_ids
    yield "gpt2-scratch", _scratch_gpt2(), None, None
    yield "qwen2-scratch", _scratch_qwen2(), None, None
    yield ("gpt2_tiny-bpe", *_preset_with_bpe())


def export_ours(out):
    """Step 1: each model exported to `out/<name>` with our results; the directories."""
    directories = []
    for name, model, tokenizer, text_ids in models():
        directory = os.path.join(out, name)
        model.save_to_huggingface(directory, tokenizer=tokenizer, dtype="float32")
        prompt = np.random.default_rng(0).integers(1, model.vocabulary_size, size=(2, 6))
        logits = keras.ops.convert_to_numpy(model(prompt))
        tokens = keras.ops.convert_to_numpy(model.generate(prompt, max_new_tokens=NEW_TOKENS))
        reimported = keras.ops.convert_to_numpy(from_huggingface(directory)(prompt))
        ours = dict(prompt=prompt, logits=logits, tokens=tokens, new_tokens=NEW_TOKENS, reimported=reimported)
        # The same weights split into about three shards, to compare with transformers' own split.
        shard_size = model.count_params() * 4 // 3
        model.save_to_huggingface(os.path.join(directory, "sharded"), dtype="float32", max_shard_size=shard_size)
        ours.update(shard_size=shard_size, shards=np.array(_weight_map(os.path.join(directory, "sharded"))))
        if text_ids is not None:
            ours.update(text=np.array(TEXT), text_ids=np.array(text_ids))
        np.savez(os.path.join(directory, "ours.npz"), **ours)
        directories.append(directory)
    return directories


def _weight_map(directory):
    """The index's `weight_map` of a sharded directory as sorted JSON text (`{}` for one file)."""
    path = os.path.join(directory, "model.safetensors.index.json")
    if not os.path.isfile(path):
        return "{}"
    with open(path, encoding="utf-8") as f:
        return json.dumps(json.load(f)["weight_map"], sort_keys=True)


def compare(directories):
    """Step 2's results against ours: one line per model; whether all match."""
    all_match = True
    for directory in directories:
        ours, theirs = np.load(os.path.join(directory, "ours.npz")), np.load(os.path.join(directory, "theirs.npz"))
        difference = float(np.max(np.abs(ours["logits"] - theirs["logits"])))
        tokens = np.array_equal(ours["tokens"], theirs["tokens"])
        text = "-" if "text_ids" not in ours else bool(np.array_equal(ours["text_ids"], theirs["text_ids"]))
        reimport = bool(np.array_equal(ours["reimported"], ours["logits"]))
        theirs_shards = json.dumps(json.loads(str(theirs["shards"])).get("weight_map", {}), sort_keys=True)
        shards = str(ours["shards"]) == theirs_shards
        match = difference <= TOLERANCE and tokens and text in ("-", True) and reimport and shards
        all_match &= match
        print(
            f"{os.path.basename(directory):<16} {str(theirs['architecture']):<20} max|logits diff| {difference:.2e}  "
            f"greedy tokens {'match' if tokens else 'DIFFER'}  tokenizer ids "
            f"{text if text == '-' else ('match' if text else 'DIFFER')}  "
            f"re-import {'equal' if reimport else 'DIFFERS'}  shards {'as transformers' if shards else 'DIFFER'}  "
            f"{'ok' if match else 'MISMATCH'}"
        )
    return all_match


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--peers-python",
        default=".venv-peers/bin/python",
        help="a Python with transformers and torch (benchmarks/install_peers.sh)",
    )
    parser.add_argument("--out", default=None, help="where the exports go (default: a new temporary directory)")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="hf-export-check-")
    directories = export_ours(out)
    peers = subprocess.run([args.peers_python, "-c", PEERS, *directories], capture_output=True, text=True)
    if peers.returncode != 0:
        print(f"transformers failed on the exports in {out}:\n{peers.stderr[-4000:]}", file=sys.stderr)
        return 1
    return 0 if compare(directories) else 1


if __name__ == "__main__":
    sys.exit(main())
