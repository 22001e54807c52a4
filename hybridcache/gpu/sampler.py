"""Batched token sampling over decode lanes: penalties, greedy / temperature / top-k / top-p / min-p.

One call, `sample(logits [B, V], params per lane, states per lane)`, picks one token for every lane with
whole-batch tensor operations; only the B uniform draws are per lane (each lane has its own generator, so
a lane's tokens never depend on which other lanes share its batch).

Order of operations for each lane:

1. Penalties on an fp32 copy of the logits (the caller's tensor is never written): the repetition
   penalty (Hugging Face semantics: a logit of a token seen in the prompt or the output is divided by
   the penalty when positive, multiplied when negative), then the OpenAI presence and frequency
   penalties over output tokens (``logit -= frequency * count + presence * (count > 0)``).
2. Log-probabilities are taken here, ``score - logsumexp(scores)`` of the penalized logits: before
   temperature and before any truncation. So a lane's reported logprobs do not depend on
   temperature/top-k/top-p/min-p (they are the distribution the penalties leave), unlike vLLM's
   default, which reports the raw model's logprobs; with no penalties the two agree.
3. Greedy lanes (temperature 0) take the argmax of the penalized logits.
4. Sampling lanes divide by the temperature, softmax, rank descending, drop ranks >= top_k, drop tokens
   once the cumulative mass before them (renormalized over the top-k) reaches top_p (the most likely
   token always stays), drop tokens below ``min_p * p_max``, and draw by inverse CDF with one uniform
   from the lane's generator: a token whose probability was dropped can never be drawn.
   Ranking is the costly part, so each row takes the cheapest exact path: no ranking at all without
   top-k/top-p (inverse CDF in vocabulary order), its top `CANDIDATES` when they hold every token it
   can keep (top_k <= CANDIDATES, or a top-p reached inside them), a full sort otherwise. The path
   depends only on the row's own params and logits, so batching never changes a lane's tokens.

Lane state (`LaneSamplingState`) holds the lane's generator and, only when the lane uses penalties, its
seen-token mask and output-token counts; `record(token)` updates it after each step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import torch

from hybridcache.core.sampling_params import SamplingParams

_SEED_BOUND = 2**63 - 1
CANDIDATES = 1024  # rows whose top-k/top-p keep only tokens among their 1024 most likely skip the full sort


class SampleResult(NamedTuple):
    """One lane's pick: the token, its logprob (penalized, untruncated distribution), top-n alternatives."""

    token_id: int
    logprob: float | None  # None unless the lane asked for logprobs
    top_logprobs: tuple[tuple[int, float], ...]  # (token id, logprob), most likely first; () if not asked


class PenaltyCounts(NamedTuple):
    """A lane's token history over the vocabulary, kept only when the lane uses penalties."""

    seen: torch.Tensor  # bool [V]: in the prompt or the output (repetition penalty)
    output_counts: torch.Tensor  # float32 [V]: times each token was generated (presence/frequency)


class LaneSamplingState:
    """Mutable sampling state of one lane: its generator, its token history when penalties are on, and its
    ``logit_bias`` as (token ids, biases) tensors, built once rather than at every step."""

    def __init__(self, generator: torch.Generator, penalty_counts: PenaltyCounts | None,
                 bias: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        self.generator = generator
        self.penalty_counts = penalty_counts
        self.bias = bias

    @classmethod
    def create(cls, params: SamplingParams, prompt_token_ids: Iterable[int], vocab_size: int,
               engine_generator: torch.Generator, device: torch.device | str = "cpu") -> LaneSamplingState:
        """A fresh lane state; draws one seed from `engine_generator` (mutates it) when `params.seed` is None.

        `engine_generator` and the lane's own generator are CPU generators; penalty and bias tensors live
        on `device`. Raises IndexError when a prompt token is outside the vocabulary.
        """
        generator = torch.Generator(device="cpu")
        generator.manual_seed(params.seed if params.seed is not None else _draw_seed(engine_generator))
        counts = None
        if params.uses_penalties:
            seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            prompt = torch.as_tensor(list(prompt_token_ids), dtype=torch.long, device=device)
            seen[prompt] = True
            counts = PenaltyCounts(seen, torch.zeros(vocab_size, dtype=torch.float32, device=device))
        bias = None
        if params.logit_bias:
            tokens, values = zip(*params.logit_bias, strict=True)
            bias = (torch.tensor(tokens, dtype=torch.long, device=device),
                    torch.tensor(values, dtype=torch.float32, device=device))
        return cls(generator, counts, bias)

    def record(self, token_id: int) -> None:
        """Mutates: counts `token_id` as generated (a no-op for lanes without penalties)."""
        if self.penalty_counts is not None:
            self.penalty_counts.seen[token_id] = True
            self.penalty_counts.output_counts[token_id] += 1.0


def is_stop(token_id: int, params: SamplingParams, eos_token_ids: Iterable[int]) -> bool:
    """True when `token_id` ends the request: a stop token id, or an EOS token unless `ignore_eos`."""
    if token_id in params.stop_token_ids:
        return True
    return not params.ignore_eos and token_id in set(eos_token_ids)


def sample(logits: torch.Tensor, params: Sequence[SamplingParams],
           states: Sequence[LaneSamplingState]) -> list[SampleResult]:
    """Picks one token per lane from `logits` [B, V]. Advances each sampling lane's generator (mutates it).

    Does not record the picks: call `LaneSamplingState.record` for each lane afterwards. Never writes
    into `logits`. Raises ValueError when the lengths of `logits`, `params` and `states` disagree.
    """
    if logits.dim() != 2 or logits.shape[0] != len(params) or len(params) != len(states):
        raise ValueError(f"logits {tuple(logits.shape)} vs {len(params)} params and {len(states)} states")
    penalized = any(state.penalty_counts is not None for state in states)
    biased = any(state.bias is not None for state in states)
    scores = logits.to(torch.float32, copy=penalized or biased)
    if penalized:
        apply_penalties(scores, params, states)
    if biased:
        apply_logit_bias(scores, states)
    greedy = [row for row, lane in enumerate(params) if lane.greedy]
    if len(greedy) == len(params):  # argmax's first maximum, in half argmax's time on a CPU row of 248k
        return _results(scores.max(dim=-1).indices, scores, params)
    tokens = torch.empty(len(params), dtype=torch.long, device=scores.device)
    if greedy:
        index = _index(greedy, scores)
        tokens[index] = scores[index].max(dim=-1).indices
    sampling = [row for row, lane in enumerate(params) if not lane.greedy]
    if sampling:
        index = _index(sampling, scores)
        tokens[index] = _sample_rows(scores[index], [params[r] for r in sampling],
                                     [states[r] for r in sampling])
    return _results(tokens, scores, params)


def apply_penalties(scores: torch.Tensor, params: Sequence[SamplingParams],
                    states: Sequence[LaneSamplingState]) -> torch.Tensor:
    """The penalized logits: mutates and returns `scores` (a float32 [B, V] copy owned by the caller)."""
    rows = [row for row, lane in enumerate(params) if states[row].penalty_counts is not None]
    if not rows:
        return scores
    index = _index(rows, scores)
    seen = torch.stack([states[r].penalty_counts.seen for r in rows])
    counts = torch.stack([states[r].penalty_counts.output_counts for r in rows])
    repetition = _column([params[r].repetition_penalty for r in rows], scores)
    presence = _column([params[r].presence_penalty for r in rows], scores)
    frequency = _column([params[r].frequency_penalty for r in rows], scores)
    lane_scores = scores[index]
    penalized = torch.where(lane_scores > 0, lane_scores / repetition, lane_scores * repetition)
    lane_scores = torch.where(seen, penalized, lane_scores)
    lane_scores = lane_scores - frequency * counts - presence * (counts > 0).float()
    scores[index] = lane_scores
    return scores


def apply_logit_bias(scores: torch.Tensor, states: Sequence[LaneSamplingState]) -> torch.Tensor:
    """Adds each lane's ``logit_bias`` to its row: mutates and returns `scores` (a float32 [B, V] copy owned
    by the caller). Raises IndexError for a token id outside the row (callers check ids first)."""
    for row, state in enumerate(states):
        if state.bias is not None:
            scores[row].index_add_(0, *state.bias)
    return scores


def _sample_rows(scores: torch.Tensor, params: Sequence[SamplingParams],
                 states: Sequence[LaneSamplingState]) -> torch.Tensor:
    """One token per row; each row takes the cheapest exact path its own params and logits allow."""
    probs = torch.softmax(scores / _column([lane.temperature for lane in params], scores), dim=-1)
    uniforms = torch.cat([torch.rand(1, generator=state.generator) for state in states]).to(scores.device)
    tokens = torch.empty(len(params), dtype=torch.long, device=scores.device)
    unranked = [row for row, lane in enumerate(params) if lane.top_k == 0 and lane.top_p == 1.0]
    if unranked:
        index = _index(unranked, scores)
        tokens[index] = _draw_unranked(probs[index], [params[r] for r in unranked], uniforms[index])
    ranked = [row for row in range(len(params)) if row not in unranked]
    candidates, full = _split_by_candidates(probs, params, ranked)
    for rows, width in ((candidates, CANDIDATES), (full, probs.shape[-1])):
        if rows:
            index = _index(rows, scores)
            sorted_probs, sorted_ids = probs[index].topk(width, dim=-1)
            kept = truncate_sorted(sorted_probs, [params[r] for r in rows])
            tokens[index] = sorted_ids.gather(1, _inverse_cdf(kept, uniforms[index]).unsqueeze(1)).squeeze(1)
    return tokens


def truncate_sorted(sorted_probs: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Descending probabilities (all of a row's mass, or a prefix that holds every token top-k/top-p can
    keep) with the tokens top-k, top-p and min-p drop set to exactly 0. Not renormalized. Pure."""
    ranks = torch.arange(sorted_probs.shape[-1], device=sorted_probs.device).unsqueeze(0)
    top_k = torch.tensor([lane.top_k for lane in params], device=sorted_probs.device).unsqueeze(1)
    limited = top_k > 0
    kept = sorted_probs.masked_fill(limited & (ranks >= top_k), 0.0)
    kept_mass = torch.where(limited, kept.sum(dim=-1, keepdim=True), torch.ones_like(top_k, dtype=kept.dtype))
    mass_before = (kept.cumsum(dim=-1) - kept) / kept_mass
    top_p = _column([lane.top_p for lane in params], kept)
    kept = kept.masked_fill((mass_before >= top_p) & (ranks > 0), 0.0)
    min_p = _column([lane.min_p for lane in params], kept)
    return kept.masked_fill(kept < min_p * kept[:, :1], 0.0)


def _split_by_candidates(probs: torch.Tensor, params: Sequence[SamplingParams],
                         rows: list[int]) -> tuple[list[int], list[int]]:
    """(rows whose kept tokens all lie in their top `CANDIDATES`, rows that need a full sort)."""
    if not rows or probs.shape[-1] <= CANDIDATES:
        return [], rows
    unlimited = [r for r in rows if params[r].top_k == 0]
    covered = set()
    if unlimited:
        index = _index(unlimited, probs)
        head_mass = probs[index].topk(CANDIDATES, dim=-1).values.sum(dim=-1).tolist()
        covered = {r for r, mass in zip(unlimited, head_mass) if mass >= params[r].top_p}
    candidates = [r for r in rows if 0 < params[r].top_k <= CANDIDATES or r in covered]
    return candidates, [r for r in rows if r not in candidates]


def _draw_unranked(probs: torch.Tensor, params: Sequence[SamplingParams],
                   uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse CDF in vocabulary order (no sort): rows with no top-k/top-p, min-p applied."""
    if all(lane.min_p == 0.0 for lane in params):
        return _inverse_cdf(probs, uniforms)
    min_p = _column([lane.min_p for lane in params], probs)
    kept = probs.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
    return _inverse_cdf(kept, uniforms)


def _inverse_cdf(kept: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Column picked by each row's uniform in [0, 1); never a column of probability 0.

    The target stays strictly below the row's total, so the first column whose cumulative mass exceeds
    it exists and carries positive probability itself."""
    cdf = kept.cumsum(dim=-1)
    total = cdf[:, -1]
    targets = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, targets.unsqueeze(1), right=True).squeeze(1)


def _results(tokens: torch.Tensor, scores: torch.Tensor,
             params: Sequence[SamplingParams]) -> list[SampleResult]:
    """Logprobs of the penalized, untruncated distribution, ``score - logsumexp(scores)``, for the lanes
    that asked for logprobs (the normalizer is a pass over the whole vocabulary); None for the others."""
    asking = [row for row, lane in enumerate(params) if lane.logprobs or lane.top_logprobs]
    token_ids = tokens.tolist()
    if not asking:
        return [SampleResult(token, None, ()) for token in token_ids]
    index = _index(asking, scores)
    rows = scores[index]
    log_norm = torch.logsumexp(rows, dim=-1, keepdim=True)
    chosen = (rows.gather(1, tokens[index].unsqueeze(1)) - log_norm).squeeze(1).tolist()
    most = max(params[row].top_logprobs for row in asking)
    top_values: list[list[float]] = [[] for _ in asking]
    top_ids: list[list[int]] = [[] for _ in asking]
    if most > 0:
        values, ids = rows.topk(most, dim=-1)
        top_values, top_ids = (values - log_norm).tolist(), ids.tolist()
    results = [SampleResult(token, None, ()) for token in token_ids]
    for position, row in enumerate(asking):
        n = params[row].top_logprobs
        alternatives = tuple(zip(top_ids[position][:n], top_values[position][:n]))
        results[row] = SampleResult(token_ids[row], chosen[position], alternatives)
    return results


def _index(rows: list[int], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long, device=like.device)


def _column(values: list[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=like.device).unsqueeze(1)


def _draw_seed(engine_generator: torch.Generator) -> int:
    return int(torch.randint(0, _SEED_BOUND, (1,), generator=engine_generator).item())
