"""Option derivation (spec §14.2) and every rejected combination, each naming its flag."""

from pathlib import Path

import pytest

from hybridcache.config import (
    CacheOptions,
    EngineOptions,
    OptionError,
    check_host_budget,
    default_prefill_chunk,
    resolve_options,
)


def resolve(cache: CacheOptions | None = None, **engine) -> object:
    return resolve_options(EngineOptions(cache=cache or CacheOptions(), **engine))


def assert_rejected(flag: str, cache: CacheOptions | None = None, **engine) -> OptionError:
    with pytest.raises(OptionError) as caught:
        resolve(cache, **engine)
    assert caught.value.flag == flag
    assert str(caught.value).startswith(flag + ":")
    return caught.value


def test_defaults_with_a_host_tier_follow_the_spec():
    effective = resolve(max_concurrency=4, prefill_chunk=2048)
    assert effective.cache.host_cache_bytes == 8192 << 20
    assert effective.cache.host_tier
    assert effective.cache.device_snapshot_slots == 5  # C + 1
    assert effective.cache.max_new_taps == 8
    assert effective.cache.tap_ladder_tokens == 4096  # max(4096, 2*chunk)
    assert effective.cache.tap_min_gap_tokens == 2048  # max(1024, chunk)


def test_defaults_without_a_host_tier_follow_the_spec():
    effective = resolve(CacheOptions(host_cache_mib=0), max_concurrency=3, prefill_chunk=512)
    assert not effective.cache.host_tier
    assert effective.cache.device_snapshot_slots == 5  # C + 2
    assert effective.cache.max_new_taps == 2
    assert effective.cache.tap_ladder_tokens == 4096
    assert effective.cache.tap_min_gap_tokens == 1024


def test_host_writes_default_to_write_back_and_through_can_be_chosen():
    assert resolve().cache.host_write == "back"
    assert resolve(CacheOptions(host_write="through")).cache.host_write == "through"
    error = assert_rejected("--host-write", CacheOptions(host_write="sometimes"))  # type: ignore[arg-type]
    assert "back or through" in error.message


def test_the_prefill_chunk_defaults_by_device():
    assert default_prefill_chunk("cpu") == 512
    assert default_prefill_chunk("cuda") == default_prefill_chunk("cuda:1") == 2048
    effective = resolve(device="cpu")
    assert effective.prefill_chunk == 512
    assert effective.cache.tap_ladder_tokens == 4096  # taps are placed as for the default 2048 passes
    assert effective.cache.tap_min_gap_tokens == 2048
    assert effective.cache.tap_pass_tokens == 2048  # ladder taps land as on a GPU's passes
    assert resolve(device="cuda:0").prefill_chunk == 2048  # resolving options needs no GPU
    given = resolve(device="cpu", prefill_chunk=1024)
    assert given.prefill_chunk == given.cache.tap_pass_tokens == 1024


def test_large_chunks_widen_the_ladder():
    effective = resolve(prefill_chunk=4096)
    assert effective.cache.tap_ladder_tokens == 8192
    assert effective.cache.tap_min_gap_tokens == 4096


def test_given_values_win_over_derived_ones():
    cache = CacheOptions(device_snapshot_slots=3, max_new_taps=1, tap_ladder_tokens=128, tap_min_gap_tokens=0)
    effective = resolve(cache)
    assert (effective.cache.device_snapshot_slots, effective.cache.max_new_taps) == (3, 1)
    assert (effective.cache.tap_ladder_tokens, effective.cache.tap_min_gap_tokens) == (128, 0)


def test_no_prefix_reuse_turns_the_host_tier_off():
    effective = resolve(CacheOptions(prefix_reuse=False))
    assert not effective.cache.prefix_reuse
    assert not effective.cache.host_tier


@pytest.mark.parametrize(
    ("flag", "cache", "engine"),
    [
        ("--host-cache-mib", CacheOptions(host_cache_mib=-1), {}),
        ("--device-snapshot-slots", CacheOptions(device_snapshot_slots=0), {}),
        ("--cache-taps-per-request", CacheOptions(max_new_taps=-2), {}),
        ("--cache-tap-ladder", CacheOptions(tap_ladder_tokens=10), {}),
        ("--cache-tap-min-gap", CacheOptions(tap_min_gap_tokens=-1), {}),
        ("--max-concurrency", None, {"max_concurrency": 0}),
        ("--max-concurrency", None, {"max_concurrency": 9}),
        ("--prefill-chunk", None, {"prefill_chunk": 100}),
        ("--prefill-chunk", None, {"prefill_chunk": -64}),
        ("--kv-capacity", None, {"kv_capacity": 0}),
        ("--max-model-len", None, {"max_model_len": -5}),
        ("--pending-timeout", None, {"pending_timeout_s": 0.0}),
        ("--device", None, {"device": "tpu"}),
    ],
)
def test_negative_or_out_of_range_values_are_rejected(flag, cache, engine):
    assert_rejected(flag, cache, **engine)


@pytest.mark.parametrize(
    ("flag", "cache"),
    [
        ("--host-cache-mib", CacheOptions(prefix_reuse=False, host_cache_mib=1024)),
        ("--device-snapshot-slots", CacheOptions(prefix_reuse=False, device_snapshot_slots=4)),
        ("--cache-taps-per-request", CacheOptions(prefix_reuse=False, max_new_taps=4)),
        ("--cache-tap-ladder", CacheOptions(prefix_reuse=False, tap_ladder_tokens=4096)),
        ("--cache-tap-min-gap", CacheOptions(prefix_reuse=False, tap_min_gap_tokens=1024)),
        ("--prefix-cache-file", CacheOptions(prefix_reuse=False, prefix_cache_file="x.cache")),
        ("--event-log", CacheOptions(prefix_reuse=False, event_log="x.log")),
        ("--host-write", CacheOptions(prefix_reuse=False, host_write="through")),
    ],
)
def test_no_prefix_reuse_rejects_every_cache_option(flag, cache):
    error = assert_rejected(flag, cache)
    assert "--no-prefix-reuse" in error.message


def test_cache_file_needs_a_host_tier(tmp_path: Path):
    error = assert_rejected(
        "--prefix-cache-file", CacheOptions(host_cache_mib=0, prefix_cache_file=str(tmp_path / "c.bin"))
    )
    assert "--host-cache-mib 0" in error.message


def test_cache_file_must_not_be_a_directory(tmp_path: Path):
    assert_rejected("--prefix-cache-file", CacheOptions(prefix_cache_file=str(tmp_path)))


def test_cache_file_parent_must_exist(tmp_path: Path):
    error = assert_rejected(
        "--prefix-cache-file", CacheOptions(prefix_cache_file=str(tmp_path / "missing" / "c.bin"))
    )
    assert "does not exist" in error.message


def test_event_log_path_is_checked_like_the_cache_file(tmp_path: Path):
    assert_rejected("--event-log", CacheOptions(event_log=str(tmp_path)))
    assert_rejected("--event-log", CacheOptions(event_log=str(tmp_path / "no" / "log")))


def test_valid_file_paths_become_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    effective = resolve(CacheOptions(prefix_cache_file="prefix.cache", event_log="events.log"))
    assert effective.cache.prefix_cache_file == str(tmp_path / "prefix.cache")
    assert effective.cache.event_log == str(tmp_path / "events.log")


def test_host_budget_must_hold_one_snapshot_and_one_block():
    image_bytes, slab_bytes = 3 << 20, 1 << 20  # 3 image slabs + 1 tail slab + 1 block slab = 5 MiB
    check_host_budget(resolve(CacheOptions(host_cache_mib=5)).cache, image_bytes, slab_bytes)
    with pytest.raises(OptionError) as caught:
        check_host_budget(resolve(CacheOptions(host_cache_mib=4)).cache, image_bytes, slab_bytes)
    assert caught.value.flag == "--host-cache-mib"
    assert "5 MiB" in caught.value.message


def test_host_budget_zero_disables_the_check():
    check_host_budget(resolve(CacheOptions(host_cache_mib=0)).cache, 1 << 40, 1 << 20)
