"""`hybridcache bench model`: our model runtime vs transformers' Qwen3.5 on the same checkpoint, same run.

Prints one name=value per line: prefill tok/s and decode tok/s (batch 1 and 4) for both implementations,
their ratios (`prefill_vs_transformers`, `decode_vs_transformers` = batch-4 decode, plus the batch-1 ratio),
measured with the two implementations loaded together and their timed runs interleaved (this machine's load
from other processes varies; interleaving puts it on both sides alike),
and the peak RSS of loading (measured in a fresh process, which then touches every weight) vs the size of
the weight files. The checkpoint is `--checkpoint DIR`, or the `--preset` built once into a cache folder.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from hybridcache.cache.ids import PageId, SlotId
from hybridcache.gpu.kv_pool import pages_for_tokens

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DECODE_LANES = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset",
        default="small",
        help="make-tiny-model preset to build and measure (default: %(default)s; ignored with --checkpoint)",
    )
    parser.add_argument("--checkpoint", type=Path, help="a Hugging Face Qwen3.5 checkpoint directory")
    parser.add_argument(
        "--dtype", choices=["auto", *DTYPES], default="auto", help="compute dtype (auto: the stored dtype)"
    )
    parser.add_argument(
        "--prompt-tokens", type=int, default=512, help="prefill length (default: %(default)s)"
    )
    parser.add_argument(
        "--decode-steps", type=int, default=16, help="decode steps timed (default: %(default)s)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed repeats; the best is kept (default: %(default)s)"
    )
    parser.add_argument(
        "--threads", type=int, help="torch threads for both implementations (default: torch's)"
    )
    parser.add_argument("--skip-load-memory", action="store_true", help="do not measure loading's peak RSS")


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    directory = args.checkpoint or _preset_checkpoint(args.preset)
    print(f"checkpoint={directory}")
    print(f"threads={torch.get_num_threads()}")
    if not args.skip_load_memory:
        _print_load_memory(directory, args.dtype)
    dtype = None if args.dtype == "auto" else DTYPES[args.dtype]
    shape = Workload(args.prompt_tokens, args.decode_steps)
    sides = {"ours": _ours(directory, dtype, shape), "transformers": _transformers(directory, dtype, shape)}
    rates = _measure_side_by_side(sides, shape, args.repeats)
    for side, measured in rates.items():
        for name, value in measured.items():
            print(f"{side}_{name}={value:.1f}")
    ours, theirs = rates["ours"], rates["transformers"]
    print(f"prefill_vs_transformers={ours['prefill_tok_s'] / theirs['prefill_tok_s']:.2f}")
    print(f"decode_b1_vs_transformers={ours['decode_b1_tok_s'] / theirs['decode_b1_tok_s']:.2f}")
    print(f"decode_vs_transformers={ours['decode_b4_tok_s'] / theirs['decode_b4_tok_s']:.2f}")
    return 0


class Workload(NamedTuple):
    prompt_tokens: int
    decode_steps: int


class Side(NamedTuple):
    """One implementation's timed actions: a prefill of the prompt, and `decode_steps` decode steps at batch
    1 and at batch `DECODE_LANES` (every lane at the prompt's length)."""

    prefill: Callable[[], object]
    decode_b1: Callable[[], object]
    decode_b4: Callable[[], object]


def _measure_side_by_side(
    sides: dict[str, Side], shape: Workload, repeats: int
) -> dict[str, dict[str, float]]:
    """Tokens per second of each side's actions: each action warmed up once, then timed `repeats` times with
    the two sides interleaved (ours, theirs, ours, ...), so load from other processes on this machine falls
    on both alike; the best time is kept."""
    tokens = {
        "prefill": shape.prompt_tokens,
        "decode_b1": shape.decode_steps,
        "decode_b4": shape.decode_steps * DECODE_LANES,
    }
    best = {side: dict.fromkeys(tokens, float("inf")) for side in sides}
    for action in tokens:
        for side in sides.values():
            getattr(side, action)()  # warm-up
        for _ in range(repeats):
            for name, side in sides.items():
                best[name][action] = min(best[name][action], _timed(getattr(side, action)))
    return {
        name: {f"{action}_tok_s": tokens[action] / seconds for action, seconds in times.items()}
        for name, times in best.items()
    }


def _preset_checkpoint(preset: str) -> Path:
    """The preset's checkpoint in the user's cache folder, built on first use."""
    from hybridcache.tools.make_tiny_model import ensure_preset, preset_dir

    if not preset_dir(preset).is_dir():
        print(f"building the {preset} checkpoint in {preset_dir(preset)}", file=sys.stderr)
    return ensure_preset(preset)


def _timed(action: Callable[[], object]) -> float:
    """Wall seconds of one run of `action`."""
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _prompt(vocab_size: int, length: int) -> list[int]:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, min(vocab_size, 30000), (length,), generator=generator).tolist()


def _ours(directory: Path, dtype: torch.dtype | None, shape: Workload) -> Side:
    from hybridcache.gpu.model import load_model

    model = load_model(directory, dtype=dtype)
    prompt = _prompt(model.config.vocab_size, shape.prompt_tokens)
    pages_per_lane = pages_for_tokens(shape.prompt_tokens + shape.decode_steps + 1)
    kv = model.new_kv_pools(pages_per_lane * DECODE_LANES)
    states = model.new_state_slots(DECODE_LANES)
    tables = [
        [PageId(lane * pages_per_lane + i) for i in range(pages_per_lane)] for lane in range(DECODE_LANES)
    ]

    def prefill() -> None:
        model.prefill(prompt, 0, tables[0], SlotId(0), kv, states)

    prefill()
    for lane in range(1, DECODE_LANES):
        states.copy_slot(SlotId(0), SlotId(lane))
        for page in range(pages_per_lane):
            kv.copy_page(tables[0][page], tables[lane][page])

    def decode(lanes: int) -> None:  # rewrites the same positions on every call
        for step in range(shape.decode_steps):
            position = shape.prompt_tokens + step
            model.decode(
                [prompt[step]] * lanes,
                [position] * lanes,
                tables[:lanes],
                [SlotId(lane) for lane in range(lanes)],
                kv,
                states,
            )

    return Side(prefill, lambda: decode(1), lambda: decode(DECODE_LANES))


def _transformers(directory: Path, dtype: torch.dtype | None, shape: Workload) -> Side:
    """transformers' model as its users run it: eager forward passes with its own cache (what `generate`
    does per step, without the sampling)."""
    import transformers

    config = json.loads((directory / "config.json").read_text())
    cls = getattr(transformers, config["architectures"][0])
    model = cls.from_pretrained(directory, dtype=dtype or "auto").eval()
    prompt = torch.tensor([_prompt(config.get("vocab_size", 32000), shape.prompt_tokens)])

    @torch.inference_mode()
    def prefill(ids: torch.Tensor = prompt):
        return model(ids, use_cache=True, logits_to_keep=1).cache

    @torch.inference_mode()
    def decode(cache, lanes: int) -> None:  # extends the cache by `decode_steps` on every call
        for step in range(shape.decode_steps):
            model(prompt[:, step : step + 1].expand(lanes, 1), cache=cache, use_cache=True)

    cache = prefill()
    batch_cache = _repeat_lanes(prefill(), DECODE_LANES)
    return Side(prefill, lambda: decode(cache, 1), lambda: decode(batch_cache, DECODE_LANES))


def _repeat_lanes(cache, lanes: int):
    """Repeat a batch-1 transformers cache `lanes` times (its linear-attention layers lack this method)."""
    for layer in cache.layers:
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor) and tensor.numel():
                setattr(layer, name, tensor.repeat_interleave(lanes, dim=0))
        for name in ("conv_states", "recurrent_states"):
            states = getattr(layer, name, None) or {}
            for index, tensor in states.items():
                if isinstance(tensor, torch.Tensor):
                    states[index] = tensor.repeat_interleave(lanes, dim=0)
    return cache


def _print_load_memory(directory: Path, dtype: str) -> None:
    """Run `_load_probe` in a fresh interpreter and print what it measured."""
    code = (
        f"from hybridcache.tools.bench_model import _load_probe; _load_probe({str(directory)!r}, {dtype!r})"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        print(f"load_memory_error={result.stderr.strip().splitlines()[-1:]}")
        return
    sys.stdout.write(result.stdout)


def _load_probe(directory: str, dtype: str) -> None:
    """Load the checkpoint, run one short prefill (touching every weight), print RSS numbers in MiB."""
    from hybridcache.gpu.model import load_model
    from hybridcache.gpu.model.checkpoint import CheckpointWeights

    weight_bytes = CheckpointWeights(Path(directory)).nbytes()
    before = _rss_bytes()
    model = load_model(directory, dtype=None if dtype == "auto" else DTYPES[dtype])
    loaded = _rss_bytes()
    kv, states = model.new_kv_pools(1), model.new_state_slots(1)
    model.prefill([1, 2, 3, 4], 0, [PageId(0)], SlotId(0), kv, states)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    mib = 1024 * 1024
    print(f"weights_mib={weight_bytes / mib:.1f}")
    print(f"rss_before_load_mib={before / mib:.1f}")
    print(f"rss_after_load_mib={loaded / mib:.1f}")
    print(f"peak_rss_after_first_forward_mib={peak / mib:.1f}")
    print(f"load_peak_over_weights={(peak - before) / weight_bytes:.2f}")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
