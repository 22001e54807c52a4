"""The compute side the engine drives: the model, its KV pools and state slots, host slab memory and
transfers, sized from the options (spec §5.4, §14.2). Holds tensors; decides no cache policy."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from hybridcache.cache.geometry import CacheGeometry
from hybridcache.cache.slab_pool import HostSlabPool, slab_bytes_for
from hybridcache.config import EffectiveOptions, OptionError, check_host_budget
from hybridcache.gpu.backend import CpuBackend
from hybridcache.gpu.dtype_choice import choose_dtype
from hybridcache.gpu.heap_trim import heap_trimmer
from hybridcache.gpu.host_tier import HostSlabMemory, cpu_allocator, pinned_allocator
from hybridcache.gpu.huge_pages import HugePages
from hybridcache.gpu.model import Qwen35Model, cpu_gemv, cpu_kernels, load_model
from hybridcache.gpu.model.loader import stored_dtype
from hybridcache.gpu.slab_file import MappedSlabFile
from hybridcache.gpu.transfers import Transfers
from hybridcache.logs import format_bytes
from hybridcache.persistence.cache_dir import slabs_path

DEFAULT_CONTEXT = 32768
CPU_KV_SHARE = 0.25  # --kv-capacity auto on a CPU device: at most this share of physical memory
CPU_KV_LIMIT_BYTES = 2 << 30


def resolve_device(name: str) -> torch.device:
    """`auto` is CUDA when available, else CPU. Raises OptionError for an unavailable CUDA device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise OptionError("--device", f"{name} asked for, but no CUDA device is available")
    return torch.device(name)


def model_context_length(model_dir: Path) -> int:
    """`max_position_embeddings` of config.json (or of its `text_config`); 32768 when absent."""
    raw = json.loads((Path(model_dir) / "config.json").read_text())
    text = raw.get("text_config") or raw
    return int(text.get("max_position_embeddings") or raw.get("max_position_embeddings") or DEFAULT_CONTEXT)


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class ModelRuntime:
    """Everything with bytes: built once per engine. Methods mutate only tensors."""

    def __init__(self, model_dir: Path, options: EffectiveOptions) -> None:
        self.device = resolve_device(options.device)
        self.dtype_choice = choose_dtype(options.dtype, self.device, stored_dtype(model_dir))
        self.model: Qwen35Model = load_model(model_dir, self.dtype_choice.dtype, self.device)
        trim = heap_trimmer()
        if trim is not None:
            trim()  # packing freed a transient copy of every weight; give those pages back
        self.max_model_len = options.max_model_len or model_context_length(model_dir)
        cache = options.cache
        copies = cache.device_snapshot_copies
        self.keep_device_snapshot_copies = self.device.type != "cpu" if copies is None else copies
        self.num_slots = options.max_concurrency + cache.device_snapshot_slots
        self.states = self.model.new_state_slots(self.num_slots)
        probe = self.model.new_kv_pools(1)
        self.page_bytes = probe.page_bytes
        self.slab_bytes = slab_bytes_for(probe.plane_page_bytes)
        self.num_pages = self._num_pages(options)
        self.kv = self.model.new_kv_pools(self.num_pages)
        check_host_budget(cache, self.states.image_bytes, self.slab_bytes)
        self.geometry = CacheGeometry(
            num_pages=self.num_pages,
            page_bytes=self.page_bytes,
            image_bytes=self.states.image_bytes,
            slab_bytes=self.slab_bytes,
            host_cache_bytes=cache.host_cache_bytes,
            max_concurrency=options.max_concurrency,
            device_snapshot_slots=cache.device_snapshot_slots,
        )
        self.backend = CpuBackend()
        pool = HostSlabPool(self.slab_bytes, max(cache.host_cache_bytes, self.slab_bytes))
        allocate = pinned_allocator if self.device.type == "cuda" else cpu_allocator
        self.slab_file = None
        if cache.cache_dir is not None:  # the host tier lives in the directory's slab file
            os.makedirs(cache.cache_dir, mode=0o700, exist_ok=True)
            self.slab_file = MappedSlabFile(slabs_path(cache.cache_dir), pool.num_slabs * pool.slab_bytes)
        self.host_memory = HostSlabMemory(pool, allocate, self.slab_file)
        if cache.host_tier:
            self.host_memory.chunk(0)  # a failed host allocation is a startup error naming its size
        self.transfers = Transfers(self.kv, self.states, self.host_memory)

    def _num_pages(self, options: EffectiveOptions) -> int:
        one_context = -(-self.max_model_len // 64) + 1
        if options.kv_capacity != "auto":
            return int(options.kv_capacity)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * 0.8)
        else:
            budget = min(int(physical_memory_bytes() * CPU_KV_SHARE), CPU_KV_LIMIT_BYTES)
        return max(budget // self.page_bytes, one_context)

    def ledger(self) -> list[tuple[str, object]]:
        """Startup-ledger rows for the memory this runtime holds."""
        config = self.model.config
        committed = ", committed as used" if self.device.type == "cpu" else ", reserved"
        return [
            ("architecture", config.architecture),
            (
                "layers",
                f"{config.num_hidden_layers} ({len(config.linear_attention_layers)} linear, "
                f"{len(config.full_attention_layers)} full attention)",
            ),
            ("dtype", f"{str(self.model.dtype).removeprefix('torch.')} ({self.dtype_choice.reason})"),
            ("device", str(self.device)),
            *([("decode_products", self._decode_products())] if self.device.type == "cpu" else []),
            ("max_model_len", self.max_model_len),
            (
                "kv_pages",
                f"{self.num_pages} x {format_bytes(self.page_bytes)} = "
                f"{format_bytes(self.num_pages * self.page_bytes)} budget{committed}",
            ),
            ("state_slots", f"{self.num_slots} x {format_bytes(self.states.image_bytes)} budget{committed}"),
            (
                "device_snapshot_copies",
                "kept beside their host images"
                if self.keep_device_snapshot_copies
                else "dropped once the host image lands (slots and host slabs are the same memory here)",
            ),
            ("host_slab", format_bytes(self.slab_bytes)),
        ]

    def _decode_products(self) -> str:
        """Which code multiplies decode's rows by the weights on a CPU, and why."""
        if not self.model.lm_head[0].is_mkldnn:
            return "torch (weights not packed for oneDNN)"
        kernels = cpu_kernels.status()
        pages = _weight_pages()
        if kernels.active and not cpu_gemv.reads(self.model.lm_head[0]):
            layout = "oneDNN packed the weights in a layout ours does not read"
            return f"{kernels.reason}, products by oneDNN ({layout}); {pages}"
        if kernels.active:
            return f"{kernels.reason}; {pages}"
        return f"oneDNN packed weights (own kernels off: {kernels.reason}); {pages}"

    def close(self) -> None:
        self.backend.close()
        if self.slab_file is not None:
            self.slab_file.close()


def _weight_pages() -> str:
    """How much of the packed weights `huge_pages.collapse` moved onto 2 MiB pages (process-wide)."""
    if HugePages.collapsed_bytes:
        return f"{format_bytes(HugePages.collapsed_bytes)} of packed weights on 2 MiB pages"
    if HugePages.refused:
        return "packed weights on 4 KiB pages (the kernel refused MADV_COLLAPSE)"
    return "packed weights on 4 KiB pages"
