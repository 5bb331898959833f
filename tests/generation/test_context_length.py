"""A model trained on 64-token contexts keeps its quality past 64 tokens under the sliding-window rule.

Character-level models trained at T=64 on the shared WikiText-2 validation
split score the test split teacher-forced, through `windowed_logits` (the
rule generation follows: a ring cache of 64 slots for relative or absent
positions, the re-encoded last 64 tokens for learned ones). Positions 64 to
255 see 64 tokens of context each, as in training; positions below 64 see
fewer. Without the window, positions past 64 would use position embeddings
and distances the model never trained (or, with a 64-row table, none at all).
"""

import keras
import numpy as np
import pytest
from shared_data import WIKITEXT2, requires_wikitext

from keras_tfam.generation import windowed_logits
from keras_tfam.models import GPT2LM

CONTEXT, SCORED = 64, 256


@pytest.fixture(scope="module")
def characters():
    with open(f"{WIKITEXT2}/wiki.valid.tokens", encoding="utf-8") as f:
        train = f.read()
    with open(f"{WIKITEXT2}/wiki.test.tokens", encoding="utf-8") as f:
        test = f.read()
    alphabet = sorted(set(train))
    index = {c: i for i, c in enumerate(alphabet)}
    unknown = len(alphabet)
    encode = lambda text: np.array([index.get(c, unknown) for c in text], np.int32)  # noqa: E731
    return encode(train), encode(test), len(alphabet) + 1


def train(position, train_ids, vocabulary_size, steps=300, batch_size=32):
    keras.utils.set_random_seed(0)
    model = GPT2LM(
        vocabulary_size=vocabulary_size,
        num_layers=2,
        num_heads=4,
        hidden_dim=64,
        max_sequence_length=CONTEXT,
        context_length=CONTEXT,
        position=position,
    )
    model.compile(
        keras.optimizers.AdamW(3e-3, weight_decay=0.0),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    starts = np.random.default_rng(0).integers(0, len(train_ids) - CONTEXT - 1, size=steps * batch_size)
    windows = train_ids[starts[:, None] + np.arange(CONTEXT + 1)]
    model.fit(windows[:, :-1], windows[:, 1:], batch_size=batch_size, epochs=1, verbose=0)
    return model


@requires_wikitext
@pytest.mark.training
@pytest.mark.parametrize("position", ["learned", "rotary", "alibi", "none"])
def test_loss_past_the_trained_context_stays_at_its_level(position, characters):
    train_ids, test_ids, vocabulary_size = characters
    model = train(position, train_ids, vocabulary_size)
    chunks = test_ids[: 12 * (SCORED + 1)].reshape(12, SCORED + 1)
    logits = windowed_logits(model, chunks[:, :-1]).astype(np.float64)
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, chunks[:, 1:, None], axis=-1)[..., 0]  # [chunks, positions]
    within, past = nll[:, :CONTEXT].mean(), nll[:, CONTEXT:].mean()
    assert within < 3.0, f"{position}: the model did not learn (loss {within:.2f} nats/char)"
    assert past <= 1.05 * within, f"{position}: {past:.3f} nats/char past the context vs {within:.3f} within"
