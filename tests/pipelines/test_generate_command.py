"""`tfam generate` end to end: the end token, `--stop` strings, `--stream` and the steering flags."""

import contextlib
import io
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from pipeline_runs import copy_run, run_tfam

from pipelines.cli import main
from pipelines.commands import _settled_text, load_run

PROMPT = "the game"
# Greedy with a large presence penalty picks a token it has not generated yet at every step, so it walks down the
# model's ranking and reaches the end token (which every training line ends in) within its first hundred or so.
WALK = ("--presence-penalty", "100")
WALK_TOKENS = 96


@pytest.fixture(scope="module")
def run(trained_run):
    model, tokenizer = load_run(trained_run)
    return trained_run, model, tokenizer


def _generate(run_dir, *args):
    result = run_tfam(["generate", run_dir, "--prompt", PROMPT, "--sampler", "greedy", *args])
    assert result.stdout.endswith("\n") and result.stderr == ""
    return result.stdout


def _completion(stdout, prompt=PROMPT):
    """The completion of one word-level prompt's line."""
    assert stdout.startswith(prompt + " ")
    return stdout[len(prompt) + 1 : -1]


def _library_completion(model, tokenizer, max_new_tokens, **options):
    """`(the new ids of greedy generate without a stop token, the text of ids)` for PROMPT."""
    ids = [tokenizer.eos_id] + list(np.asarray(tokenizer.tokenize_prompt(tf.constant([PROMPT])).flat_values))
    new = model.generate([ids], max_new_tokens, **options)[0, len(ids) :]
    return new, lambda ids: tokenizer.detokenize(np.asarray(ids, np.int32)[None, :]).numpy()[0].decode("utf-8")


def test_a_completion_ends_before_the_end_token(run):
    run_dir, model, tokenizer = run
    new, text = _library_completion(model, tokenizer, WALK_TOKENS, presence_penalty=100.0)
    [ends] = np.nonzero(new == tokenizer.eos_id)
    assert len(ends) and ends[0] < len(new) - 1, "greedy did not reach the end token: the premise of this test"
    assert "\n" not in text(new[: ends[0]])  # word level: the end token is the only newline

    stopped = _generate(run_dir, "--max-new-tokens", str(WALK_TOKENS), *WALK)
    assert stopped == f"{PROMPT} {text(new[: ends[0]])}\n"
    # Past the end token its newline is printed, and the tokens after it.
    full = _generate(run_dir, "--max-new-tokens", str(WALK_TOKENS), *WALK, "--no-stop-at-eos")
    assert full == f"{PROMPT} {text(new)}\n" and full.startswith(stopped[:-1] + "\n")
    assert _generate(run_dir, "--max-new-tokens", str(WALK_TOKENS), *WALK, "--stream", "--chunk-size", "5") == stopped


@pytest.mark.parametrize(
    "options",
    [
        ("--max-new-tokens", "20", "--no-stop-at-eos"),
        ("--max-new-tokens", "20", "--sampler", "top_k", "--seed", "3", "--repetition-penalty", "1.5",
         "--no-repeat-ngram-size", "2", "--min-p", "0.05"),
    ],
)  # fmt: skip
def test_stream_prints_what_generate_prints(run, options):
    run_dir = run[0]
    whole = _generate(run_dir, *options)
    for chunk_size in ("1", "7"):
        assert _generate(run_dir, *options, "--stream", "--chunk-size", chunk_size) == whole


def test_prompt_lookup_prints_what_plain_decoding_prints(run):
    run_dir = run[0]
    for options in (("--max-new-tokens", "20"), ("--max-new-tokens", "20", "--sampler", "top_k", "--seed", "3")):
        plain = _generate(run_dir, *options)
        assert _generate(run_dir, *options, "--prompt-lookup", "3") == plain
        assert _generate(run_dir, *options, "--prompt-lookup", "2", "--stream", "--chunk-size", "4") == plain


def test_a_draft_run_prints_what_plain_decoding_prints(run, tmp_path):
    run_dir = run[0]
    greedy, sampled = ("--max-new-tokens", "20"), ("--max-new-tokens", "20", "--sampler", "top_k", "--seed", "3")
    drafted = ("--draft-run", run_dir, "--num-draft-tokens", "3")
    assert _generate(run_dir, *greedy, *drafted) == _generate(run_dir, *greedy)
    assert _generate(run_dir, *sampled, *drafted, "--stream", "--chunk-size", "4") == _generate(run_dir, *sampled)
    # A draft whose tokenizer numbers two words the other way round tokenizes otherwise: refused.
    other = copy_run(run_dir, tmp_path)
    tokenizer = run[2]
    words = list(tokenizer.vocabulary)
    words[-1], words[-2] = words[-2], words[-1]
    shutil.rmtree(os.path.join(other, "tokenizer"))
    type(tokenizer)(words).save(os.path.join(other, "tokenizer"))
    result = run_tfam(["generate", run_dir, "--prompt", PROMPT, "--draft-run", other], check=False)
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("tfam: error: `--draft-run` must tokenize as the run") and other in line, line


class _Flushes(io.StringIO):
    """stdout that keeps what it held at each flush."""

    def __init__(self):
        super().__init__()
        self.shown = []

    def flush(self):
        self.shown.append(self.getvalue())


def test_stop_strings_cut_the_completion_before_the_first_one(run):
    run_dir = run[0]
    options = ("--max-new-tokens", "24", "--no-stop-at-eos", *WALK)  # no repeated words: stops far apart
    completion = _completion(_generate(run_dir, *options))
    words = completion.split(" ")
    starts = np.cumsum([0] + [len(word) + 1 for word in words[:-1]])
    # Words of several characters whose first occurrence in the text is their own.
    firsts = [k for k in range(2, len(words) - 1) if len(words[k]) > 1 and completion.find(words[k]) == starts[k]]
    assert len(firsts) >= 2, completion
    early, late = firsts[0], firsts[-1]
    two_words = f"{words[early]} {words[early + 1]}"  # spans two tokens
    for stops in ([words[late]], [two_words], [words[late], words[early][:-1], "no such text"]):
        expected = f"{PROMPT} {completion[: min(completion.find(s) for s in stops if s in completion)]}\n"
        flags = [arg for stop in stops for arg in ("--stop", stop)]
        assert _generate(run_dir, *options, *flags) == expected, stops
        assert _generate(run_dir, *options, *flags, "--stream", "--chunk-size", "1") == expected, stops

    # One token at a time: each chunk is printed when it comes, and nothing after the stop string ever is.
    stdout, stop = _Flushes(), f"{words[late]} {words[late + 1]}"
    with contextlib.redirect_stdout(stdout):
        code = main(["generate", run_dir, "--prompt", PROMPT, "--sampler", "greedy", *options, "--stop", stop,
                     "--stream", "--chunk-size", "1"])  # fmt: skip
    final = f"{PROMPT} {completion[: starts[late]]}\n"
    assert code == 0 and stdout.getvalue() == final
    shown = [text for text in dict.fromkeys(stdout.shown) if text]
    assert len(shown) >= late and shown[-1] == final
    assert all(final.startswith(text) for text in shown)


def test_the_printed_text_holds_back_what_more_tokens_could_change():
    # The start of a stop string waits; a complete one ends the text.
    assert _settled_text("the ga", ("game",), final=False) == ("the ", False)
    assert _settled_text("the ga", ("game",), final=True) == ("the ga", False)
    assert _settled_text("the game is", ("game",), final=False) == ("the ", True)
    # "cd" is complete, but "bcdef" may still begin earlier: the first in the final text wins.
    assert _settled_text("abcd", ("cd", "bcdef"), final=False) == ("a", False)
    assert _settled_text("abcdef", ("cd", "bcdef"), final=False) == ("a", True)
    assert _settled_text("abcdxy", ("cd", "bcdef"), final=False) == ("ab", True)
    # An unfinished UTF-8 character (decoded as U+FFFD) waits for its other bytes.
    assert _settled_text("caf\ufffd", (), final=False) == ("caf", False)
    assert _settled_text("caf\ufffd", (), final=True) == ("caf\ufffd", False)


@pytest.mark.parametrize(
    "args, flag, received",
    [
        (["--repetition-penalty", "0"], "--repetition-penalty", "repetition_penalty=0.0"),
        (["--presence-penalty", "nan"], "--presence-penalty", "presence_penalty=nan"),
        (["--min-new-tokens", "-1"], "--min-new-tokens", "min_new_tokens=-1"),
        (["--no-repeat-ngram-size", "-2"], "--no-repeat-ngram-size", "no_repeat_ngram_size=-2"),
        (["--min-p", "1.5"], "--min-p", "min_p=1.5"),
        (["--min-p", "0.1", "--sampler", "greedy"], "--min-p", "sampler="),  # min-p filters a sampler's draws
        (["--top-p", "0"], "--top-p", "top_p=0.0"),
        (["--top-p", "1.5"], "--top-p", "top_p=1.5"),  # was named `p`, the sampler's argument
        (["--top-p", "1.5", "--sampler", "greedy"], "--top-p", "top_p=1.5"),  # one range, whatever the sampler
        (["--top-k", "0"], "--top-k", "top_k=0"),
        (["--top-k", "40"], "--top-k", "top_k=40, sampler=top_p"),  # the top_p sampler would ignore it
        (["--top-p", "0.5", "--sampler", "top_k"], "--top-p", "top_p=0.5, sampler=top_k"),
        (["--prompt", "the \udcff game"], "--prompt", "prompt=b'the \\xff game'"),  # a byte that is not UTF-8
        (["--stop", "\udcfe"], "--stop", "stop=b'\\xfe'"),
        (["--chunk-size", "0", "--stream"], "--chunk-size", "chunk_size=0"),
        (["--max-new-tokens", "0", "--stream"], "--max-new-tokens", "max_new_tokens=0"),
        (["--stop", ""], "--stop", "stop=''"),
        (["--prompt-lookup", "0"], "--prompt-lookup", "prompt_lookup_num_tokens=0"),
        (["--max-matching-ngram-size", "2"], "--max-matching-ngram-size", "max_matching_ngram_size=2"),
        (["--num-draft-tokens", "2"], "--num-draft-tokens", "num_draft_tokens=2"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_flag(run, args, flag, received):
    result = run_tfam(["generate", run[0], "--prompt", PROMPT, *args], check=False)
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"tfam: error: `{flag}` ") and f"Received: {received}" in line, line


def test_a_checkpoint_of_a_run_generates_with_the_run_s_tokenizer(run, tmp_path):
    # `tfam generate RUN/checkpoints/final.keras` said "has no tokenizer/ folder" although --help offers .keras.
    run_dir = run[0]
    final = os.path.join(run_dir, "checkpoints", "final.keras")
    assert _generate(final, "--max-new-tokens", "8") == _generate(
        run_dir, "--checkpoint", "final", "--max-new-tokens", "8"
    )
    alone = str(tmp_path / "final.keras")
    shutil.copy(final, alone)
    result = run_tfam(["generate", alone, "--prompt", PROMPT], check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"tfam: error: {alone!r} has no tokenizer: pass a run directory of `tfam train` (holding tokenizer/ and "
        "checkpoints/), or a .keras file in its checkpoints/ folder"
    ]
