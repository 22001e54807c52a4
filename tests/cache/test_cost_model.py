"""The context-cost model (spec §6.2): hand-computed prefill and restore prices, and validation."""

import math

import msgspec
import pytest

from hybridcache.cache.cost_model import CacheCostModel, preset_names


def model(**overrides: float) -> CacheCostModel:
    """A model with easy coefficients; each test overrides what it exercises."""
    fields = {
        "token_seconds": 0.0,
        "pair_seconds": 0.0,
        "chunk_seconds": 0.0,
        "prefill_chunk_tokens": 100,
        "h2d_bytes_per_second": 1000.0,
        "restore_batch_seconds": 0.0,
    }
    fields.update(overrides)
    return CacheCostModel(**fields)


def test_prefill_of_nothing_costs_nothing_even_with_a_fixed_chunk_cost():
    assert model(chunk_seconds=1.0, token_seconds=1.0).prefill_seconds(base=5000, tokens=0) == 0.0


def test_the_linear_term_counts_tokens():
    assert model(token_seconds=0.5).prefill_seconds(base=10, tokens=4) == pytest.approx(2.0)


def test_the_pair_term_counts_base_times_new_plus_the_new_triangle():
    # base=10, tokens=4: 10*4 + 4*5/2 = 50 pairs
    assert model(pair_seconds=1.0).prefill_seconds(base=10, tokens=4) == pytest.approx(50.0)
    # from the root: 3 tokens attend to 1 + 2 + 3 = 6 pairs
    assert model(pair_seconds=1.0).prefill_seconds(base=0, tokens=3) == pytest.approx(6.0)


def test_the_chunk_term_counts_forward_passes_rounded_up():
    chunky = model(chunk_seconds=1.0, prefill_chunk_tokens=100)
    assert chunky.prefill_seconds(0, 1) == 1.0
    assert chunky.prefill_seconds(0, 100) == 1.0
    assert chunky.prefill_seconds(0, 101) == 2.0


def test_all_terms_add_up():
    full = model(token_seconds=0.01, pair_seconds=0.001, chunk_seconds=0.5, prefill_chunk_tokens=64)
    # tokens=100 from base=28: 1.0 linear + 0.001*(2800 + 5050) + 0.5*2 passes
    assert full.prefill_seconds(base=28, tokens=100) == pytest.approx(1.0 + 7.85 + 1.0)


def test_a_deeper_base_makes_the_same_suffix_dearer():
    default = CacheCostModel.default()
    assert default.prefill_seconds(100_000, 512) > default.prefill_seconds(0, 512)


def test_restore_is_bytes_over_bandwidth_plus_batch_latency_and_free_when_nothing_moves():
    restore = model(h2d_bytes_per_second=1e9, restore_batch_seconds=0.002)
    assert restore.restore_seconds(0) == 0.0
    assert restore.restore_seconds(500_000_000) == pytest.approx(0.502)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("token_seconds", -1.0),
        ("pair_seconds", -1e-9),
        ("chunk_seconds", math.nan),
        ("restore_batch_seconds", math.inf),
        ("h2d_bytes_per_second", 0.0),
        ("h2d_bytes_per_second", -5.0),
        ("prefill_chunk_tokens", 0),
    ],
)
def test_nonsensical_coefficients_are_rejected(field, value):
    with pytest.raises(ValueError, match=field):
        model(**{field: value})


def test_negative_arguments_are_rejected():
    with pytest.raises(ValueError):
        model().prefill_seconds(-1, 5)
    with pytest.raises(ValueError):
        model().prefill_seconds(0, -5)
    with pytest.raises(ValueError):
        model().restore_seconds(-1)


def test_the_27b_preset_reproduces_the_spec_planning_figures():
    spec = CacheCostModel.qwen35_27b_rtx5090()
    # §3.3: 100 k tokens ≈ 24 s of prefill; one 186.8 MiB image restores in a few ms (24–27 GB/s).
    assert 20.0 < spec.prefill_seconds(0, 100_000) < 28.0
    assert 0.005 < spec.restore_seconds(195_897_344) < 0.010
    # §3.3 consequence: a host-resident prefix is orders of magnitude cheaper to restore than recompute.
    kv_100k_int8 = 3_380_000_000
    assert spec.prefill_seconds(0, 100_000) / spec.restore_seconds(kv_100k_int8) > 100


def test_presets_are_reachable_by_name_and_unknown_names_fail():
    assert set(preset_names()) == {"generic", "qwen3.5-27b-rtx5090"}
    assert CacheCostModel.preset("generic") == CacheCostModel.default()
    assert CacheCostModel.preset("qwen3.5-27b-rtx5090") == CacheCostModel.qwen35_27b_rtx5090()
    with pytest.raises(ValueError, match="unknown"):
        CacheCostModel.preset("gpt-9")


def test_the_model_is_frozen_and_validates_when_decoded():
    default = CacheCostModel.default()
    with pytest.raises(AttributeError):
        default.token_seconds = 1.0  # type: ignore[misc]
    encoded = msgspec.json.encode(default)
    assert msgspec.json.decode(encoded, type=CacheCostModel) == default
    broken = encoded.replace(b'"prefill_chunk_tokens":2048', b'"prefill_chunk_tokens":0')
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(broken, type=CacheCostModel)
