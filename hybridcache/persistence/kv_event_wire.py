"""The KV-event messages a router subscribes to, in the layout vLLM's publishers use.

Each ZMQ message is three frames: ``[topic, seq as 8-byte big-endian, payload]``; the payload is the
msgpack array ``[ts, [event, ...], data_parallel_rank]``; each event is a map whose ``"type"`` names
it. vllm-router 0.1.17 re-hashes each stored block's ``token_ids`` itself (seeded by ``lora_name``);
the block hashes only chain blocks to their parents and name them in removals. Checked against that
wheel's decoder; the field order follows vLLM's own structs.
"""

from __future__ import annotations

import msgspec

from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.resumable_cover import CoverChange, Tier

MEDIUM = {Tier.DEVICE: "GPU", Tier.HOST: "CPU"}
REPLAY_END_SEQ = -1  # the sequence number that ends a replay answer


class BlockStored(msgspec.Struct, frozen=True, tag=True, tag_field="type"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(msgspec.Struct, frozen=True, tag=True, tag_field="type"):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(msgspec.Struct, frozen=True, tag=True, tag_field="type"):
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, frozen=True, array_like=True):
    ts: float
    events: list[KvEvent]
    data_parallel_rank: int | None = None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(EventBatch)


def encode_batch(batch: EventBatch) -> bytes:
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes) -> EventBatch:
    """The batch in ``payload``. Raises msgspec.DecodeError / ValidationError."""
    return _DECODER.decode(payload)


def seq_frame(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def salt_lora_name(extra: int) -> str | None:
    """A block whose hash carries a cache salt (a nonzero extra key) is published under a name that
    seeds the router's own hash, so it never matches another tenant's (or an unsalted) prompt."""
    return None if extra == 0 else f"hybridcache-salt-{extra:016x}"


def wire_events(changes: list[CoverChange]) -> list[KvEvent]:
    """The router events of a list of cover changes, in order. Pure."""
    out: list[KvEvent] = []
    for change in changes:
        medium = MEDIUM[change.tier]
        hashes = [block.lookup_hash for block in change.blocks]
        if not change.stored:
            out.append(BlockRemoved(hashes, medium))
            continue
        # One event per run of blocks sharing a salt name: the router seeds every block of an event
        # with the same lora_name.
        start = 0
        blocks = change.blocks
        while start < len(blocks):
            name = salt_lora_name(blocks[start].extra)
            end = start + 1
            while end < len(blocks) and salt_lora_name(blocks[end].extra) == name:
                end += 1
            run = blocks[start:end]
            tokens = [token for block in run for token in block.tokens]
            out.append(BlockStored(hashes[start:end], run[0].parent_hash, tokens, BLOCK_TOKENS,
                                   None, medium, name))
            start = end
    return out
