"""The tokenizer of a Hugging Face checkpoint directory: `tokenizer.json` or SentencePiece `tokenizer.model`.

`tokenizer.json` (Llama 3, Qwen2, Mistral, Gemma, GPT-2, ...) is read by the
`tokenizers` library, the one transformers' tokenizers run on, so ids are the
same. A directory with only a SentencePiece `tokenizer.model` (Llama 2,
Mistral 7B v0.1) is read as transformers 5 reads it: its BPE pieces become a
`tokenizers` BPE model (the merges ranked by the merged piece, as SentencePiece
ranks them) with the pre-tokenization of the `tokenizer_class` named in
`tokenizer_config.json`, `LlamaTokenizer` (the default) or `GemmaTokenizer`.
Running SentencePiece itself would give other ids: it puts its dummy prefix
before a leading space instead of in place of it, and it reads `<unk>` or
`</s>` in a text as characters, where transformers reads a special token.
Neither library imports TensorFlow, so the tokenizer serves every backend.

Special tokens follow transformers: where `tokenizer_config.json` sets
`add_bos_token` / `add_eos_token`, those decide; otherwise `tokenizer.json`'s
post-processor does (Llama 3 adds `<|begin_of_text|>`, Qwen2 adds nothing),
and a SentencePiece model adds BOS only (LlamaTokenizer's default).
"""

import json
import os
import shutil

from keras_tfam.models.preset_directory import TOKENIZER_FILES

# The files of a tokenizer directory, copied by `save_to_preset` (and removed by a preset saved without them).
FILES = TOKENIZER_FILES


def _token_content(token):
    return token.get("content") if isinstance(token, dict) else token


class HuggingFaceTokenizer:
    """Text to ids and back, as transformers' tokenizer of a checkpoint directory does it.

    Args:
        directory: a directory with `tokenizer.json` or `tokenizer.model`,
            and optionally `tokenizer_config.json`.

    Examples:
        >>> tokenizer = HuggingFaceTokenizer("tests/fixtures/hf-llama-tiny")  # any checkpoint directory
        >>> ids = tokenizer.encode("The game began development in 2010")
        >>> ids[0] == tokenizer.bos_token_id
        True
        >>> tokenizer.decode(ids)
        'The game began development in 2010'
    """

    def __init__(self, directory):
        self.directory = directory
        config_path = os.path.join(directory, "tokenizer_config.json")
        self.config = {}
        if os.path.isfile(config_path):
            try:
                with open(config_path, encoding="utf-8") as f:
                    self.config = json.load(f)
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                raise ValueError(f"{config_path} is not valid JSON ({error})") from None
        json_path = os.path.join(directory, "tokenizer.json")
        model_path = os.path.join(directory, "tokenizer.model")
        if os.path.isfile(json_path):
            from tokenizers import Tokenizer

            try:
                self._tokenizer = Tokenizer.from_file(json_path)
            except Exception as error:  # noqa: BLE001 - tokenizers raises a bare Exception on a bad file
                raise ValueError(f"{json_path} cannot be read as a tokenizer ({error})") from None
            from_model_file = False
            self.vocabulary_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        elif os.path.isfile(model_path):
            self._tokenizer, special_tokens = _from_sentencepiece(model_path, self.config)
            self.config = {**self.config, **special_tokens}
            from_model_file = True
            self.vocabulary_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        else:
            found = sorted(os.listdir(directory)) if os.path.isdir(directory) else "no such directory"
            raise FileNotFoundError(f"No tokenizer.json nor tokenizer.model in {directory!r} (found: {found})")
        self.bos_token_id = self._id_of(self.config.get("bos_token"))
        self.eos_token_id = self._id_of(self.config.get("eos_token"))
        self.add_bos = self.config.get("add_bos_token")
        self.add_eos = self.config.get("add_eos_token")
        if from_model_file:
            self.add_bos = True if self.add_bos is None else self.add_bos
            self.add_eos = bool(self.add_eos)

    def save_to_preset(self, directory):
        """Copies the tokenizer's files into `directory` (a preset directory, or any other)."""
        os.makedirs(directory, exist_ok=True)
        for name in FILES:
            source = os.path.join(self.directory, name)
            if os.path.isfile(source) and os.path.abspath(source) != os.path.abspath(os.path.join(directory, name)):
                shutil.copyfile(source, os.path.join(directory, name))

    def to_json(self):
        """The `tokenizers` pipeline this tokenizer runs, as `tokenizer.json` text (also for a `tokenizer.model`)."""
        return self._tokenizer.to_str()

    def _id_of(self, token):
        token = _token_content(token)
        return None if token is None else self._tokenizer.token_to_id(token)

    def _special(self, ids):
        if self.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        if self.add_eos and self.eos_token_id is not None:
            ids = [*ids, self.eos_token_id]
        return ids

    def encode(self, text, add_special_tokens=True):
        """Ids of `text` (a string, or a list of strings: a list of id lists)."""
        if not isinstance(text, str):
            return [self.encode(item, add_special_tokens) for item in text]
        if self.add_bos is None and self.add_eos is None:
            return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return self._special(ids) if add_special_tokens else ids

    def decode(self, ids, skip_special_tokens=True):
        """The text of `ids` (special tokens left out unless `skip_special_tokens=False`)."""
        ids = [int(i) for i in ids]
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


# SentencePiece's piece types (sentencepiece_model.proto).
_CONTROL, _USER_DEFINED, _BPE = 3, 4, 2
# transformers' special tokens of each tokenizer class read from a `tokenizer.model`, where the config names none.
_SENTENCEPIECE_DEFAULTS = {
    "LlamaTokenizer": {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
    "GemmaTokenizer": {
        "unk_token": "<unk>",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "mask_token": "<mask>",
    },
}


def _from_sentencepiece(path, config):
    """`(tokenizers.Tokenizer, default special tokens)` of a SentencePiece BPE `tokenizer.model`, as transformers 5
    builds it for the config's `tokenizer_class` (its `LlamaTokenizer` or `GemmaTokenizer`)."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    kind = str(config.get("tokenizer_class") or "LlamaTokenizer").removesuffix("Fast")
    if kind not in _SENTENCEPIECE_DEFAULTS:
        raise ValueError(
            f"A SentencePiece tokenizer.model is read as one of {sorted(_SENTENCEPIECE_DEFAULTS)} "
            f"(tokenizer_config.json's `tokenizer_class`; add the checkpoint's tokenizer.json for another). "
            f"Received: tokenizer_class={config.get('tokenizer_class')!r}"
        )
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        with open(path, "rb") as f:
            proto.ParseFromString(f.read())
    except Exception as error:  # noqa: BLE001 - protobuf raises its own DecodeError
        raise ValueError(f"{path} cannot be read as a SentencePiece model ({error})") from None
    if proto.trainer_spec.model_type != _BPE or not proto.pieces:
        raise ValueError(
            f"{path} must be a SentencePiece BPE model (Llama 2, Mistral, Gemma); a unigram model needs its "
            f"tokenizer.json. Received: model_type={proto.trainer_spec.model_type} with {len(proto.pieces)} pieces"
        )
    vocabulary = {piece.piece: index for index, piece in enumerate(proto.pieces)}
    defaults = _SENTENCEPIECE_DEFAULTS[kind]
    tokens = {name: _token_content(config.get(name)) or default for name, default in defaults.items()}
    model = BPE(
        vocabulary,
        _sentencepiece_merges(vocabulary),
        fuse_unk=True,
        byte_fallback=True,
        dropout=None,
        **({"unk_token": tokens["unk_token"]} if kind == "GemmaTokenizer" else {}),
    )
    tokenizer = Tokenizer(model)
    fuse = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if kind == "LlamaTokenizer":
        prefix = config.get("add_prefix_space")
        prefix = True if prefix is None else bool(prefix)
        scheme = ("always" if config.get("legacy", False) else "first") if prefix else "never"
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
        tokenizer.decoder = decoders.Sequence(fuse + ([decoders.Strip(content=" ", left=1)] if prefix else []))
    else:
        tokenizer.normalizer = normalizers.Replace(" ", "▁")
        tokenizer.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
        tokenizer.decoder = decoders.Sequence(fuse)
    # Control pieces and the named special tokens match as whole tokens in any text and are skipped when
    # decoding; user-defined pieces match whole too, and are kept.
    special = [*tokens.values(), *(p.piece for p in proto.pieces if p.type == _CONTROL)]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(special)])
    tokenizer.add_tokens([AddedToken(p.piece, normalized=False) for p in proto.pieces if p.type == _USER_DEFINED])
    return tokenizer, tokens


def _sentencepiece_merges(vocabulary):
    """The BPE merges of SentencePiece pieces: every split of a piece into two pieces of the vocabulary, ranked
    by the merged piece (SentencePiece stores its pieces best first), then by the shorter left part."""
    merges = []
    for piece, rank in vocabulary.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocabulary and right in vocabulary:
                merges.append((rank, cut, left, right))
    return [(left, right) for _, _, left, right in sorted(merges)]
