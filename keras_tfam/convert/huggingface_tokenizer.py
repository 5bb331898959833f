"""The tokenizer of a Hugging Face checkpoint directory: `tokenizer.json` or SentencePiece `tokenizer.model`.

`tokenizer.json` (Llama 3, Qwen2, Mistral, Gemma, GPT-2, ...) is read by the
`tokenizers` library, the one transformers' fast tokenizers run on, so ids are
the same; a SentencePiece `tokenizer.model` (Llama 2, Gemma) by the
`sentencepiece` library. Neither imports TensorFlow, so the tokenizer serves
every backend.

Special tokens follow transformers: where `tokenizer_config.json` sets
`add_bos_token` / `add_eos_token`, those decide; otherwise `tokenizer.json`'s
post-processor does (Llama 3 adds `<|begin_of_text|>`, Qwen2 adds nothing),
and a SentencePiece model adds BOS only (LlamaTokenizer's default).
"""

import json
import os
import shutil

# The files of a tokenizer directory, copied by `save_to_preset`.
FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json")


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
            self._sentencepiece = None
            self.vocabulary_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        elif os.path.isfile(model_path):
            import sentencepiece

            self._tokenizer = None
            try:
                self._sentencepiece = sentencepiece.SentencePieceProcessor(model_file=model_path)
            except (OSError, RuntimeError) as error:
                raise ValueError(f"{model_path} cannot be read as a SentencePiece model ({error})") from None
            self.vocabulary_size = self._sentencepiece.get_piece_size()
        else:
            found = sorted(os.listdir(directory)) if os.path.isdir(directory) else "no such directory"
            raise FileNotFoundError(f"No tokenizer.json nor tokenizer.model in {directory!r} (found: {found})")
        self.bos_token_id = self._id_of(self.config.get("bos_token"), "bos")
        self.eos_token_id = self._id_of(self.config.get("eos_token"), "eos")
        self.add_bos = self.config.get("add_bos_token")
        self.add_eos = self.config.get("add_eos_token")
        if self._sentencepiece is not None:
            self.add_bos = True if self.add_bos is None else self.add_bos
            self.add_eos = bool(self.add_eos)

    def save_to_preset(self, directory):
        """Copies the tokenizer's files into `directory` (a preset directory, or any other)."""
        os.makedirs(directory, exist_ok=True)
        for name in FILES:
            source = os.path.join(self.directory, name)
            if os.path.isfile(source) and os.path.abspath(source) != os.path.abspath(os.path.join(directory, name)):
                shutil.copyfile(source, os.path.join(directory, name))

    def _id_of(self, token, kind):
        token = _token_content(token)
        if self._sentencepiece is not None:
            if token is None:
                found = self._sentencepiece.bos_id() if kind == "bos" else self._sentencepiece.eos_id()
                return found if found >= 0 else None
            found = self._sentencepiece.piece_to_id(token)
            return found if self._sentencepiece.id_to_piece(found) == token else None
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
        if self._sentencepiece is not None:
            ids = self._sentencepiece.encode(text)
            return self._special(ids) if add_special_tokens else ids
        if self.add_bos is None and self.add_eos is None:
            return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return self._special(ids) if add_special_tokens else ids

    def decode(self, ids, skip_special_tokens=True):
        """The text of `ids` (special tokens left out unless `skip_special_tokens=False`)."""
        ids = [int(i) for i in ids]
        if self._sentencepiece is not None:
            if skip_special_tokens:
                special = {self.bos_token_id, self.eos_token_id}
                ids = [i for i in ids if i not in special]
            return self._sentencepiece.decode(ids)
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
