"""Search strategies: how the decoding loop turns next-token logits into tokens.

A strategy runs inside the compiled loop. Each step it receives the logits
of every row and returns the chosen tokens, the row each row now continues
(`origin`, for strategies that reorder hypotheses, else `None`), the rows
that are done, and its own state.

- `Sampling`: one hypothesis per prompt; a `Sampler` picks each token.
- `BeamSearch`: `beam_size` hypotheses per prompt, scored by summed
  log-probabilities, ranked with the GNMT length penalty (Wu et al. 2016).
"""

from keras import ops

from keras_tfam.generation.samplers import GreedySampler, MinPSampler, Sampler, get_sampler
from keras_tfam.utils import check_positive_int, check_real


def _is_stop(tokens, stop_token_ids):
    """Whether each of `(R,)` tokens is a stop id: of `(S,)` ids, or of its row's in `(R, S)` (negative: none)."""
    if len(stop_token_ids.shape) == 1:
        stop_token_ids = stop_token_ids[None, :]
    return ops.any(ops.equal(tokens[:, None], stop_token_ids), axis=-1)


class Sampling:
    """One hypothesis per prompt, each token drawn by `sampler`.

    Args:
        sampler: a `Sampler`, a name in `SAMPLERS`, or a keras-hub sampler.

    Examples:
        >>> Sampling("top_k").sampler.k  # what generate(..., sampler="top_k") searches with
        50
    """

    beam_size = 1

    def __init__(self, sampler="greedy"):
        self.sampler = get_sampler(sampler)

    def cache_key(self):
        return ("sampling", self.sampler.cache_key())

    def init_state(self, batch_size):
        return ()

    def select(self, logits, key, in_prompt, active, done, state, stop_token_ids, pad_token_id):
        """`(chosen (R,), origin or None, done (R,), state)` for `(R, V)` logits.

        `active` rows generate this step (past their prompt, not done, below
        their limit); the others get `pad_token_id` (rows in their prompt keep
        their prompt token, which the loop writes).
        """
        sampled = self.sampler(logits, key)
        chosen = ops.where(active, sampled, pad_token_id)
        done = ops.logical_or(done, ops.logical_and(active, _is_stop(sampled, stop_token_ids)))
        return chosen, None, done, state

    def best_rows(self, state):
        """The rows of the loop that are the results: every row."""
        return None


class BeamSearch:
    """Beam search inside the compiled loop, with the GNMT length penalty.

    Each prompt keeps `beam_size` hypotheses (rows `b * beam_size + k` of the
    loop), all starting as its prompt. A step extends every live hypothesis
    by every token; the `beam_size` best candidates of each prompt, ranked
    by `score / ((5 + length) / 6) ** length_penalty` (Wu et al. 2016, with
    `score` the summed log-probability and `length` the generated tokens),
    become its hypotheses. A hypothesis that produced a stop token is
    finished: it only extends with padding, at no cost, and keeps its
    length. The result is each prompt's best hypothesis under the same
    ranking. With `beam_size` equal to the vocabulary and no penalty, this
    is exhaustive search.

    Args:
        beam_size: hypotheses per prompt.
        length_penalty: `alpha` of the GNMT penalty; 0 ranks by score alone.

    Examples:
        >>> model = GPT2LM(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16)
        >>> model.generate([[5, 7]], max_new_tokens=4, beam_size=3).shape  # BeamSearch(3)
        (1, 6)
    """

    def __init__(self, beam_size=4, length_penalty=0.0):
        self.beam_size = check_positive_int("beam_size", beam_size)
        self.length_penalty = check_real("length_penalty", length_penalty, ">= 0", lambda alpha: alpha >= 0)

    def cache_key(self):
        return ("beam", self.beam_size, self.length_penalty)

    def _penalty(self, lengths):
        return ops.power((5.0 + ops.cast(lengths, "float32")) / 6.0, self.length_penalty)

    def init_state(self, batch_size):
        # Every beam starts as the same hypothesis: only the first may grow.
        first = ops.arange(self.beam_size)[None, :] == 0
        scores = ops.where(first, 0.0, float("-inf")) * ops.ones((batch_size, 1), "float32")
        lengths = ops.zeros((batch_size * self.beam_size,), "int32")
        return scores, lengths

    def select(self, logits, key, in_prompt, active, done, state, stop_token_ids, pad_token_id):
        scores, lengths = state  # [B, K], [R]
        beams = self.beam_size
        rows, vocabulary = ops.shape(logits)[0], ops.shape(logits)[1]
        batch = rows // beams
        log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
        padding_only = ops.where(ops.arange(vocabulary)[None, :] == pad_token_id, 0.0, float("-inf"))
        log_probs = ops.where(active[:, None], log_probs, padding_only)
        candidates = ops.reshape(ops.reshape(scores, (rows, 1)) + log_probs, (batch, beams * vocabulary))
        grown = lengths + ops.cast(active, "int32")
        penalty = ops.repeat(ops.reshape(self._penalty(grown), (batch, beams)), vocabulary, axis=1)
        best = ops.top_k(candidates / penalty, beams, sorted=True)[1]  # [B, K]
        origin = ops.reshape(ops.arange(batch)[:, None] * beams + best // vocabulary, (rows,))
        tokens = ops.cast(ops.reshape(best % vocabulary, (rows,)), "int32")
        new_scores = ops.take_along_axis(candidates, best, axis=1)
        # A prompt still being read keeps its hypotheses as they are.
        prompt_rows = ops.reshape(in_prompt, (batch, beams))[:, 0]
        origin = ops.where(in_prompt, ops.arange(rows), origin)
        scores = ops.where(prompt_rows[:, None], scores, new_scores)
        was_active = ops.take(active, origin, axis=0)
        done = ops.logical_or(
            ops.take(done, origin, axis=0), ops.logical_and(was_active, _is_stop(tokens, stop_token_ids))
        )
        chosen = ops.where(was_active, tokens, pad_token_id)
        return chosen, origin, done, (scores, ops.take(grown, origin, axis=0))

    def best_rows(self, state):
        """`(B,)`: the row of each prompt's best hypothesis."""
        scores, lengths = state
        batch = ops.shape(scores)[0]
        ranked = scores / ops.reshape(self._penalty(lengths), (batch, self.beam_size))
        return ops.arange(batch) * self.beam_size + ops.cast(ops.argmax(ranked, axis=1), "int32")


def get_search(sampler="greedy", beam_size=1, length_penalty=0.0, min_p=None):
    """`Sampling(sampler)` for one beam (its draws min-p filtered with `min_p`), else `BeamSearch` (which takes
    no sampler)."""
    check_positive_int("beam_size", beam_size)
    if beam_size == 1:
        search = Sampling(sampler)
        if min_p is not None:
            search.sampler = MinPSampler(search.sampler, min_p)
        return search
    if min_p is not None:
        raise ValueError(f"`min_p` filters what a sampler draws; beam search takes none. Received: min_p={min_p!r}")
    if not (sampler in ("greedy", None) or isinstance(sampler, GreedySampler)):
        raise ValueError(
            f"Beam search ranks hypotheses by their probability; it takes no sampler. Received: sampler={sampler!r}, "
            f"beam_size={beam_size}"
        )
    return BeamSearch(beam_size, length_penalty)


__all__ = ["BeamSearch", "Sampler", "Sampling", "get_search"]
