"""The sampler: greedy, seeds, truncation that never leaks, penalties by hand, logprobs, batching."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.core.sampling_params import SamplingParams
from hybridcache.gpu import sampler
from hybridcache.gpu.sampler import LaneSamplingState, SampleResult, apply_penalties, is_stop, sample

VOCAB = 32


# --- factories -------------------------------------------------------------------------------------------

def engine_generator(seed: int = 1234) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def lane(params: SamplingParams, prompt: tuple[int, ...] = (), engine: torch.Generator | None = None,
         vocab: int = VOCAB) -> LaneSamplingState:
    return LaneSamplingState.create(params, prompt, vocab, engine or engine_generator())


def random_logits(batch: int, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * 3.0


def logits_from_probs(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs).log().unsqueeze(0)


def draw_many(logits_row: torch.Tensor, params: SamplingParams, draws: int) -> list[int]:
    """`draws` independent picks from one distribution: a batch of lanes with seeds 0..draws-1."""
    lanes = [msgspec_replace(params, seed=seed) for seed in range(draws)]
    states = [lane(p) for p in lanes]
    return [r.token_id for r in sample(logits_row.expand(draws, -1).clone(), lanes, states)]


def msgspec_replace(params: SamplingParams, **changes) -> SamplingParams:
    import msgspec

    return msgspec.structs.replace(params, **changes)


def decode_tokens(logits_steps: torch.Tensor, params: SamplingParams, state: LaneSamplingState) -> list[int]:
    tokens = []
    for step in logits_steps:
        result = sample(step.unsqueeze(0), [params], [state])[0]
        state.record(result.token_id)
        tokens.append(result.token_id)
    return tokens


# --- assertion helpers -----------------------------------------------------------------------------------

def assert_only_tokens(drawn: list[int], allowed: set[int]) -> None:
    leaked = set(drawn) - allowed
    assert not leaked, f"sampled excluded tokens {sorted(leaked)}"


def assert_frequencies_near(drawn: list[int], expected: dict[int, float], tolerance: float) -> None:
    for token, probability in expected.items():
        observed = drawn.count(token) / len(drawn)
        assert abs(observed - probability) < tolerance, (token, observed, probability)


# --- greedy and seeds ------------------------------------------------------------------------------------

def test_greedy_picks_the_argmax_of_every_lane():
    logits = random_logits(6)
    params = [SamplingParams(temperature=0.0)] * 6
    results = sample(logits, params, [lane(p) for p in params])
    assert [r.token_id for r in results] == logits.argmax(dim=-1).tolist()


def test_same_seed_gives_the_same_tokens_and_another_seed_differs():
    steps = random_logits(40, seed=7) / 3.0
    params = SamplingParams(temperature=1.0, seed=99)
    first = decode_tokens(steps, params, lane(params))
    again = decode_tokens(steps, params, lane(params, engine=engine_generator(5)))
    reseeded = msgspec_replace(params, seed=100)
    other = decode_tokens(steps, reseeded, lane(reseeded))
    assert first == again
    assert first != other


def test_unseeded_lanes_follow_the_engine_generator():
    steps = random_logits(40, seed=8) / 3.0
    params = SamplingParams(temperature=1.0)
    from_engine_a = decode_tokens(steps, params, lane(params, engine=engine_generator(1)))
    from_engine_a_again = decode_tokens(steps, params, lane(params, engine=engine_generator(1)))
    from_engine_b = decode_tokens(steps, params, lane(params, engine=engine_generator(2)))
    assert from_engine_a == from_engine_a_again
    assert from_engine_a != from_engine_b


def test_two_unseeded_lanes_from_one_engine_generator_get_different_streams():
    engine = engine_generator(3)
    params = SamplingParams(temperature=1.0)
    states = [lane(params, engine=engine) for _ in range(2)]
    steps = random_logits(30, seed=9) / 3.0
    assert decode_tokens(steps, params, states[0]) != decode_tokens(steps, params, states[1])


@given(seed=st.integers(0, 2**32), logits_seed=st.integers(0, 1000))
@settings(max_examples=30, deadline=None)
def test_top_k_of_one_is_greedy(seed: int, logits_seed: int):
    logits = random_logits(3, seed=logits_seed)
    params = [SamplingParams(temperature=1.5, top_k=1, seed=seed)] * 3
    results = sample(logits, params, [lane(p) for p in params])
    assert [r.token_id for r in results] == logits.argmax(dim=-1).tolist()


# --- truncation never leaks ------------------------------------------------------------------------------

SKEWED = [0.40, 0.25, 0.15, 0.10, 0.05, 0.03, 0.02]


def test_top_p_never_samples_outside_the_nucleus_and_keeps_its_shape():
    drawn = draw_many(logits_from_probs(SKEWED), SamplingParams(top_p=0.75), draws=3000)
    assert_only_tokens(drawn, {0, 1, 2})  # 0.40 + 0.25 < 0.75 <= 0.40 + 0.25 + 0.15
    assert_frequencies_near(drawn, {0: 0.40 / 0.80, 1: 0.25 / 0.80, 2: 0.15 / 0.80}, tolerance=0.04)


def test_top_p_keeps_the_most_likely_token_even_when_it_alone_exceeds_p():
    drawn = draw_many(logits_from_probs(SKEWED), SamplingParams(top_p=0.1), draws=300)
    assert set(drawn) == {0}


def test_min_p_never_samples_tokens_below_its_threshold():
    drawn = draw_many(logits_from_probs(SKEWED), SamplingParams(min_p=0.3), draws=3000)
    assert_only_tokens(drawn, {0, 1, 2})  # threshold 0.3 * 0.40 = 0.12
    assert_frequencies_near(drawn, {0: 0.50, 1: 0.3125, 2: 0.1875}, tolerance=0.04)


def test_top_k_never_samples_beyond_rank_k():
    drawn = draw_many(logits_from_probs(SKEWED), SamplingParams(top_k=2), draws=2000)
    assert_only_tokens(drawn, {0, 1})
    assert_frequencies_near(drawn, {0: 0.40 / 0.65, 1: 0.25 / 0.65}, tolerance=0.04)


def test_combined_truncations_apply_the_strictest_cut():
    drawn = draw_many(logits_from_probs(SKEWED), SamplingParams(top_k=4, top_p=0.9, min_p=0.5),
                      draws=2000)
    assert_only_tokens(drawn, {0, 1})  # min_p: 0.5 * 0.40 = 0.20 drops token 2 onwards


def test_plain_temperature_sampling_matches_the_distribution():
    drawn = draw_many(logits_from_probs(SKEWED), SamplingParams(temperature=1.0), draws=4000)
    assert_frequencies_near(drawn, dict(enumerate(SKEWED)), tolerance=0.03)


def test_low_temperature_sharpens_the_distribution():
    drawn = draw_many(logits_from_probs(SKEWED), SamplingParams(temperature=0.25), draws=2000)
    sharpened = torch.tensor(SKEWED) ** 4
    assert_frequencies_near(drawn, {0: float(sharpened[0] / sharpened.sum())}, tolerance=0.04)


def wide_logits(vocab: int = 4096, head: int = 300, seed: int = 5) -> torch.Tensor:
    """A large vocabulary: `head` likely tokens (most of the mass) over a long, flat tail."""
    logits = torch.full((1, vocab), -2.0)
    logits[0, :head] = torch.rand(head, generator=torch.Generator().manual_seed(seed)) * 4.0 + 4.0
    return logits


@pytest.mark.parametrize("params", [
    SamplingParams(top_p=0.9), SamplingParams(top_p=0.999, temperature=1.3), SamplingParams(top_k=700),
    SamplingParams(top_k=2000, top_p=0.95), SamplingParams(top_p=0.5, min_p=0.2),
])
def test_the_candidate_shortcut_picks_what_a_full_sort_picks(monkeypatch: pytest.MonkeyPatch,
                                                             params: SamplingParams):
    logits = wide_logits()
    shortcut = draw_many(logits, params, draws=200)
    monkeypatch.setattr(sampler, "CANDIDATES", logits.shape[-1])  # every ranked row takes the full sort
    assert draw_many(logits, params, draws=200) == shortcut


def test_a_nucleus_wider_than_the_candidates_still_never_leaks():
    logits = torch.zeros(1, 4096)
    logits[0, 2048:] = -30.0  # 2048 equally likely tokens, a tail of practically nothing
    drawn = draw_many(logits, SamplingParams(top_p=0.6), draws=500)  # beyond the 1024 candidates
    assert all(token < 2048 for token in drawn)
    assert max(drawn) >= 1024  # the nucleus (~1229 tokens) reaches past the first 1024 ranks


# --- penalties, by hand ----------------------------------------------------------------------------------

def penalized(logits: list[float], params: SamplingParams, prompt: tuple[int, ...],
              outputs: tuple[int, ...]) -> list[float]:
    state = lane(params, prompt=prompt, vocab=len(logits))
    for token in outputs:
        state.record(token)
    return apply_penalties(torch.tensor([logits]), [params], [state])[0].tolist()


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    logits = [2.0, -2.0, 3.0, -1.0, 4.0]
    result = penalized(logits, SamplingParams(repetition_penalty=2.0), prompt=(0, 1), outputs=(2,))
    assert result == [1.0, -4.0, 1.5, -1.0, 4.0]


def test_presence_and_frequency_penalties_count_output_tokens_only():
    logits = [1.0, 1.0, 1.0, 1.0]
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    result = penalized(logits, params, prompt=(3,), outputs=(0, 0, 0, 1))
    assert result == pytest.approx([1.0 - 0.75 - 0.5, 1.0 - 0.25 - 0.5, 1.0, 1.0])


def test_all_penalties_together_apply_repetition_first():
    logits = [3.0, -3.0, 0.5]
    params = SamplingParams(repetition_penalty=1.5, presence_penalty=1.0, frequency_penalty=1.0)
    result = penalized(logits, params, prompt=(1,), outputs=(0, 0))
    assert result == pytest.approx([3.0 / 1.5 - 2.0 - 1.0, -3.0 * 1.5, 0.5])


def test_lanes_without_penalties_keep_their_logits():
    logits = random_logits(2)
    params = [SamplingParams(repetition_penalty=1.3), SamplingParams()]
    states = [lane(params[0], prompt=(1, 2, 3)), lane(params[1], prompt=(1, 2, 3))]
    out = apply_penalties(logits.clone(), params, states)
    assert torch.equal(out[1], logits[1])
    assert not torch.equal(out[0], logits[0])
    assert states[1].penalty_counts is None


def test_penalties_steer_greedy_decoding_away_from_repeats():
    steps = torch.tensor([[5.0, 4.9, 0.0]] * 3)
    params = SamplingParams(temperature=0.0, frequency_penalty=1.0)
    assert decode_tokens(steps, params, lane(params, vocab=3)) == [0, 1, 0]


# --- logprobs --------------------------------------------------------------------------------------------

def test_chosen_logprob_and_top_logprobs_come_from_the_penalized_untruncated_distribution():
    probs = [0.5, 0.3, 0.2]
    params = SamplingParams(temperature=0.0, logprobs=True, top_logprobs=2)
    result = sample(logits_from_probs(probs), [params], [lane(params, vocab=3)])[0]
    assert result.token_id == 0
    assert result.logprob == pytest.approx(math.log(0.5), abs=1e-6)
    assert [t for t, _ in result.top_logprobs] == [0, 1]
    assert [v for _, v in result.top_logprobs] == pytest.approx([math.log(0.5), math.log(0.3)], abs=1e-6)


def test_logprobs_ignore_truncation_and_temperature():
    probs = [0.5, 0.3, 0.2]
    params = SamplingParams(temperature=0.3, top_k=1, seed=4, logprobs=True, top_logprobs=3)
    result = sample(logits_from_probs(probs), [params], [lane(params, vocab=3)])[0]
    values = [v for _, v in result.top_logprobs]
    assert sum(math.exp(v) for v in values) == pytest.approx(1.0, abs=1e-6)
    assert values == pytest.approx([math.log(p) for p in probs], abs=1e-6)


def test_logprobs_reflect_penalties():
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0, logprobs=True, top_logprobs=2)
    logits = torch.tensor([[2.0, 1.5]])
    result = sample(logits, [params], [lane(params, prompt=(0,), vocab=2)])[0]
    expected = torch.log_softmax(torch.tensor([1.0, 1.5]), dim=0).tolist()
    assert result.token_id == 1
    assert result.logprob == pytest.approx(expected[1], abs=1e-6)
    assert [t for t, _ in result.top_logprobs] == [1, 0]
    assert [v for _, v in result.top_logprobs] == pytest.approx([expected[1], expected[0]], abs=1e-6)


def test_no_top_logprobs_unless_asked():
    params = SamplingParams()
    result = sample(random_logits(1), [params], [lane(params)])[0]
    assert result.top_logprobs == ()
    assert isinstance(result, SampleResult)


def test_only_the_lanes_that_ask_get_a_logprob():
    asking, quiet = SamplingParams(temperature=0.0, logprobs=True), SamplingParams(temperature=0.0)
    logits = random_logits(2, seed=8)
    results = sample(logits, [quiet, asking], [lane(quiet), lane(asking)])
    assert results[0].logprob is None
    expected = torch.log_softmax(logits[1], dim=-1)[results[1].token_id].item()
    assert results[1].logprob == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("width", [VOCAB, 248_320], ids=["narrow", "a-real-vocabulary"])
def test_greedy_ties_go_to_the_lowest_token_id_as_argmax_does(width):
    logits = torch.zeros(2, width)
    logits[0, [width - 5, 7, width // 2]] = 5.0
    logits[1, [width - 1, width - 2]] = 1.0
    params = [SamplingParams(temperature=0.0)] * 2
    assert [r.token_id for r in sample(logits, params, [lane(p) for p in params])] == [7, width - 2]


# --- batching --------------------------------------------------------------------------------------------

MIXED = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.8, top_p=0.9, seed=11),
    SamplingParams(temperature=1.2, top_k=5, seed=12, logprobs=True, top_logprobs=3),
    SamplingParams(temperature=1.0, min_p=0.1, repetition_penalty=1.3, frequency_penalty=0.4, seed=13),
    SamplingParams(temperature=0.0, presence_penalty=1.5, logprobs=True),
]


def test_a_batch_with_mixed_params_equals_each_lane_alone():
    prompt = (1, 2, 3, 4)
    steps = random_logits(12 * len(MIXED), seed=21).view(12, len(MIXED), VOCAB)
    batch_states = [lane(p, prompt) for p in MIXED]
    alone_states = [lane(p, prompt) for p in MIXED]
    for step in steps:
        together = sample(step.clone(), MIXED, batch_states)
        for row, (params, state) in enumerate(zip(MIXED, alone_states)):
            alone = sample(step[row:row + 1].clone(), [params], [state])[0]
            assert together[row] == alone
            state.record(alone.token_id)
            batch_states[row].record(together[row].token_id)


def test_sampling_never_writes_into_the_callers_logits():
    logits = random_logits(len(MIXED), seed=3)
    original = logits.clone()
    sample(logits, MIXED, [lane(p, (1, 2, 3)) for p in MIXED])
    assert torch.equal(logits, original)


def test_sample_rejects_mismatched_lengths():
    with pytest.raises(ValueError):
        sample(random_logits(2), [SamplingParams()], [lane(SamplingParams())])


# --- stop tokens and params ------------------------------------------------------------------------------

def test_is_stop_honours_stop_ids_and_eos_unless_ignored():
    params = SamplingParams(stop_token_ids=(7,))
    assert is_stop(7, params, eos_token_ids=(2,))
    assert is_stop(2, params, eos_token_ids=(2,))
    assert not is_stop(3, params, eos_token_ids=(2,))
    ignoring = SamplingParams(stop_token_ids=(7,), ignore_eos=True)
    assert not is_stop(2, ignoring, eos_token_ids=(2,))
    assert is_stop(7, ignoring, eos_token_ids=(2,))


@pytest.mark.parametrize(("field", "value"), [
    ("max_tokens", 0), ("temperature", -0.1), ("temperature", float("nan")), ("top_p", 0.0),
    ("top_p", 1.5), ("top_k", -1), ("min_p", 1.1), ("seed", -1), ("repetition_penalty", 0.0),
    ("presence_penalty", 2.5), ("frequency_penalty", -3.0), ("stop_token_ids", (1, -1)),
    ("top_logprobs", 21), ("max_tokens", True), ("logit_bias", ((3, 100.5),)), ("logit_bias", ((-1, 1.0),)),
    ("logit_bias", ((3, float("inf")),)), ("logit_bias", ((3, 1.0), (3, 2.0))),
])
def test_invalid_params_raise_value_error_naming_the_field(field: str, value: object):
    extra = {"logprobs": True} if field == "top_logprobs" else {}
    with pytest.raises(ValueError, match=rf"^{field}:"):
        SamplingParams(**{field: value}, **extra)


def test_top_logprobs_need_logprobs():
    with pytest.raises(ValueError, match=r"^top_logprobs:"):
        SamplingParams(top_logprobs=2)


def test_defaults_are_valid_and_not_greedy():
    params = SamplingParams()
    assert not params.greedy
    assert not params.uses_penalties
    assert SamplingParams(temperature=0).greedy


# --- logit bias ------------------------------------------------------------------------------------------
def test_logit_bias_adds_to_the_named_tokens_only():
    logits = random_logits(2)
    biased = SamplingParams(temperature=0.0, logit_bias=((4, 2.5), (9, -7.0)))
    params = [biased, SamplingParams(temperature=0.0)]
    scores = sampler.apply_logit_bias(logits.clone(), [lane(p) for p in params])
    expected = logits.clone()
    expected[0, 4] += 2.5
    expected[0, 9] -= 7.0
    assert torch.equal(scores, expected)


def test_logit_bias_forces_and_bans_greedy_choices():
    logits = random_logits(1)
    top = int(logits.argmax())
    low = int(logits.argmin())
    forced = SamplingParams(temperature=0.0, logit_bias=((low, 100.0),))
    banned = SamplingParams(temperature=0.0, logit_bias=((top, -100.0),))
    assert sample(logits, [forced], [lane(forced)])[0].token_id == low
    second = int(logits[0].topk(2).indices[1])
    assert sample(logits, [banned], [lane(banned)])[0].token_id == second


def test_a_banned_token_is_never_sampled_and_logprobs_come_from_the_biased_logits():
    logits = logits_from_probs([0.7, 0.2, 0.1])
    params = SamplingParams(temperature=1.0, logit_bias=((0, -100.0),), logprobs=True, top_logprobs=2)
    assert_only_tokens(draw_many(logits, params, 200), {1, 2})
    result = sample(logits, [params], [lane(params, vocab=3)])[0]
    expected = torch.log_softmax(logits[0] + torch.tensor([-100.0, 0.0, 0.0]), dim=-1)
    assert result.logprob == pytest.approx(float(expected[result.token_id]))


def test_logit_bias_never_writes_into_the_callers_logits():
    logits = random_logits(1)
    before = logits.clone()
    params = SamplingParams(temperature=0.0, logit_bias=((1, 50.0),))
    sample(logits, [params], [lane(params)])
    assert torch.equal(logits, before)
