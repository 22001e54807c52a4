"""Engine, cache and server options: what a user sets, and the effective values derived from them.

Options arrive as `EngineOptions` (a `None` field means "not given, derive it"). `resolve_options()`
validates every field and every combination, derives the unset cache values the way spec §14.2 does, and
returns `EffectiveOptions`, which is what the engine runs with and what the startup ledger prints.
Nothing here mutates global state; every check raises `OptionError` naming the command-line flag.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import msgspec

from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.tap_planner import derive_tap_options
from hybridcache.cache.write_back import HostWrite
from hybridcache.persistence.file_safety import (
    UnsafeFileError,
    check_distinct_files,
    check_trusted_directory,
    check_trusted_file,
)

HedgeBudget = int | Literal["auto"]  # --cache-hedge-budget: bytes, or auto (hedge_admission.py)

DEFAULT_HOST_CACHE_MIB = 8192
MAX_CONCURRENCY_LIMIT = 8
DEFAULT_PREFILL_CHUNK = 2048  # on a GPU
CPU_PREFILL_CHUNK = 512
DEFAULT_MAX_CONCURRENCY = 4

DType = Literal["auto", "float32", "bfloat16", "float16"]


class OptionError(ValueError):
    """An invalid option or combination of options; `flag` names the command-line flag at fault."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag
        self.message = message


class CacheOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Prefix-cache options as given; `None` means "derive the default" (spec §14.2)."""

    prefix_reuse: bool = True  # --no-prefix-reuse sets False
    host_cache_mib: int | None = None  # --host-cache-mib (default 8192; 0 disables the Host tier)
    device_snapshot_slots: int | None = None  # --device-snapshot-slots
    max_new_taps: int | None = None  # --cache-taps-per-request
    tap_ladder_tokens: int | None = None  # --cache-tap-ladder
    tap_min_gap_tokens: int | None = None  # --cache-tap-min-gap
    hedges: bool = True  # --no-cache-hedges sets False (tap_planner HEDGE taps)
    exact_resume: bool = True  # --inexact-resume sets False: also resume from decode-produced entries
    endpoint_refill: bool = True  # --no-endpoint-refill sets False (core/endpoint_refills.py)
    device_snapshot_copies: bool | None = None  # keep host-backed snapshots' device copies; None: not on CPUs
    hedge_budget: HedgeBudget = "auto"  # --cache-hedge-budget (host bytes of hedge images)
    prefix_cache_file: str | None = None  # --prefix-cache-file
    event_log: str | None = None  # --event-log
    host_write: HostWrite | None = None  # --host-write (default back, through with --cache-dir)
    cache_dir: str | None = None  # --cache-dir (persistence/cache_dir.py)
    kv_events: str | None = None  # --kv-events tcp://HOST:PORT (publish the resumable cover to a router)
    kv_events_replay: str | None = None  # --kv-events-replay tcp://HOST:PORT (answer gap replays)


class EngineOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Engine options as given on the command line (or by a library caller)."""

    model: str | None = None  # --model: a Hugging Face checkpoint directory; None = embedded default
    dtype: DType = "auto"  # --dtype
    device: str = "auto"  # --device: auto | cpu | cuda | cuda:N
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY  # --max-concurrency (lanes, 1..8)
    prefill_chunk: int | None = None  # --prefill-chunk (tokens, a multiple of 64); None: by device
    kv_capacity: int | Literal["auto"] = "auto"  # --kv-capacity: device KV pages, or auto
    max_model_len: int | None = None  # --max-model-len (tokens); None = the model's own limit
    pending_timeout_s: float = 600.0  # --pending-timeout (seconds a request may wait for a lane)
    cache: CacheOptions = msgspec.field(default_factory=CacheOptions)


class EffectiveCacheOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Resolved cache options: every value concrete."""

    prefix_reuse: bool
    host_cache_bytes: int
    device_snapshot_slots: int
    max_new_taps: int
    tap_ladder_tokens: int
    tap_min_gap_tokens: int
    tap_pass_tokens: int = DEFAULT_PREFILL_CHUNK  # the pass length ladder taps land on (prefill_passes.py)
    hedges: bool = True
    exact_resume: bool = True
    endpoint_refill: bool = True
    device_snapshot_copies: bool | None = None  # None: resolved by the runtime from its device
    hedge_budget: HedgeBudget = "auto"  # auto: resolved by the engine from the image size (hedge_admission)
    prefix_cache_file: str | None
    event_log: str | None
    host_write: HostWrite = HostWrite.BACK
    cache_dir: str | None = None
    kv_events: str | None = None
    kv_events_replay: str | None = None

    @property
    def host_tier(self) -> bool:
        """True when the Host slab tier exists (a nonzero budget)."""
        return self.host_cache_bytes > 0


class EffectiveOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Resolved engine options, as `Engine.options()` reports them."""

    model: str | None
    dtype: DType
    device: str
    max_concurrency: int
    prefill_chunk: int
    kv_capacity: int | Literal["auto"]
    max_model_len: int | None
    pending_timeout_s: float
    cache: EffectiveCacheOptions


# Flags that only mean something while the prefix cache is on.
_CACHE_ONLY_FLAGS = {
    "host_cache_mib": "--host-cache-mib",
    "device_snapshot_slots": "--device-snapshot-slots",
    "max_new_taps": "--cache-taps-per-request",
    "tap_ladder_tokens": "--cache-tap-ladder",
    "tap_min_gap_tokens": "--cache-tap-min-gap",
    "prefix_cache_file": "--prefix-cache-file",
    "event_log": "--event-log",
    "host_write": "--host-write",
    "cache_dir": "--cache-dir",
    "kv_events": "--kv-events",
    "kv_events_replay": "--kv-events-replay",
}


def default_snapshot_slots(max_concurrency: int, host_tier: bool) -> int:
    """§14.2: D = C + 1 with a Host tier (one resident snapshot per live conversation plus staging), C + 2
    without one (the slots are then the only snapshot store). Pure."""
    return max_concurrency + 1 if host_tier else max_concurrency + 2


def default_prefill_chunk(device: str) -> int:
    """--prefill-chunk's default for ``device`` (as given: auto, cpu, cuda, cuda:N).

    A GPU runs a pass of DEFAULT_PREFILL_CHUNK tokens at full occupancy. A CPU prefills as fast in passes
    of CPU_PREFILL_CHUNK (2 threads, `small` checkpoint, 512 against 2048: 229-249 against 203-233 tok/s
    for a 2k prompt, 196-200 against 170 at 8k, 152 against 155 at 16k, 107 against 108 at 32k), holds
    fewer intermediates at its peak (RSS growth from the loaded model to the peak of a 2k prefill
    112-124 against 349-395 MiB, at 8k 194-203 against 416-420, at 32k 560 against 756, the prompt's KV
    included), and a decoding lane waits for one pass, not four: at 200 tok/s a 2048-token pass delays
    every other lane's next token by ten seconds. Reads torch's CUDA availability for auto."""
    if device == "auto":
        import torch  # deferred: option parsing stays free of torch until a device is asked about

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return CPU_PREFILL_CHUNK if device == "cpu" else DEFAULT_PREFILL_CHUNK


def resolve_options(options: EngineOptions) -> EffectiveOptions:
    """Validate `options` and derive every unset value. Pure; raises `OptionError` naming the flag."""
    _check_engine_fields(options)
    cache = options.cache
    _check_cache_fields(cache)
    if not cache.prefix_reuse:
        for field, flag in _CACHE_ONLY_FLAGS.items():
            if getattr(cache, field) is not None:
                raise OptionError(flag, "cannot be combined with --no-prefix-reuse (the cache is off)")
    host_mib = DEFAULT_HOST_CACHE_MIB if cache.host_cache_mib is None else cache.host_cache_mib
    if not cache.prefix_reuse:
        host_mib = 0
    host_tier = host_mib > 0
    if cache.prefix_cache_file is not None and not host_tier:
        raise OptionError(
            "--prefix-cache-file", "needs a Host tier; it cannot be used with --host-cache-mib 0"
        )
    if cache.cache_dir is not None and not host_tier:
        raise OptionError("--cache-dir", "needs a Host tier; it cannot be used with --host-cache-mib 0")
    if cache.cache_dir is not None and cache.prefix_cache_file is not None:
        raise OptionError(
            "--cache-dir", "replaces --prefix-cache-file (the directory is restored at start); give one"
        )
    prefill_chunk = options.prefill_chunk
    if prefill_chunk is None:
        prefill_chunk = default_prefill_chunk(options.device)
    # Taps are placed for passes of DEFAULT_PREFILL_CHUNK unless a chunk is given, so a CPU's shorter
    # default passes leave the same snapshots as a GPU's (cache/prefill_passes.py).
    tap_pass_tokens = DEFAULT_PREFILL_CHUNK if options.prefill_chunk is None else options.prefill_chunk
    taps = derive_tap_options(
        tap_pass_tokens,
        host_tier,
        max_new_taps=cache.max_new_taps,
        ladder_tokens=cache.tap_ladder_tokens,
        min_gap_tokens=cache.tap_min_gap_tokens,
    )
    slots = default_snapshot_slots(options.max_concurrency, host_tier)
    cache_file = _checked_file_path(cache.prefix_cache_file, "--prefix-cache-file", "prefix-cache file")
    event_log = _checked_file_path(cache.event_log, "--event-log", "event log")
    cache_dir = _checked_directory_path(cache.cache_dir)
    if cache_dir is not None and event_log is not None and Path(event_log).parent == Path(cache_dir):
        raise OptionError("--event-log", f"must not be inside the cache directory {cache_dir}")
    default_write = HostWrite.THROUGH if cache_dir is not None else HostWrite.BACK
    try:
        check_distinct_files(cache_file, event_log)
    except UnsafeFileError as error:
        raise OptionError("--prefix-cache-file", str(error)) from None
    effective_cache = EffectiveCacheOptions(
        prefix_reuse=cache.prefix_reuse,
        host_cache_bytes=host_mib << 20,
        device_snapshot_slots=slots if cache.device_snapshot_slots is None else cache.device_snapshot_slots,
        max_new_taps=taps.max_new_taps,
        tap_ladder_tokens=taps.ladder_tokens,
        tap_min_gap_tokens=taps.min_gap_tokens,
        tap_pass_tokens=tap_pass_tokens,
        hedges=cache.hedges,
        exact_resume=cache.exact_resume,
        endpoint_refill=cache.endpoint_refill,
        device_snapshot_copies=cache.device_snapshot_copies,
        hedge_budget=cache.hedge_budget,
        prefix_cache_file=cache_file,
        event_log=event_log,
        host_write=HostWrite(cache.host_write or default_write),
        cache_dir=cache_dir,
        kv_events=_checked_endpoint(cache.kv_events, "--kv-events"),
        kv_events_replay=_checked_endpoint(cache.kv_events_replay, "--kv-events-replay"),
    )
    if effective_cache.kv_events_replay is not None and effective_cache.kv_events is None:
        raise OptionError("--kv-events-replay", "needs --kv-events (the replay answers that stream's gaps)")
    kv_events = effective_cache.kv_events
    if kv_events is not None and kv_events == effective_cache.kv_events_replay:
        raise OptionError("--kv-events-replay", "must differ from --kv-events")
    return EffectiveOptions(
        model=options.model,
        dtype=options.dtype,
        device=options.device,
        max_concurrency=options.max_concurrency,
        prefill_chunk=prefill_chunk,
        kv_capacity=options.kv_capacity,
        max_model_len=options.max_model_len,
        pending_timeout_s=options.pending_timeout_s,
        cache=effective_cache,
    )


def check_host_budget(cache: EffectiveCacheOptions, image_bytes: int, slab_bytes: int) -> None:
    """Reject a nonzero Host budget that cannot hold one snapshot (image slabs + tail slab) and one block.

    Called at engine construction, once the model's geometry is known. Raises `OptionError`.
    """
    if not cache.host_tier:
        return
    image_slabs = -(-image_bytes // slab_bytes)
    needed = (image_slabs + 1 + 1) * slab_bytes
    if cache.host_cache_bytes < needed:
        raise OptionError(
            "--host-cache-mib",
            f"{cache.host_cache_bytes >> 20} MiB cannot hold one snapshot plus one block of this model "
            f"(needs at least {-(-needed // (1 << 20))} MiB); use 0 to disable the Host tier",
        )


def _check_engine_fields(options: EngineOptions) -> None:
    if not 1 <= options.max_concurrency <= MAX_CONCURRENCY_LIMIT:
        raise OptionError("--max-concurrency", f"must be between 1 and {MAX_CONCURRENCY_LIMIT}")
    chunk = options.prefill_chunk
    if chunk is not None and (chunk < BLOCK_TOKENS or chunk % BLOCK_TOKENS):
        raise OptionError("--prefill-chunk", f"must be a positive multiple of {BLOCK_TOKENS} tokens")
    if options.kv_capacity != "auto" and (
        not isinstance(options.kv_capacity, int) or options.kv_capacity < 1
    ):
        raise OptionError("--kv-capacity", "must be 'auto' or a positive number of 64-token pages")
    if options.max_model_len is not None and options.max_model_len < 1:
        raise OptionError("--max-model-len", "must be a positive number of tokens")
    if options.pending_timeout_s <= 0:
        raise OptionError("--pending-timeout", "must be a positive number of seconds")
    if options.dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise OptionError("--dtype", "must be one of auto, float32, bfloat16, float16")
    device = options.device
    if not (device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())):
        raise OptionError("--device", "must be auto, cpu, cuda or cuda:N")


def _check_cache_fields(cache: CacheOptions) -> None:
    if cache.host_cache_mib is not None and cache.host_cache_mib < 0:
        raise OptionError("--host-cache-mib", "must be 0 (no Host tier) or a positive number of MiB")
    if cache.device_snapshot_slots is not None and cache.device_snapshot_slots < 1:
        raise OptionError("--device-snapshot-slots", "must be at least 1 (taps stage through a slot)")
    if cache.max_new_taps is not None and cache.max_new_taps < 0:
        raise OptionError("--cache-taps-per-request", "must not be negative")
    if cache.tap_ladder_tokens is not None and cache.tap_ladder_tokens < BLOCK_TOKENS:
        raise OptionError("--cache-tap-ladder", f"must be at least {BLOCK_TOKENS} tokens")
    if cache.tap_min_gap_tokens is not None and cache.tap_min_gap_tokens < 0:
        raise OptionError("--cache-tap-min-gap", "must not be negative")
    budget = cache.hedge_budget
    if budget != "auto" and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0):
        raise OptionError("--cache-hedge-budget", f"must be auto or a number of bytes >= 0, not {budget!r}")
    if cache.host_write is not None and cache.host_write not in list(HostWrite):
        raise OptionError("--host-write", f"must be back or through, not {cache.host_write!r}")


def _checked_directory_path(path: str | None) -> str | None:
    """Resolve ``--cache-dir`` to an absolute path: an existing directory, or a new one in an existing
    parent (created 0700 when the engine starts); refused when another user could write it or its
    files. Reads the file system only."""
    if path is None:
        return None
    if not path:
        raise OptionError("--cache-dir", "must not be empty")
    resolved = Path(os.path.abspath(os.path.expanduser(path)))
    if resolved.exists() and not resolved.is_dir():
        raise OptionError("--cache-dir", f"{resolved} exists and is not a directory")
    if not resolved.parent.is_dir():
        raise OptionError("--cache-dir", f"the parent directory {resolved.parent} does not exist")
    try:
        check_trusted_directory(resolved, "cache directory")
        for name in ("slabs", "contents", "lock"):
            if resolved.is_dir():
                check_trusted_file(resolved / name, f"cache-directory file {name}")
    except UnsafeFileError as error:
        raise OptionError("--cache-dir", str(error)) from None
    return str(resolved)


def _checked_file_path(path: str | None, flag: str, what: str) -> str | None:
    """Resolve a file path to an absolute one; reject a directory, a missing parent directory, and a file
    or directory another user could write (see persistence/file_safety.py). Reads the file system only."""
    if path is None:
        return None
    if not path:
        raise OptionError(flag, "must not be empty")
    resolved = Path(os.path.abspath(os.path.expanduser(path)))
    if resolved.is_dir():
        raise OptionError(flag, f"{resolved} is a directory; give a file path")
    if not resolved.parent.is_dir():
        raise OptionError(flag, f"the parent directory {resolved.parent} does not exist")
    try:
        check_trusted_file(resolved, what)
    except UnsafeFileError as error:
        raise OptionError(flag, str(error)) from None
    return str(resolved)


def _checked_endpoint(endpoint: str | None, flag: str) -> str | None:
    """A ZMQ endpoint to bind: ``tcp://HOST:PORT`` with a port in 1..65535 (``*`` binds every address).
    Pure; raises OptionError otherwise."""
    if endpoint is None:
        return None
    scheme, _, rest = endpoint.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme != "tcp" or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise OptionError(flag, f"expected tcp://HOST:PORT, got {endpoint!r}")
    return endpoint


_SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_hedge_budget(text: str) -> HedgeBudget:
    """``--cache-hedge-budget`` (and ``simulate --hedge-budget``): ``auto``, or bytes with an optional
    K, M or G suffix (powers of 1024). Pure; raises ValueError with the reason."""
    value = text.strip()
    if value.lower() == "auto":
        return "auto"
    number, suffix = value.rstrip("KMGkmg"), value[len(value.rstrip("KMGkmg")) :].upper()
    if suffix not in _SIZE_SUFFIXES or not number.isdigit():
        raise ValueError(f"wants auto or a number of bytes (suffix K, M or G), not {text!r}")
    return int(number) * _SIZE_SUFFIXES[suffix]
