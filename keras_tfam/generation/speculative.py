"""Drafted decoding: each step verifies several drafted tokens in one pass of the model.

A drafter (`PromptLookup`, `DraftModel`) proposes the next `K` tokens of every row; one `call_with_cache` over
the last known token and the `K` drafts gives the model's logits at the `K + 1` positions that follow. Position
by position, the step chooses each token exactly as the one-token loop would (the same processors, sampler and
per-position keys, `step_key(seed, position)`), and a drafted token is kept while it is the token chosen there.
So the tokens are those of plain decoding, greedy or sampled with the same seed, whatever the drafts; a draft
that is right saves a pass over the weights. Every drafter here drafts a point mass (a draft model its greedy
token), and comparing the sampled token with it is speculative sampling with that draft (Leviathan et al. 2023;
Chen et al. 2023): a draft is kept with the probability `p(draft)` the model gives it, and a rejected one is
replaced by a sample of `p` without it, so the tokens are distributed as the model's.

Rows share one position (`decoding`): a step advances every row by the fewest tokens any unfinished row
kept plus one. The caches are positional: slots written for drafts that were not kept hold stale keys and
values that no query attends to (each attends to positions up to its own) until the next step rewrites them.
"""

from keras import ops

from keras_tfam.generation.decoding import DecodingLoop, decoding_variables
from keras_tfam.generation.processors import DecodeContext, apply_processors, ends_stop_sequence
from keras_tfam.generation.samplers import first_argmax, step_key
from keras_tfam.utils import check_positive_int


class PromptLookup:
    """Drafts copied from the tokens so far: prompt lookup decoding (Saxena 2023), as transformers drafts it.

    A row's draft is the `num_tokens` tokens after the earliest earlier
    occurrence of its last n-gram, for `n` from `max_matching_ngram_size`
    down to 1 (`generate(..., prompt_lookup_num_tokens=K)` drafts with it).

    Args:
        num_tokens: tokens drafted per step.
        max_matching_ngram_size: the longest n-gram looked up.

    Examples:
        >>> tokens = np.array([[4, 5, 6, 7, 4, 5, 0, 0]], "int32")
        >>> keras.ops.convert_to_numpy(PromptLookup(3).draft(tokens, 6)).tolist()  # after "4 5": "6 7 4"
        [[6, 7, 4]]
    """

    def __init__(self, num_tokens, max_matching_ngram_size=2):
        self.num_tokens = check_positive_int("prompt_lookup_num_tokens", num_tokens)
        self.max_matching_ngram_size = check_positive_int("max_matching_ngram_size", max_matching_ngram_size)

    def cache_key(self):
        return ("prompt_lookup", self.num_tokens, self.max_matching_ngram_size)

    def start(self, tokens, prompt_lengths, prefill_length):
        """The drafter's part of the loop state: none."""
        return {}

    def propose(self, tokens, index, prompt_lengths, state):
        """`(drafts, state)`: the drafts of `draft`."""
        return self.draft(tokens, index), state

    def draft(self, tokens, index):
        """`(R, num_tokens)` int32 drafts for positions `index ..` from `tokens[:, :index]`; -1 where none."""
        width = ops.shape(tokens)[1]
        starts = ops.arange(width)
        drafts = ops.full((ops.shape(tokens)[0], self.num_tokens), -1, "int32")
        found = ops.zeros((ops.shape(tokens)[0],), "bool")
        for n in range(self.max_matching_ngram_size, 0, -1):
            match = ops.logical_and(starts[None, :] + n < index, ops.greater_equal(index, n))
            for t in range(n):
                ngram = ops.take(tokens, ops.maximum(index - n + t, 0), axis=1)[:, None]  # (R, 1)
                match = ops.logical_and(match, ops.take(tokens, ops.minimum(starts + t, width - 1), axis=1) == ngram)
            earliest = ops.argmax(ops.cast(match, "int32"), axis=1)  # the first match (0 where none)
            positions = earliest[:, None] + n + ops.arange(self.num_tokens)[None, :]
            copied = ops.take_along_axis(tokens, ops.minimum(positions, width - 1), axis=1)
            copied = ops.where(positions < index, copied, -1)  # a continuation stops at the tokens so far
            use = ops.logical_and(ops.any(match, axis=1), ops.logical_not(found))
            drafts = ops.where(use[:, None], ops.cast(copied, "int32"), drafts)
            found = ops.logical_or(found, use)
        return drafts


class DraftModel:
    """Drafts by another decoding model's greedy tokens: speculative decoding (Leviathan et al. 2023).

    The draft model keeps caches of its own in the loop state. Each step feeds
    it the two tokens before the step's position, which rewrites the one slot
    a fully accepted step left unwritten and the one a rejection made stale,
    then drafts `num_tokens` tokens one at a time (prompt tokens where a row's
    prompt goes on). `generate(..., draft_model=DRAFT, num_draft_tokens=K)`
    drafts with it.

    Args:
        model: a decoding model over the same vocabulary, with positional
            caches (each position in a slot of its own).
        num_tokens: tokens drafted per step.

    Examples:
        >>> target = GPT2LM(vocabulary_size=64, num_layers=2, num_heads=2, hidden_dim=16)
        >>> draft = GPT2LM(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16)
        >>> plain = target.generate([[5, 7]], max_new_tokens=8)
        >>> bool((target.generate([[5, 7]], max_new_tokens=8, draft_model=draft, num_draft_tokens=3) == plain).all())
        True
    """

    def __init__(self, model, num_tokens):
        self.model = model
        self.num_tokens = check_positive_int("num_draft_tokens", num_tokens)

    def cache_key(self):
        # A compiled loop holds its drafter, so these ids are not reused while it is kept.
        return ("draft_model", id(self.model), tuple(id(v) for v in decoding_variables(self.model)), self.num_tokens)

    def start(self, tokens, prompt_lengths, prefill_length):
        """The draft's caches with the positions before the first step's two tokens (`prefill_length` as in
        `DecodePlan`: the loop starts at `prefill_length + 1`)."""
        model, rows = self.model, ops.shape(tokens)[0]
        cache = model.init_cache(rows, ops.shape(tokens)[1])
        if prefill_length is None:
            prefill = ops.min(prompt_lengths) - 2
            return {
                "cache": ops.cond(
                    prefill > 0, lambda: model.call_with_cache(tokens[:, :prefill], cache, 0).cache, lambda: cache
                )
            }
        if prefill_length > 1:
            cache = model.call_with_cache(tokens[:, : prefill_length - 1], cache, 0).cache
        return {"cache": cache}

    def propose(self, tokens, index, prompt_lengths, state):
        """`(drafts (R, num_tokens) int32, state)` for positions `index ..`."""
        model, rows = self.model, ops.shape(tokens)[0]
        start = ops.maximum(index - 2, 0)
        step = model.call_with_cache(ops.slice(tokens, (0, start), (rows, 2)), state["cache"], start)
        logits, cache = ops.take(step.logits, index - 1 - start, axis=1), step.cache
        drafts = []
        for j in range(self.num_tokens):
            position = index + j
            known = ops.slice(tokens, (0, position), (rows, 1))[:, 0]
            token = ops.where(position < prompt_lengths, known, first_argmax(ops.cast(logits, "float32")))
            drafts.append(token)
            if j + 1 < self.num_tokens:
                step = model.call_with_cache(token[:, None], cache, position)
                logits, cache = step.logits[:, 0], step.cache
        return ops.stack(drafts, axis=1), {"cache": cache}


def drafting_variables(model, drafter=None):
    """The variables a decoding call of `model` computes with: its own, and a `DraftModel` drafter's (once each: a
    self-speculative draft shares the model's)."""
    variables = decoding_variables(model)
    if isinstance(drafter, DraftModel):
        seen = {id(v) for v in variables}
        variables += [v for v in decoding_variables(drafter.model) if id(v) not in seen]
    return variables


class DraftedDecodingLoop(DecodingLoop):
    """The `DecodingLoop` whose steps verify a drafter's `K` tokens at once (module docstring).

    The token buffer holds `K` positions past the last one generated (the last pass reads them), and the plan
    is `"full"` with caches of the whole buffer (no growth). The outputs are the one-token loop's.

    Args:
        model, search, pad_token_id, plan, processors, stop_sequences, logprobs: as for `DecodingLoop`
            (`search` samples, one hypothesis per prompt).
        drafter: has `num_tokens`, `start(tokens, prompt_lengths, prefill_length) -> state` (a dict of
            tensors carried through the loop) and `propose(tokens, index, prompt_lengths, state) -> (drafts,
            state)`, `drafts` `(R, num_tokens)` int32 (any ids; -1: none).
    """

    def __init__(self, model, search, pad_token_id, plan, drafter, processors=(), stop_sequences=None, logprobs=False):
        if plan.mode != "full" or plan.segment_ends or search.beam_size != 1:
            raise ValueError(f"Drafted decoding takes a full cache and one hypothesis. Received: plan={plan}")
        super().__init__(model, search, pad_token_id, plan, processors, stop_sequences, logprobs)
        self.drafter = drafter

    def start(self, tokens, prompt_lengths, max_new_tokens, seed, stop_token_ids, cache_inputs=None):
        state = super().start(tokens, prompt_lengths, max_new_tokens, seed, stop_token_ids, cache_inputs)
        drafting = self.drafter.start(state["token_ids"], state["prompt_lengths"], self.plan.prefill_length)
        return dict(state, drafter=drafting) if drafting else state

    def _body(self, state, reencode):
        search, pad_token_id, count = self.search, self.pad_token_id, self.drafter.num_tokens
        index, tokens, done = state["index"], state["token_ids"], state["done"]
        prompt_lengths, limits, rows = state["prompt_lengths"], state["limits"], ops.shape(tokens)[0]
        positions = index + ops.arange(count)
        # Inside a row's prompt, its own tokens are the drafts: kept as they are.
        known = ops.slice(tokens, (0, index), (rows, count))
        proposed, drafting = self.drafter.propose(tokens, index, prompt_lengths, state.get("drafter", {}))
        drafts = ops.where(positions[None, :] < prompt_lengths[:, None], known, proposed)
        fed = ops.where(drafts < 0, pad_token_id, drafts)  # an id of the vocabulary where there is no draft
        step = self.model.call_with_cache(
            ops.concatenate([ops.slice(tokens, (0, index - 1), (rows, 1)), fed], axis=1), state["cache"], index - 1
        )
        tentative = ops.slice_update(tokens, (0, index), fed)
        chosen_tokens, dones, generated, scores, kept = [], [], [], [], []
        for j in range(count + 1):
            position = index + j
            raw = ops.cast(step.logits[:, j], "float32")
            steered = apply_processors(self.processors, raw, DecodeContext(tentative, position, prompt_lengths))
            in_prompt = position < prompt_lengths
            unfinished = ops.logical_and(ops.logical_not(done), position < limits)
            active = ops.logical_and(ops.logical_not(in_prompt), unfinished)
            chosen, _, done, _ = search.select(
                steered, step_key(state["seed"], position), in_prompt, active, done, state["search"],
                state["stop_token_ids"], pad_token_id,
            )  # fmt: skip
            current = ops.slice(tentative, (0, position), (rows, 1))[:, 0]
            token = ops.where(in_prompt, current, chosen)
            if self.stop_sequences is not None:
                written = ops.slice_update(tentative, (0, position), token[:, None])
                ended = ends_stop_sequence(written, position, prompt_lengths, self.stop_sequences)
                done = ops.logical_or(done, ops.logical_and(active, ended))
            chosen_tokens.append(token)
            dones.append(done)
            generated.append(active)
            if self.logprobs:
                picked = ops.take_along_axis(raw, ops.maximum(chosen, 0)[:, None], axis=1)[:, 0]
                scores.append(picked - ops.logsumexp(raw, axis=-1))
            if j < count:
                kept.append(ops.logical_or(ops.logical_not(unfinished), token == drafts[:, j]))
        # Each unfinished row keeps its drafts up to its first miss, and the token chosen there.
        misses = ops.logical_not(ops.stack(kept, axis=1))  # (R, K)
        first_miss = ops.where(ops.any(misses, axis=1), ops.argmax(ops.cast(misses, "int32"), axis=1), count)
        advance = ops.minimum(ops.min(first_miss) + 1, ops.shape(tokens)[1] - index)
        committed = ops.arange(count + 1) < advance  # (K + 1,)
        written = ops.stack(chosen_tokens, axis=1)
        old = ops.slice(tokens, (0, index), (rows, count + 1))
        tokens = ops.slice_update(tokens, (0, index), ops.where(committed[None, :], written, old))
        new = ops.logical_and(ops.stack(generated, axis=1), committed[None, :])
        state = dict(state, cache=step.cache, token_ids=tokens, index=index + advance)
        if drafting:
            state["drafter"] = drafting
        state["done"] = ops.take(ops.stack(dones, axis=1), advance - 1, axis=1)
        state["num_generated"] = state["num_generated"] + ops.sum(ops.cast(new, "int32"), axis=1)
        if self.logprobs:
            column = ops.where(new, ops.stack(scores, axis=1), 0.0)
            old_scores = ops.slice(state["logprobs"], (0, index), (rows, count + 1))
            state["logprobs"] = ops.slice_update(
                state["logprobs"], (0, index), ops.where(committed[None, :], column, old_scores)
            )
        return state
