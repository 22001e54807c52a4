"""Typed identities used across the cache index.

Every id is a plain ``int`` at run time; the ``NewType`` wrappers keep node, snapshot, slab, page and
slot numbers from being mixed up in signatures.
"""

from typing import NewType

NodeId = NewType("NodeId", int)
SnapshotId = NewType("SnapshotId", int)
SlabId = NewType("SlabId", int)
PageId = NewType("PageId", int)
SlotId = NewType("SlotId", int)

ROOT_NODE = NodeId(0)
"""The root of the block tree: covers no tokens, always present, never evicted."""

BLOCK_TOKENS = 64
"""Tokens per KV block / page group (spec §5.1)."""
