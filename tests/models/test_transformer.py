import itertools
import re

import keras
import numpy as np
import pytest

from keras_tfam.models import Transformer

PAD, BOS, EOS = 0, 1, 2
rng = np.random.default_rng(0)


def small(**overrides):
    keras.utils.set_random_seed(3)
    return Transformer(**{"vocabulary_size": 7, "num_layers": 2, "num_heads": 2, "hidden_dim": 16, **overrides})


def test_embeddings_and_output_projection_are_one_matrix():
    model = small()
    assert model.source_embedding is model.target_embedding
    assert len([w for w in model.weights if "embedding" in w.path]) == 1
    separate = small(target_vocabulary_size=9)
    assert separate({"source": np.ones((1, 3), "int32"), "target": np.ones((1, 2), "int32")}).shape == (1, 2, 9)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_cached_decoding_equals_the_full_decoder(norm_position):
    model = small(norm_position=norm_position)
    source = np.array([[3, 4, 5, 6, 0, 0], [6, 5, 4, 3, 3, 4]], np.int32)
    target = np.array([[BOS, 3, 6, 4, 5], [BOS, 5, 5, 3, 6]], np.int32)
    full = np.asarray(model({"source": source, "target": target}))
    cache = model.init_cache(2, 5, source=source)
    for t in range(5):
        logits, cache, _ = model.call_with_cache(target[:, t : t + 1], cache, t)
        np.testing.assert_allclose(logits[:, 0], full[:, t], rtol=1e-4, atol=1e-5)


def test_beam_search_finds_the_best_sequence():
    """With enough beams and no length penalty, beam search is exhaustive search."""
    model = small(vocabulary_size=4)  # ids: 0 pad, 1 start, 2 stop, 3
    source = np.array([[3, 3, 2], [2, 3, 0]], np.int32)
    found = model.generate(source, BOS, EOS, max_length=3, beam_size=16, length_penalty=0.0)

    def log_probs(row, sequences):
        """The log-probability of each sequence (one length) given source `row`: one teacher-forced pass."""
        sequences = np.array(sequences, np.int32)
        targets = np.concatenate([np.full((len(sequences), 1), BOS, np.int32), sequences[:, :-1]], axis=1)
        sources = np.repeat(source[row : row + 1], len(sequences), axis=0)
        logits = np.asarray(model({"source": sources, "target": targets}), np.float64)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        return np.take_along_axis(log_probs, sequences[..., None], axis=-1)[..., 0].sum(-1)

    for row in range(2):
        candidates = []
        for length in range(1, 4):
            sequences = [
                sequence
                for sequence in itertools.product(range(4), repeat=length)
                if EOS not in sequence[:-1] and (length == 3 or sequence[-1] == EOS)  # ends once, or is cut at 3
            ]
            candidates += zip(log_probs(row, sequences), sequences)
        best = max(candidates)[1]
        assert tuple(found[row][: len(best)]) == best
        assert np.all(found[row][len(best) :] == PAD)


def test_greedy_is_beam_search_with_one_beam():
    model = small()
    source = rng.integers(3, 7, size=(3, 5)).astype("int32")
    greedy = model.generate(source, BOS, EOS, max_length=6)
    # Greedy by hand, with the full model.
    target = np.full((3, 1), BOS, np.int32)
    for _ in range(6):
        logits = np.asarray(model({"source": source, "target": target}))[:, -1]
        target = np.concatenate([target, np.argmax(logits, -1)[:, None].astype(np.int32)], axis=1)
    for row in range(3):
        expected = list(target[row, 1:])
        if EOS in expected:
            expected = expected[: expected.index(EOS) + 1]
        assert list(greedy[row, : len(expected)]) == expected


REVERSE_LENGTH, REVERSE_VOCABULARY = 8, 16


def reversal_batch(data, count):
    """Sources of 4..8 tokens and their reversals between the start and stop tokens."""
    lengths = data.integers(4, REVERSE_LENGTH + 1, size=count)
    source = np.zeros((count, REVERSE_LENGTH), np.int32)
    target = np.zeros((count, REVERSE_LENGTH + 2), np.int32)
    for i, k in enumerate(lengths):
        sequence = data.integers(3, REVERSE_VOCABULARY, size=k)
        source[i, :k] = sequence
        target[i, 0], target[i, 1 : k + 1], target[i, k + 1] = BOS, sequence[::-1], EOS
    return source, target


@pytest.fixture(scope="module")
def reverser():
    """A Transformer trained to reverse sequences, and held-out data."""
    keras.utils.set_random_seed(0)
    data = np.random.default_rng(0)
    model = Transformer(
        vocabulary_size=REVERSE_VOCABULARY, num_layers=2, num_heads=4, hidden_dim=64, intermediate_dim=128
    )
    steps = 400
    schedule = keras.optimizers.schedules.CosineDecay(0.0, steps, warmup_target=3e-3, warmup_steps=40)
    model.compile(
        keras.optimizers.Adam(schedule), keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True
    )
    source, target = reversal_batch(data, 64 * steps)
    model.fit(
        {"source": source, "target": target[:, :-1]},
        target[:, 1:],
        sample_weight=(target[:, 1:] != PAD).astype("float32"),
        batch_size=64,
        epochs=1,
        verbose=0,
    )
    return model, reversal_batch(data, 300)


def host_beam_search(model, source, max_length, beam_size, length_penalty):
    """keras_tfam 0.1's beam search: a NumPy loop on the host around cached decoder steps."""
    batch, rows = len(source), len(source) * beam_size
    cache = model.init_cache(rows, max_length, source=np.repeat(source, beam_size, axis=0))
    tokens = np.full((rows, max_length + 1), PAD, np.int32)
    tokens[:, 0] = BOS
    scores = np.zeros((batch, beam_size), np.float64)
    scores[:, 1:] = -np.inf  # all beams start as the same hypothesis
    finished = np.zeros(rows, bool)
    lengths = np.zeros(rows, np.int32)
    for t in range(max_length):
        logits, cache, _ = model.call_with_cache(tokens[:, t : t + 1], cache, t)
        log_probs = np.asarray(keras.ops.log_softmax(logits[:, -1], axis=-1), np.float64)
        vocabulary = log_probs.shape[-1]
        # A finished hypothesis only extends with padding, at no cost.
        log_probs[finished] = -np.inf
        log_probs[finished, PAD] = 0.0
        candidates = (scores.reshape(rows, 1) + log_probs).reshape(batch, beam_size * vocabulary)
        new_lengths = (lengths + ~finished).reshape(batch, beam_size)
        penalty = ((5.0 + np.repeat(new_lengths, vocabulary, axis=1)) / 6.0) ** length_penalty
        best = np.argsort(-(candidates / penalty), axis=-1, kind="stable")[:, :beam_size]
        origin = (np.arange(batch)[:, None] * beam_size + best // vocabulary).reshape(-1)
        scores = np.take_along_axis(candidates, best, axis=-1)
        tokens = tokens[origin]
        tokens[:, t + 1] = (best % vocabulary).reshape(-1)
        lengths = lengths[origin] + ~finished[origin]
        finished = finished[origin] | (tokens[:, t + 1] == EOS)
        cache = keras.tree.map_structure(lambda c: keras.ops.take(c, origin, axis=0), cache)
        if finished.all():
            break
    penalised = scores / (((5.0 + lengths.reshape(batch, beam_size)) / 6.0) ** length_penalty)
    top = np.argmax(penalised, axis=-1)
    return tokens.reshape(batch, beam_size, -1)[np.arange(batch), top][:, 1:]


@pytest.mark.training
def test_learns_to_reverse_sequences_and_its_compiled_beam_search_equals_the_host_one(reverser):
    """At least 99% exact match on held-out sequences, greedy and beam 4; then the compiled beam search
    gives the tokens of the host loop above. (One test: both need the trained model, which takes 25 s.)"""
    model, (source, target) = reverser
    for beam_size in (1, 4):
        decoded = model.generate(source, BOS, EOS, max_length=REVERSE_LENGTH + 1, beam_size=beam_size)
        accuracy = np.mean([np.array_equal(d, t[1:]) for d, t in zip(decoded, target)])
        assert accuracy >= 0.99, (beam_size, accuracy)
    source = source[:40]
    for beam_size, length_penalty in ((4, 0.6), (3, 0.0)):
        compiled = model.generate(
            source, BOS, EOS, max_length=REVERSE_LENGTH + 1, beam_size=beam_size, length_penalty=length_penalty
        )
        host = host_beam_search(model, source, REVERSE_LENGTH + 1, beam_size, length_penalty)
        np.testing.assert_array_equal(compiled, host)


def test_save_load_and_bad_arguments(tmp_path):
    model = small(norm_position="pre", norm="rms")
    inputs = {"source": np.array([[3, 4, 0]]), "target": np.array([[1, 5]])}
    path = str(tmp_path / "t.keras")
    model.save(path)
    np.testing.assert_allclose(keras.saving.load_model(path)(inputs), model(inputs), atol=1e-6)
    with pytest.raises(ValueError, match="Received: hidden_dim=0"):
        small(hidden_dim=0)
    with pytest.raises(ValueError, match="Received: beam_size=0"):
        model.generate(np.array([[3]]), BOS, EOS, 3, beam_size=0)
    # The dtype named as the dtype, the shape as the shape.
    with pytest.raises(ValueError, match=r"`source` must hold integer token ids. Received: source.dtype=float32"):
        model.generate(np.array([[3.0, 4.0]], "float32"), BOS, EOS, 3)
    for shape in ((0, 3), (2, 0), (3,)):
        with pytest.raises(
            ValueError, match=r"non-empty \(batch, length\) .* Received: " + re.escape(f"source.shape={shape}")
        ):
            model.generate(np.zeros(shape, "int32"), BOS, EOS, 3)
    with pytest.raises(ValueError, match=r"`target` must be integer token ids. Received: target.dtype=float32"):
        model({"source": np.array([[3, 4]]), "target": np.array([[1.0]], "float32")})
    with pytest.raises(ValueError, match=r"`source` must be \(batch, length\) token ids.*source.shape=\(2,\)"):
        model({"source": np.array([3, 4]), "target": np.array([[1]])})
