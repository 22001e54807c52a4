"""What requests hold in the cache right now: pins, lanes, lane-private pages, transfers in flight.

When no request runs and no transfer is in flight every figure here is 0 (and the worker's free lanes
are all of them); anything else after the clients have gone is a leak. The soak bench
(`tools/bench_soak.py`) reads them from /v1/cache/stats at its end. O(nodes + snapshots), like the
host-tier composition beside it in ``Engine.stats()``; reads only.
"""

from __future__ import annotations

from hybridcache.cache.index import PrefixIndex


def occupancy_counts(index: PrefixIndex) -> dict[str, int]:
    """Pinned blocks and snapshots, the index's lanes, their private pages, restores in flight."""
    return {
        "pinned_blocks": sum(1 for node in index.nodes.values() if node.parent is not None and node.pinned),
        "pinned_snapshots": sum(1 for snap in index.snapshots.values() if snap.restore_pins > 0),
        "cache_lanes": len(index.lanes),
        "lane_private_pages": sum(len(lane.private) for lane in index.lanes.values()),
        "restores_in_flight": len(index.restores),
        "host_slabs_used": 0 if index.host is None else index.host.num_slabs - index.host.num_free,
    }
