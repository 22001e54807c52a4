"""The Qwen3.5 text model on paged KV and state slots: the forward the engine drives.

`prefill` runs one lane's chunk (any start position), `decode` one token for each of a batch of lanes. Both
write K/V into the lanes' pages and the new Gated DeltaNet state into the lanes' slots in place, and call
`layer_hook(layer_index)` before each layer (the engine makes the first pass wait for a layer's restore).
No cache policy lives here: which pages and slots a lane uses is the caller's decision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

from hybridcache.cache.ids import PageId, SlotId
from hybridcache.gpu.kv_pool import PAGE_TOKENS, KvPools, pages_for_tokens
from hybridcache.gpu.model.attention import AttentionInputs, FullAttention, context_rows
from hybridcache.gpu.model.config import ModelConfig
from hybridcache.gpu.model.embedding_rows import EmbeddingRows
from hybridcache.gpu.model.gated_deltanet import GatedDeltaNet
from hybridcache.gpu.model.linear import linear
from hybridcache.gpu.model.mlp import SwiGluMlp
from hybridcache.gpu.model.moe import MoeBlock
from hybridcache.gpu.model.norm import rms_norm
from hybridcache.gpu.model.rope import RotaryTable
from hybridcache.gpu.model.row_tiles import Product, tiled_linear
from hybridcache.gpu.state_slots import StateShape, StateSlots, plan_slot_runs

LayerHook = Callable[[int], None]


class DecoderLayer(NamedTuple):
    """One decoder layer. `memory_index` is its plane index in `KvPools` (attention) or `StateSlots` (GDN)."""

    input_norm: torch.Tensor  # fp32 1 + w
    post_norm: torch.Tensor
    mixer: GatedDeltaNet | FullAttention
    feed_forward: SwiGluMlp | MoeBlock
    memory_index: int


class Qwen35Model:
    """Weights plus the forward. Holds no per-sequence state: that lives in the `KvPools` and `StateSlots`."""

    def __init__(
        self,
        config: ModelConfig,
        embed_tokens: torch.Tensor,
        layers: Sequence[DecoderLayer],
        final_norm: torch.Tensor,
        lm_head: Sequence[torch.Tensor],
        embed_rows: EmbeddingRows | None = None,
    ) -> None:
        self.config = config
        self.embed_tokens = embed_tokens
        self.embed_rows = embed_rows  # when set, lookups read the rows from the file instead of the table
        self.layers = tuple(layers)
        self.final_norm = final_norm
        self.lm_head = tuple(lm_head)  # vocabulary row blocks (plain or packed) in order
        self.dtype = embed_tokens.dtype
        self.device = embed_tokens.device
        self.rotary = RotaryTable(config.rotary_dim, config.rope_theta, self.device)

    # -- memory the cache addresses -------------------------------------------------------------------

    def new_kv_pools(self, num_pages: int) -> KvPools:
        """Zeroed KV planes of `num_pages` page groups for this model's full-attention layers."""
        c = self.config
        return KvPools(
            c.full_attention_layers, num_pages, c.num_key_value_heads, c.head_dim, self.dtype, self.device
        )

    def new_state_slots(self, num_slots: int) -> StateSlots:
        """Zeroed state-slot array of `num_slots` StateImages for this model's Gated DeltaNet layers."""
        c = self.config
        shape = StateShape(
            c.conv_dim,
            c.linear_conv_kernel_dim - 1,
            c.linear_num_value_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim,
            c.hidden_size,
        )
        return StateSlots(c.linear_attention_layers, num_slots, shape, self.dtype, self.device)

    def reset_slot(self, states: StateSlots, slot: SlotId) -> None:
        """Zero `slot` (the state of an empty sequence). Mutates `states`."""
        states.reset_slot(slot)

    # -- forward --------------------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(
        self,
        tokens: Sequence[int] | torch.Tensor,
        start_pos: int,
        block_table: Sequence[PageId],
        slot: SlotId,
        kv: KvPools,
        states: StateSlots,
        layer_hook: LayerHook | None = None,
        all_logits: bool = False,
    ) -> torch.Tensor:
        """Run one lane's chunk `tokens` at positions `start_pos ..`; return fp32 logits of the last position
        (`[vocab]`), or of every position (`[n, vocab]`) with `all_logits`.

        Mutates the lane's pages (K/V of the chunk's positions) and `slot` (the state after the chunk). With
        `start_pos == 0` the slot's previous contents are ignored. Raises ValueError when the block table
        does not cover the chunk or the chunk is empty.
        """
        ids = torch.as_tensor(tokens, dtype=torch.long, device=self.device).reshape(-1)
        count = ids.numel()
        end = start_pos + count
        if count == 0:
            raise ValueError("prefill needs at least one token")
        io = self._prefill_inputs(start_pos, end, block_table)
        fresh = start_pos == 0
        hidden = self._embed(ids)
        for index, layer in enumerate(self.layers):
            if layer_hook is not None:
                layer_hook(index)
            normed = rms_norm(hidden, layer.input_norm, self.config.rms_norm_eps)
            if isinstance(layer.mixer, GatedDeltaNet):
                i = layer.memory_index
                mixed = layer.mixer.prefill(
                    normed,
                    states.conv_planes[i][slot],
                    states.recurrent_planes[i][slot],
                    states.tail_row_planes[i][slot],
                    states.tail_count_planes[i][slot],
                    fresh,
                )
            else:
                planes = (kv.k_planes[layer.memory_index], kv.v_planes[layer.memory_index])
                mixed = layer.mixer.prefill(normed, planes, io)
            hidden = self._feed_forward(layer, hidden + mixed, tiled_linear)
        # the last row alone is a one-row product in every pass that ends a prompt, cold or resumed
        return self._logits(hidden, tiled_linear) if all_logits else self._logits(hidden[-1])

    @torch.inference_mode()
    def decode(
        self,
        tokens: Sequence[int] | torch.Tensor,
        positions: Sequence[int],
        block_tables: Sequence[Sequence[PageId]],
        slots: Sequence[SlotId],
        kv: KvPools,
        states: StateSlots,
        layer_hook: LayerHook | None = None,
    ) -> torch.Tensor:
        """One token for each of `B` lanes (lane b at `positions[b]`); return fp32 logits `[B, vocab]`.

        Mutates each lane's page at its position and each lane's slot. Raises ValueError when the lists differ
        in length, slots repeat, or a block table does not cover its position.
        """
        ids = torch.as_tensor(tokens, dtype=torch.long, device=self.device).reshape(-1)
        if not len(ids) == len(positions) == len(block_tables) == len(slots) or len(ids) == 0:
            raise ValueError("decode needs one position, block table and slot per token")
        slot_runs = plan_slot_runs(slots, self.device)
        io = self._decode_inputs(positions, block_tables)
        hidden = self._embed(ids)
        for index, layer in enumerate(self.layers):
            if layer_hook is not None:
                layer_hook(index)
            normed = rms_norm(hidden, layer.input_norm, self.config.rms_norm_eps)
            if isinstance(layer.mixer, GatedDeltaNet):
                i = layer.memory_index
                mixed = layer.mixer.decode(
                    normed, states.conv_planes[i], states.recurrent_planes[i], slot_runs
                )
            else:
                planes = (kv.k_planes[layer.memory_index], kv.v_planes[layer.memory_index])
                mixed = layer.mixer.decode(normed, planes, io)
            hidden = self._feed_forward(layer, hidden + mixed)
        return self._logits(hidden)

    # -- pieces ---------------------------------------------------------------------------------------

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_tokens) if self.embed_rows is None else self.embed_rows.lookup(ids)

    def _feed_forward(
        self, layer: DecoderLayer, residual: torch.Tensor, product: Product = linear
    ) -> torch.Tensor:
        normed = rms_norm(residual, layer.post_norm, self.config.rms_norm_eps)
        return residual + layer.feed_forward(normed, product)

    def _logits(self, hidden: torch.Tensor, product: Product = linear) -> torch.Tensor:
        normed = rms_norm(hidden, self.final_norm, self.config.rms_norm_eps)
        blocks = [product(normed, block) for block in self.lm_head]
        return (blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-1)).float()

    def _prefill_inputs(self, start: int, end: int, block_table: Sequence[PageId]) -> AttentionInputs:
        _check_covers(block_table, end)
        positions = torch.arange(start, end, device=self.device)
        table = torch.as_tensor(
            list(block_table[: pages_for_tokens(end)]), dtype=torch.long, device=self.device
        )
        write = table[positions // PAGE_TOKENS] * PAGE_TOKENS + positions % PAGE_TOKENS
        contexts = () if start == 0 else (context_rows(list(block_table), end, PAGE_TOKENS, self.device),)
        cos, sin = self.rotary.cos_sin(positions, end, self.dtype)
        return AttentionInputs(cos, sin, write, contexts)

    def _decode_inputs(
        self, positions: Sequence[int], block_tables: Sequence[Sequence[PageId]]
    ) -> AttentionInputs:
        for table, position in zip(block_tables, positions):
            _check_covers(table, position + 1)
        where = torch.as_tensor(list(positions), dtype=torch.long, device=self.device)
        pages = torch.as_tensor(
            [table[position // PAGE_TOKENS] for table, position in zip(block_tables, positions)],
            dtype=torch.long,
            device=self.device,
        )
        write = pages * PAGE_TOKENS + where % PAGE_TOKENS
        contexts = tuple(
            context_rows(list(table), position + 1, PAGE_TOKENS, self.device)
            for table, position in zip(block_tables, positions)
        )
        cos, sin = self.rotary.cos_sin(where, max(positions) + 1, self.dtype)
        return AttentionInputs(cos, sin, write, contexts)


def _check_covers(block_table: Sequence[PageId], end: int) -> None:
    if len(block_table) < pages_for_tokens(end):
        raise ValueError(f"block table of {len(block_table)} pages cannot hold {end} positions")
