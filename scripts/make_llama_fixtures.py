"""Writes the tiny Llama-family checkpoints under tests/fixtures/ with transformers (the `bench` extra).

Each is a random model with settings chosen so that no default can hide a
mistake, saved by `save_pretrained`, with a tokenizer trained here on
WikiText-2 (validation split) in the family's style, and references computed
by transformers in float32 on the CPU:

    .venv/bin/python -m pip install -e '.[bench]'
    .venv/bin/python scripts/make_llama_fixtures.py [--data ../shared/data/wikitext-2]

Runs without TensorFlow (transformers and TensorFlow in one process crash).
"""

import argparse
import json
import os
import shutil

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
TINY = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
FAMILIES = {
    # Llama 3: grouped-query heads, rope theta 5e5 with Llama-3.1 scaling, untied head, written in 3 shards.
    "hf-llama-tiny": dict(
        config=transformers.LlamaConfig,
        arguments=dict(
            **TINY,
            num_key_value_heads=2,
            max_position_embeddings=64,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
            tie_word_embeddings=False,
            rms_norm_eps=1e-5,
        ),
        tokenizer="byte_level_bos",
        dtype=torch.float32,
        shard="40KB",
    ),
    # Mistral: a sliding window of 4, shorter than the prompts, linear rope scaling, grouped-query heads.
    "hf-mistral-tiny": dict(
        config=transformers.MistralConfig,
        arguments=dict(
            **TINY,
            num_key_value_heads=1,
            max_position_embeddings=64,
            sliding_window=4,
            rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0),
            tie_word_embeddings=False,
        ),
        tokenizer="metaspace",
        dtype=torch.float16,
        shard=None,
    ),
    # Qwen2: non-zero q/k/v biases, tied head, rope theta 1e6 with YaRN, bfloat16 weights.
    "hf-qwen2-tiny": dict(
        config=transformers.Qwen2Config,
        arguments=dict(
            **TINY,
            num_key_value_heads=2,
            max_position_embeddings=64,
            rope_parameters=dict(
                rope_type="yarn", rope_theta=1000000.0, factor=4.0, original_max_position_embeddings=16
            ),
            tie_word_embeddings=True,
        ),
        tokenizer="byte_level",
        dtype=torch.bfloat16,
        shard=None,
    ),
    # Gemma: head size x heads != width, one key/value head, randomised (1 + weight) norms, embeddings
    # scaled by sqrt(width), tanh GeGLU, dynamic NTK rope past a context of 8 (shorter than the references).
    "hf-gemma-tiny": dict(
        config=transformers.GemmaConfig,
        arguments=dict(
            **TINY,
            head_dim=24,
            num_key_value_heads=1,
            max_position_embeddings=8,
            rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0),
            hidden_act="gelu_pytorch_tanh",
        ),
        tokenizer="metaspace",
        dtype=torch.float32,
        shard=None,
    ),
}


def lines(data, split, count=None):
    with open(os.path.join(data, f"wiki.{split}.tokens"), encoding="utf-8") as f:
        text = [line.rstrip("\n") for line in f if line.strip()]
    return text[:count] if count else text


def train_tokenizer(style, data, vocabulary_size=320):
    """A BPE tokenizer of the family's style: `metaspace` (Llama 2, Mistral, Gemma: SentencePiece-like with
    byte fallback and `<s>` first), `byte_level` (Qwen2: GPT-2 bytes, no BOS), `byte_level_bos` (Llama 3)."""
    if style == "metaspace":
        special = ["<unk>", "<s>", "</s>"]
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tokenizer.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
        alphabet = [f"<0x{i:02X}>" for i in range(256)]
        trainer = trainers.BpeTrainer(
            vocab_size=vocabulary_size + 256, special_tokens=special + alphabet, show_progress=False
        )
        bos, eos = "<s>", "</s>"
    else:
        special = ["<|begin_of_text|>", "<|end_of_text|>"] if style == "byte_level_bos" else ["<|endoftext|>"]
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocabulary_size,
            special_tokens=special,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        bos, eos = (special[0], special[1]) if style == "byte_level_bos" else (None, special[0])
    tokenizer.train_from_iterator(lines(data, "valid"), trainer)
    if bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokenizer.token_to_id(bos))]
        )
    elif style == "byte_level":
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=bos, eos_token=eos, unk_token="<unk>" if style == "metaspace" else None
    )
    return fast


def perturb(model, generator):
    """Norm weights and biases away from their initial ones and zeros, so a dropped one shows."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))


def write(name, spec, data):
    directory = os.path.join(ROOT, name)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    torch.manual_seed(0)
    tokenizer = train_tokenizer(spec["tokenizer"], data)
    config = spec["config"](vocab_size=len(tokenizer), **spec["arguments"])
    if name == "hf-qwen2-tiny":
        config.bos_token_id, config.eos_token_id = None, tokenizer.eos_token_id
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    perturb(model, torch.Generator().manual_seed(1))
    model.to(spec["dtype"])
    save = {"max_shard_size": spec["shard"]} if spec["shard"] else {}
    model.save_pretrained(directory, **save)
    tokenizer.save_pretrained(directory)
    # The references come from the saved checkpoint as any user would load it, in float32.
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    # transformers rebuilds some families' pipelines (Qwen2: its own split pattern and NFC) when it loads a
    # tokenizer: saved again, tokenizer.json holds what transformers runs, as in a published checkpoint.
    transformers.AutoTokenizer.from_pretrained(directory).save_pretrained(directory)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    rng = np.random.default_rng(0)
    input_ids = rng.integers(0, config.vocab_size, (2, 11))
    prompt_ids = rng.integers(0, config.vocab_size, (2, 7))
    with torch.no_grad():
        logits = model(torch.tensor(input_ids)).logits.numpy()
        greedy = model.generate(
            torch.tensor(prompt_ids),
            attention_mask=torch.ones(prompt_ids.shape, dtype=torch.long),
            max_new_tokens=20,
            min_new_tokens=20,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
        ).numpy()
    texts = lines(data, "test", 40)
    encoded = [tokenizer(text)["input_ids"] for text in texts]
    np.savez(
        os.path.join(directory, "reference.npz"),
        input_ids=input_ids,
        logits=logits.astype(np.float32),
        prompt_ids=prompt_ids,
        greedy_ids=greedy,
        text_lengths=np.array([len(ids) for ids in encoded]),
        text_ids=np.concatenate([np.asarray(ids, dtype=np.int64) for ids in encoded]),
    )
    with open(os.path.join(directory, "texts.json"), "w", encoding="utf-8") as f:
        json.dump(texts, f, ensure_ascii=False, indent=0)
    print(name, "vocab", config.vocab_size, "files", sorted(os.listdir(directory)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_data = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "wikitext-2")
    parser.add_argument("--data", default=default_data)
    parser.add_argument("--only", nargs="*", default=list(FAMILIES))
    args = parser.parse_args()
    print("transformers", transformers.__version__, "torch", torch.__version__)
    for name in args.only:
        write(name, FAMILIES[name], args.data)


if __name__ == "__main__":
    main()
