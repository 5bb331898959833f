"""A Hugging Face `tokenizer.json` BPE pipeline as TensorFlow ops: text in, text out, inside a SavedModel.

`GraphTokenizer(tokenizer_json)` reads the JSON that the `tokenizers` library
writes (`Tokenizer.to_str()`) and gives the same ids and text as that library
(and so as transformers) for the pipelines of the Llama family and GPT-2:

- added tokens: matched whole in the raw text, longest first;
- normalizers: none, `NFC`/`NFD`/`NFKC`/`NFKD`, `Prepend`, `Replace` of a
  string, and `Sequence`s of those;
- pre-tokenizers: `ByteLevel` (GPT-2's split pattern), `Split` with the split
  pattern of GPT-2, Llama 3 or Qwen2 followed by a `ByteLevel` without its
  own pattern, `Metaspace`, a `Split` on a string (merged with the previous
  piece), and none;
- the `BPE` model: byte-level or SentencePiece-style (characters, with
  `byte_fallback`), `ignore_merges`, `unk_token` with `fuse_unk`;
- decoders: `ByteLevel`, and the SentencePiece chain
  `Replace("▁", " ")`, `ByteFallback`, `Fuse`, `Strip`.

Anything else raises `UnsupportedTokenizer` naming the component, and the
caller keeps the tokenizer in Python.

The merges run as a loop over all words at once, one merge a word per step
(the lowest-ranked pair, the leftmost of equals, as `tokenizers` merges), so
a word of n symbols takes up to n steps over a batch as wide as the longest
word. That suits prompts; a SentencePiece-style pipeline, whose words are
whole lines, takes about half a second for 40 lines of WikiText-2, so a
training set is tokenized in Python (`CheckpointTokenizer.tokenize`).

The split patterns use a look-ahead, `\\s+(?!\\S)`, which TensorFlow's regular
expressions (RE2) lack: a run of whitespace before a word leaves its last
character to the word. Here the text is cut before that character first (in
the run of whitespace other than line breaks, where the pattern matches line
breaks on their own), and the pattern without the look-ahead runs on each
piece; `\\s` is Oniguruma's Unicode whitespace, where RE2's is ASCII only.
"""

import json

import tensorflow as tf
import tensorflow_text as tf_text


class UnsupportedTokenizer(ValueError):
    """A `tokenizer.json` component without an exact TensorFlow version here."""


# Oniguruma's `\s` (the regex engine of `tokenizers`): U+0009..U+000D, U+0085 and the separators Zs, Zl, Zp.
_WHITESPACE = r"\t\n\x0b\f\r\x{85}\p{Z}"
_WHITESPACE_BUT_LINE_BREAKS = r"\t\x0b\f\x{85}\p{Z}"
_LOOK_AHEAD = r"|\s+(?!\S)|\s+"
# The split patterns read exactly: {pattern: whether line breaks have an alternative of their own}.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
SPLIT_PATTERNS = {GPT2_PATTERN: False, LLAMA3_PATTERN: True, QWEN2_PATTERN: True}
# Cuts the text where the look-ahead would end a run of whitespace (a byte that UTF-8 text never holds).
_CUT = "\xff"
_REPLACEMENT_CHARACTER = "\ufffd".encode("utf-8")


def _bytes_to_unicode():
    """GPT-2's byte-level alphabet: byte -> the printable character standing for it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(others)}}


def _literal(text):
    """An RE2 pattern matching `text` literally."""
    return "".join(f"\\x{{{ord(c):x}}}" for c in text)


def _re2(pattern):
    """A split pattern without its look-ahead alternative, `\\s` as Unicode whitespace, for RE2."""
    pattern = pattern.replace(_LOOK_AHEAD, r"|\s+")
    pattern = pattern.replace(r"[^\s", "[^" + _WHITESPACE).replace(r"\s", "[" + _WHITESPACE + "]")
    return pattern.replace(r"\S", "[^" + _WHITESPACE + "]")


def _static_table(keys, values, key_dtype, value_dtype, default):
    initializer = tf.lookup.KeyValueTensorInitializer(
        tf.constant(keys, key_dtype), tf.constant(values, value_dtype), key_dtype, value_dtype
    )
    return tf.lookup.StaticHashTable(initializer, default_value=tf.constant(default, value_dtype))


def _components(spec, kind):
    """The list of components of a normalizer / pre-tokenizer / decoder (`Sequence`s flattened)."""
    if spec is None:
        return []
    if spec["type"] == "Sequence":
        key = {"normalizer": "normalizers", "pre-tokenizer": "pretokenizers", "decoder": "decoders"}[kind]
        return [part for item in spec[key] for part in _components(item, kind)]
    return [spec]


def _unsupported(kind, spec):
    return UnsupportedTokenizer(
        f"The tokenizer's {kind} {json.dumps(spec, ensure_ascii=False)[:200]} has no TensorFlow version here"
    )


def _string_pattern(spec, kind):
    pattern = spec.get("pattern", {})
    if "String" not in pattern:
        raise _unsupported(kind, spec)
    return pattern["String"]


class GraphTokenizer(tf.Module):
    """Encodes text to ids and decodes ids to text with TensorFlow ops, as the `tokenizers` library does.

    Args:
        tokenizer_json: the JSON text of a `tokenizers` tokenizer (a
            `tokenizer.json` file, or `Tokenizer.to_str()`).

    Raises:
        UnsupportedTokenizer: a component has no exact TensorFlow version.

    Example:
        >>> from tokenizers import Tokenizer
        >>> tokenizer = Tokenizer.from_file("tests/fixtures/hf-qwen2-tiny/tokenizer.json")
        >>> graph = GraphTokenizer(tokenizer.to_str())
        >>> graph.encode(tf.constant(["Hello  world"])).to_list()[0] == tokenizer.encode("Hello  world").ids
        True
    """

    def __init__(self, tokenizer_json):
        super().__init__()
        spec = json.loads(tokenizer_json)
        model = spec.get("model") or {}
        if model.get("type") != "BPE":
            raise _unsupported("model", {"type": model.get("type")})
        self._read_added_tokens(spec.get("added_tokens") or [], spec.get("normalizer") is not None)
        self._read_normalizer(spec.get("normalizer"))
        self._read_pre_tokenizer(spec.get("pre_tokenizer"))
        self._read_model(model)
        self._read_decoder(spec.get("decoder"))

    # -- reading tokenizer.json --------------------------------------------------------------------------------

    def _read_added_tokens(self, added, normalizes):
        for token in added:
            flags = [name for name in ("lstrip", "rstrip", "single_word") if token.get(name)]
            if flags or (normalizes and token.get("normalized")):
                raise _unsupported("added token", token)
        # Longest first: RE2 takes the first alternative at the leftmost position, `tokenizers` the longest.
        contents = sorted({token["content"] for token in added}, key=lambda c: (-len(c), c))
        self._added_pattern = "|".join(_literal(c) for c in contents) if contents else None
        self._added = {token["content"]: token["id"] for token in added}
        self._special_ids = {token["id"] for token in added if token.get("special")}
        if self._added:
            self._added_table = _static_table(list(self._added), list(self._added.values()), tf.string, tf.int64, -1)

    def _read_normalizer(self, spec):
        self._normalizers = []
        for part in _components(spec, "normalizer"):
            kind = part["type"]
            if kind in ("NFC", "NFD", "NFKC", "NFKD"):
                self._normalizers.append(("unicode", kind))
            elif kind == "Prepend":
                self._normalizers.append(("prepend", part["prepend"]))
            elif kind == "Replace":
                self._normalizers.append(("replace", (_string_pattern(part, "normalizer"), part["content"])))
            else:
                raise _unsupported("normalizer", part)

    def _read_pre_tokenizer(self, spec):
        self.byte_level = False
        self._split_pattern = None  # (RE2 pattern, cut pattern)
        self._prefix_space = False
        self._metaspace = None  # (replacement, prepend scheme, split)
        self._merged_with_previous = None
        parts = _components(spec, "pre-tokenizer")
        for index, part in enumerate(parts):
            kind = part["type"]
            if kind == "ByteLevel" and index == len(parts) - 1 and not self.byte_level:
                self.byte_level = True
                if part.get("use_regex", True):
                    if self._split_pattern is not None:
                        raise _unsupported("pre-tokenizer", part)
                    self._use_split_pattern(GPT2_PATTERN)
                    self._prefix_space = bool(part.get("add_prefix_space"))
                elif part.get("add_prefix_space"):
                    raise _unsupported("pre-tokenizer", part)
            elif kind == "Split" and index == 0 and "Regex" in part.get("pattern", {}):
                regex = part["pattern"]["Regex"]
                if part.get("behavior") != "Isolated" or part.get("invert") or regex not in SPLIT_PATTERNS:
                    raise _unsupported("pre-tokenizer", part)
                self._use_split_pattern(regex)
            elif kind == "Split" and len(parts) == 1 and part.get("behavior") == "MergedWithPrevious":
                if part.get("invert") or len(_string_pattern(part, "pre-tokenizer")) != 1:
                    raise _unsupported("pre-tokenizer", part)
                self._merged_with_previous = _string_pattern(part, "pre-tokenizer")
            elif kind == "Metaspace" and len(parts) == 1 and len(part.get("replacement", "▁")) == 1:
                scheme = part.get("prepend_scheme") or ("always" if part.get("add_prefix_space", True) else "never")
                self._metaspace = (part.get("replacement", "▁"), scheme, bool(part.get("split", True)))
            else:
                raise _unsupported("pre-tokenizer", part)

    def _use_split_pattern(self, pattern):
        spaces = _WHITESPACE_BUT_LINE_BREAKS if SPLIT_PATTERNS[pattern] else _WHITESPACE
        cut = f"([{spaces}])([{spaces}][^{_WHITESPACE}])"
        self._split_pattern = (_re2(pattern), cut)

    def _read_model(self, model):
        for name in ("continuing_subword_prefix", "end_of_word_suffix", "dropout"):
            if model.get(name):
                raise _unsupported("model", {name: model[name]})
        vocabulary = model["vocab"]
        self._vocabulary = vocabulary
        self._key_base = max(vocabulary.values(), default=0) + 1
        self._vocabulary_table = _static_table(list(vocabulary), list(vocabulary.values()), tf.string, tf.int64, -1)
        self.ignore_merges = bool(model.get("ignore_merges"))
        unk = model.get("unk_token")
        self._unk_id = vocabulary.get(unk, -1) if unk is not None else -1
        self._fuse_unk = bool(model.get("fuse_unk"))
        self._byte_fallback = bool(model.get("byte_fallback"))
        merges = {}
        for rank, merge in enumerate(model.get("merges") or []):
            left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
            if left not in vocabulary or right not in vocabulary or left + right not in vocabulary:
                raise ValueError(f"The BPE merge {left!r} + {right!r} names a token outside the vocabulary")
            merges[vocabulary[left] * self._key_base + vocabulary[right]] = (rank, vocabulary[left + right])
        keys = list(merges) or [-1]
        ranks, merged = zip(*merges.values()) if merges else ((0,), (0,))
        self._no_merge = len(model.get("merges") or []) + 1
        self._rank_table = _static_table(keys, list(ranks), tf.int64, tf.int64, self._no_merge)
        self._merged_table = _static_table(keys, list(merged), tf.int64, tf.int64, -1)
        if self.byte_level:
            alphabet = _bytes_to_unicode()
            keys = [bytes([b]) for b in range(256)]
            self._byte_ids = _static_table(
                keys, [vocabulary.get(alphabet[b], -1) for b in range(256)], tf.string, tf.int64, -1
            )
            self._byte_chars = _static_table(keys, [alphabet[b] for b in range(256)], tf.string, tf.string, "")
        elif self._byte_fallback:
            codes = [f"<0x{b:02X}>" for b in range(256)]
            if any(code not in vocabulary for code in codes):
                missing = [c for c in codes if c not in vocabulary][:4]
                raise _unsupported("model", {"byte_fallback": True, "missing": missing})
            self._fallback_ids = _static_table(
                [bytes([b]) for b in range(256)], [vocabulary[c] for c in codes], tf.string, tf.int64, -1
            )

    def _read_decoder(self, spec):
        parts = _components(spec, "decoder")
        kinds = [part["type"] for part in parts]
        chain = kinds[:-1] if kinds[-1:] == ["Strip"] else kinds
        tokens = {index: token for token, index in self._vocabulary.items()}
        tokens.update({index: token for token, index in self._added.items()})
        size = max(tokens, default=-1) + 1
        texts = [tokens.get(index, "") for index in range(size)]
        self._lossy = kinds == ["ByteLevel"]
        self._strip = 0
        self._byte_tokens = None
        if self._lossy:
            alphabet = {char: byte for byte, char in _bytes_to_unicode().items()}
            pieces = [
                bytes(alphabet[c] for c in text) if all(c in alphabet for c in text) else text.encode("utf-8")
                for text in texts
            ]
        elif chain in (["Replace", "ByteFallback", "Fuse"], ["Replace", "Fuse"]):
            old, new = _string_pattern(parts[0], "decoder"), parts[0]["content"]
            if chain != kinds:
                strip = parts[-1]
                if strip.get("content") != " " or strip.get("stop", 0):
                    raise _unsupported("decoder", strip)
                self._strip = int(strip.get("start", 0))
            pieces = [text.replace(old, new).encode("utf-8") for text in texts]
            if "ByteFallback" in kinds:
                values = [
                    int(t[3:5], 16) if len(t) == 6 and t[:3] == "<0x" and t[5] == ">" and _hex(t[3:5]) else -1
                    for t in texts
                ]
                self._byte_tokens = tf.constant(values, tf.int32)
                pieces = [bytes([v]) if v >= 0 else piece for v, piece in zip(values, pieces)]
        else:
            raise _unsupported("decoder", spec)
        self._pieces = tf.constant(pieces, tf.string)
        self._skipped = tf.constant([index in self._special_ids for index in range(size)], tf.bool)

    # -- encoding ----------------------------------------------------------------------------------------------

    def encode(self, texts):
        """Ids of each text `(N,)` -> ragged int32 `(N, None)`, without special tokens added (BOS/EOS)."""
        texts = tf.convert_to_tensor(texts, tf.string)
        if self._added_pattern is not None:
            pieces, starts, _ = tf_text.regex_split_with_offsets(texts, self._added_pattern, self._added_pattern)
            added = self._added_table.lookup(pieces.flat_values)
            first = tf.equal(starts.flat_values, 0)
        else:
            nonempty = tf.cast(tf.strings.length(texts) > 0, tf.int64)
            pieces = tf.RaggedTensor.from_tensor(texts[:, None], lengths=nonempty)
            added = tf.fill(tf.shape(pieces.flat_values), tf.constant(-1, tf.int64))
            first = tf.ones(tf.shape(pieces.flat_values), tf.bool)
        flat = pieces.flat_values
        is_added = added >= 0
        plain = tf.where(~is_added)[:, 0]
        ids = self._encode_pieces(tf.gather(flat, plain), tf.gather(first, plain))
        added_at = tf.where(is_added)[:, 0]
        added_ids = tf.RaggedTensor.from_tensor(tf.gather(added, added_at)[:, None])
        # Back in the order of the pieces: plain ones first, then added ones, gathered by their positions.
        order = tf.argsort(tf.concat([plain, added_at], axis=0))
        per_piece = tf.gather(tf.concat([ids, added_ids], axis=0), order)
        ids = tf.RaggedTensor.from_row_splits(per_piece, pieces.row_splits).merge_dims(1, 2)
        return tf.cast(ids, tf.int32)

    def _encode_pieces(self, pieces, first):
        """Ids of pieces of text without added tokens `(P,)` -> ragged int64 `(P, None)`."""
        for kind, value in self._normalizers:
            if kind == "unicode":
                pieces = tf_text.normalize_utf8(pieces, value)
            elif kind == "prepend":
                pieces = tf.where(tf.strings.length(pieces) > 0, tf.strings.join([value, pieces]), pieces)
            else:
                pieces = tf.strings.regex_replace(pieces, _literal(value[0]), value[1].replace("\\", "\\\\"))
        words = self._pre_tokenize(pieces, first)
        return tf.RaggedTensor.from_row_splits(self._bpe(words.flat_values), words.row_splits).merge_dims(1, 2)

    def _pre_tokenize(self, pieces, first):
        """Words of each piece `(P,)` -> ragged strings `(P, None)`."""
        if self._prefix_space:
            pieces = tf.where(tf.strings.substr(pieces, 0, 1) == " ", pieces, tf.strings.join([" ", pieces]))
        if self._split_pattern is not None:
            pattern, cut = self._split_pattern
            pieces = tf.strings.regex_replace(pieces, cut, "\\1" + _CUT + "\\2")
            parts = tf.strings.split(pieces, sep=_CUT)
            words = tf_text.regex_split(parts.flat_values, pattern, pattern)
            return tf.RaggedTensor.from_row_splits(words, parts.row_splits).merge_dims(1, 2)
        if self._metaspace is not None:
            replacement, scheme, split = self._metaspace
            pieces = tf.strings.regex_replace(pieces, " ", replacement)
            prepend = tf.strings.substr(pieces, 0, len(replacement.encode("utf-8"))) != replacement
            if scheme == "first":
                prepend &= first
            if scheme in ("first", "always"):
                pieces = tf.where(prepend, tf.strings.join([replacement, pieces]), pieces)
            if split:
                mark = _literal(replacement)
                pattern = f"{mark}(?:[^{mark}])*|(?:[^{mark}])+"
                return tf_text.regex_split(pieces, pattern, pattern)
        if self._merged_with_previous is not None:
            mark = _literal(self._merged_with_previous)
            pattern = f"(?:[^{mark}])*{mark}|(?:[^{mark}])+"
            return tf_text.regex_split(pieces, pattern, pattern)
        return tf.RaggedTensor.from_tensor(pieces[:, None], lengths=tf.cast(tf.strings.length(pieces) > 0, tf.int64))

    def _bpe(self, words):
        """BPE ids of each word `(W,)` -> ragged int64 `(W, None)`."""
        if self.byte_level:
            units = tf.strings.bytes_split(words)
            symbols = tf.ragged.map_flat_values(self._byte_ids.lookup, units)
            if self.ignore_merges:
                whole = tf.strings.reduce_join(tf.ragged.map_flat_values(self._byte_chars.lookup, units), axis=1)
        else:
            units = tf.strings.unicode_split(words, "UTF-8")
            symbols = self._fall_back(units, tf.ragged.map_flat_values(self._vocabulary_table.lookup, units))
            whole = words
        ids = self._merge(symbols)
        if self.ignore_merges:  # a word of the vocabulary is its token, merges or not
            known = self._vocabulary_table.lookup(whole)
            both = tf.concat([ids, tf.RaggedTensor.from_tensor(known[:, None])], axis=0)
            rows = tf.range(tf.size(known, out_type=tf.int64))
            ids = tf.gather(both, tf.where(known >= 0, rows + tf.size(known, out_type=tf.int64), rows))
        return ids

    def _fall_back(self, chars, ids):
        """Characters outside the vocabulary: their byte tokens (`byte_fallback`), else the unknown token
        (consecutive ones fused with `fuse_unk`), else left out, as `tokenizers`' BPE does."""
        flat = ids.flat_values
        if self._byte_fallback:
            units = tf.strings.bytes_split(chars.flat_values)
            row = units.value_rowids()
            known = tf.gather(flat >= 0, row)
            first = tf.range(tf.size(row, out_type=tf.int64)) == tf.gather(units.row_starts(), row)
            keep = ~known | first
            values = tf.where(known, tf.gather(flat, row), self._fallback_ids.lookup(units.flat_values))
            words = tf.gather(chars.value_rowids(), row)
            return tf.RaggedTensor.from_value_rowids(values[keep], words[keep], nrows=chars.nrows())
        unknown = flat < 0
        values = tf.where(unknown, tf.constant(self._unk_id, tf.int64), flat)
        keep = tf.fill(tf.shape(flat), self._unk_id >= 0)
        keep |= ~unknown
        if self._fuse_unk:
            words = chars.value_rowids()
            previous_unknown = tf.concat([[False], unknown[:-1] & tf.equal(words[:-1], words[1:])], axis=0)
            keep &= ~(unknown & previous_unknown)
        return tf.RaggedTensor.from_value_rowids(values[keep], chars.value_rowids()[keep], nrows=chars.nrows())

    def _merge(self, symbols):
        """Applies the merges to each word `(W, None)`: the lowest-ranked pair first, the leftmost of equals."""
        dense = symbols.to_tensor(default_value=-1)
        width = tf.shape(dense, out_type=tf.int64)[1]
        columns = tf.range(width)[None]

        def step(dense, _):
            left, right = dense[:, :-1], dense[:, 1:]
            keys = left * self._key_base + right
            ranks = tf.where((left >= 0) & (right >= 0), self._rank_table.lookup(keys), self._no_merge)
            best = tf.reduce_min(ranks, axis=1, keepdims=True)
            active = best < self._no_merge
            at = tf.reduce_min(tf.where(tf.equal(ranks, best), columns[:, :-1], width), axis=1, keepdims=True)
            merged = self._merged_table.lookup(tf.gather(keys, tf.minimum(at, width - 2), batch_dims=1))
            shifted = tf.concat([dense[:, 1:], tf.fill([tf.shape(dense)[0], 1], tf.constant(-1, tf.int64))], axis=1)
            new = tf.where(columns == at, merged, tf.where(columns > at, shifted, dense))
            return tf.where(active, new, dense), tf.reduce_any(active)

        if dense.shape[1] != 1:
            dense, _ = tf.while_loop(
                lambda _, more: more,
                step,
                (dense, tf.constant(True)),
                maximum_iterations=tf.cast(tf.maximum(width - 1, 0), tf.int32),
            )
        return tf.RaggedTensor.from_tensor(dense, padding=tf.constant(-1, tf.int64))

    # -- decoding ----------------------------------------------------------------------------------------------

    def decode(self, ids):
        """Text of each row of ids `(N, None)` -> strings `(N,)`, special tokens left out."""
        ids = ids if isinstance(ids, tf.RaggedTensor) else tf.RaggedTensor.from_tensor(tf.convert_to_tensor(ids))
        ids = tf.cast(ids, tf.int32)
        size = tf.shape(self._skipped)[0]
        flat = ids.flat_values
        keep = (flat >= 0) & (flat < size)
        keep &= ~tf.gather(self._skipped, tf.clip_by_value(flat, 0, size - 1))
        ids = tf.ragged.boolean_mask(ids, tf.RaggedTensor.from_row_splits(keep, ids.row_splits))
        pieces = tf.ragged.map_flat_values(lambda i: tf.gather(self._pieces, i), ids)
        if self._byte_tokens is not None:
            pieces = self._fall_back_bytes(ids, pieces)
        text = tf.strings.reduce_join(pieces, axis=1)
        if self._lossy:
            text = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)
        if self._strip:
            text = tf.strings.regex_replace(text, f"^ {{1,{self._strip}}}", "")
        return text

    def _fall_back_bytes(self, ids, pieces):
        """`ByteFallback`: each run of byte tokens is its bytes where they are UTF-8, else one U+FFFD a byte."""
        flat = ids.flat_values
        is_byte = tf.gather(self._byte_tokens, flat) >= 0
        rows = ids.value_rowids()
        starts_run = tf.concat([[True], ~is_byte[1:] | ~is_byte[:-1] | tf.not_equal(rows[1:], rows[:-1])], axis=0)
        run = tf.cumsum(tf.cast(starts_run, tf.int64)) - 1
        runs = tf.RaggedTensor.from_value_rowids(pieces.flat_values, run)
        text = tf.strings.reduce_join(runs, axis=1)
        lengths = runs.row_lengths()
        valid = tf.equal(
            tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD), text
        )
        text = tf.where(
            valid,
            text,
            tf.strings.reduce_join(
                tf.RaggedTensor.from_row_lengths(tf.fill([tf.reduce_sum(lengths)], _REPLACEMENT_CHARACTER), lengths),
                axis=1,
            ),
        )
        run_rows = tf.gather(rows, tf.where(starts_run)[:, 0])
        return tf.RaggedTensor.from_value_rowids(text, run_rows, nrows=ids.nrows())


def _hex(digits):
    return all(c in "0123456789abcdefABCDEF" for c in digits)
