"""Model shapes the simulator sizes the cache for: page and image bytes, prefill and decode costs.

The Qwen3.5 shapes come from spec §3 (27B: 16 full-attention layers x 4 KV heads, 48 Gated DeltaNet
layers with 48 value heads; 35B-A3B: 10 x 2 and 30 layers with 32 value heads), INT8-G64 KV (528 bytes
per token and KV head over K and V, scales included) and a state image without DFlash rings, with the
pending tail gpu/state_slots.py keeps per Gated DeltaNet layer so that a snapshot inside a block is exact
(``PENDING_TAIL_ROWS`` layer inputs of ``hidden`` in bf16 and an int32 count):

    image = GDN layers x (Hv x 128 x 128 x 4 B recurrent + (2 x 16 x 128 + Hv x 128) x 3 x 2 B conv
                          + 63 x hidden x 2 B + 4 B pending tail)
            + hidden x 2 B continuation hidden
    27B:     48 x (3 MiB + 61,440 B + 645,124 B) + 10,240 B = 184,920,256 B (176.4 MiB; spec §3.2's
             186.8 MiB less the 40 MiB DFlash2 rings, plus the 29.5 MiB pending tail)
    35B-A3B: 30 x (2 MiB + 49,152 B + 258,052 B) +  4,096 B =  72,134,776 B (68.8 MiB)

The ``tiny`` and ``small`` shapes are computed from our checkpoint presets (tools/tiny_model/presets.py)
the way gpu/kv_pool.py and gpu/state_slots.py lay them out: a page is 64 tokens x KV heads x head_dim x
2 (K, V) x full-attention layers in the model dtype; an image is, per linear layer, the conv history
(conv_dim x 3 in the model dtype), the fp32 recurrent state and the pending tail (63 x hidden in the model
dtype and an int32 count).

Costs: 27B uses ``CacheCostModel.qwen35_27b_rtx5090`` (spec §3.3). The other coefficients are ASSUMED
round numbers (35B-A3B: a quarter of 27B's per-token cost, attention scaled by its smaller attention;
tiny/small: the generic model), and so are the decode seconds per token; they only set the simulated
request durations (which requests overlap) and how admission ranks sources, never what is counted.
Pure data.
"""

from __future__ import annotations

from types import MappingProxyType

import msgspec

from hybridcache.cache.cost_model import CacheCostModel
from hybridcache.cache.geometry import CacheGeometry
from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.tools.tiny_model.presets import Preset, get_preset

SLAB_ALIGN = 4096
MIB = 1 << 20
DEFAULT_SHAPE = "qwen3.5-27b-int8"
_DTYPE_BYTES = MappingProxyType({"float32": 4, "bfloat16": 2, "float16": 2})


class ModelShape(msgspec.Struct, frozen=True, kw_only=True):
    """Bytes and costs of one model as the cache sees it."""

    name: str
    page_bytes: int  # one 64-token page group, every full-attention plane
    image_bytes: int  # one recurrent state image
    cost: CacheCostModel
    decode_seconds_per_token: float
    origin: str  # where the numbers come from, printed with the report

    @property
    def slab_bytes(self) -> int:
        """One host slab: a page bundle rounded up to 4 KiB."""
        return -(-self.page_bytes // SLAB_ALIGN) * SLAB_ALIGN

    def geometry(
        self, device_pages: int, host_cache_mib: int, max_concurrency: int, device_snapshot_slots: int
    ) -> CacheGeometry:
        """The cache geometry for this shape. Pure."""
        return CacheGeometry(
            num_pages=device_pages,
            page_bytes=self.page_bytes,
            image_bytes=self.image_bytes,
            slab_bytes=self.slab_bytes,
            host_cache_bytes=host_cache_mib * MIB,
            max_concurrency=max_concurrency,
            device_snapshot_slots=device_snapshot_slots,
        )


PENDING_TAIL_ROWS = BLOCK_TOKENS - 1
"""Layer inputs a pending tail holds (gpu/state_slots.py's TAIL_ROWS; not imported: the simulator runs
without torch)."""


def pending_tail_bytes(hidden: int, dtype_bytes: int) -> int:
    """One Gated DeltaNet layer's pending tail: the rows and their int32 count. Pure."""
    return PENDING_TAIL_ROWS * hidden * dtype_bytes + 4


def _qwen35_image_bytes(gdn_layers: int, value_heads: int, hidden: int) -> int:
    recurrent = value_heads * 128 * 128 * 4
    conv = (2 * 16 * 128 + value_heads * 128) * 3 * 2
    return gdn_layers * (recurrent + conv + pending_tail_bytes(hidden, 2)) + hidden * 2


INT8_BYTES_PER_TOKEN_HEAD = 528  # INT8-G64, K and V with scales (spec §3.1)

QWEN35_27B_INT8 = ModelShape(
    name="qwen3.5-27b-int8",
    page_bytes=BLOCK_TOKENS * 16 * 4 * INT8_BYTES_PER_TOKEN_HEAD,  # 2,162,688 B = 2.06 MiB
    image_bytes=_qwen35_image_bytes(48, 48, 5120),  # 184,920,256 B
    cost=CacheCostModel.qwen35_27b_rtx5090(),
    decode_seconds_per_token=0.015,
    origin="spec §3: 27B, INT8-G64 KV, image without DFlash; cost preset qwen3.5-27b-rtx5090",
)

QWEN35_35B_A3B_INT8 = ModelShape(
    name="qwen3.5-35b-a3b-int8",
    page_bytes=BLOCK_TOKENS * 10 * 2 * INT8_BYTES_PER_TOKEN_HEAD,  # 675,840 B = 0.64 MiB
    image_bytes=_qwen35_image_bytes(30, 32, 2048),  # 72,134,776 B
    cost=CacheCostModel(
        token_seconds=4.0e-5,
        pair_seconds=0.7e-9,
        chunk_seconds=10.0e-3,
        prefill_chunk_tokens=2048,
        h2d_bytes_per_second=25.0e9,
        restore_batch_seconds=50.0e-6,
    ),
    decode_seconds_per_token=0.006,
    origin="spec §3: 35B-A3B, INT8-G64 KV, image without DFlash; ASSUMED cost coefficients",
)


def shape_from_preset(preset: Preset) -> ModelShape:
    """The shape of one of our checkpoint presets, laid out as gpu/ lays it out. Pure."""
    dtype_bytes = _DTYPE_BYTES[preset.default_dtype]
    full = sum(kind == "full_attention" for kind in preset.layer_types)
    linear = preset.num_hidden_layers - full
    page = BLOCK_TOKENS * preset.num_key_value_heads * preset.head_dim * dtype_bytes * 2 * full
    conv_dim = (
        2 * preset.linear_num_key_heads * preset.linear_key_head_dim
        + preset.linear_num_value_heads * preset.linear_value_head_dim
    )
    conv = conv_dim * (preset.linear_conv_kernel_dim - 1) * dtype_bytes
    recurrent = (
        preset.linear_num_value_heads * preset.linear_key_head_dim * preset.linear_value_head_dim * 4
    )
    return ModelShape(
        name=preset.name,
        page_bytes=page,
        image_bytes=linear * (conv + recurrent + pending_tail_bytes(preset.hidden_size, dtype_bytes)),
        cost=CacheCostModel.default(),
        decode_seconds_per_token=0.002 if preset.name == "tiny" else 0.005,
        origin=f"our '{preset.name}' checkpoint preset ({preset.default_dtype}); generic cost model",
    )


SHAPES: MappingProxyType[str, ModelShape] = MappingProxyType(
    {
        shape.name: shape
        for shape in (
            QWEN35_27B_INT8,
            QWEN35_35B_A3B_INT8,
            shape_from_preset(get_preset("small")),
            shape_from_preset(get_preset("tiny")),
        )
    }
)


def get_shape(name: str) -> ModelShape:
    """The shape called ``name``. Pure; raises ValueError naming the known shapes."""
    try:
        return SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown model shape {name!r}; known: {', '.join(SHAPES)}") from None
