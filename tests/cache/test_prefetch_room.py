"""Prefetch makes room for the blocked head's host-only blocks (writing back, in BACK mode, needs host
room, and host eviction may delete blocks the prefetch wanted); it must only ever restore blocks that
still exist. The soak bench found an engine that failed with "node N does not exist" there.

Small device pools and host tiers, conversations that grow and restart, and a prefetch before a random
share of requests, as a blocked FIFO head gets one; every event is integrity-checked."""

from __future__ import annotations

import random

from cache_factories import checked_cache, geometry, prompt, run_request, tokens

from hybridcache.cache.match import Readiness
from hybridcache.cache.records import Residency

SEEDS = (1, 3, 13, 20, 21)  # each failed before the fix (of seeds 0-39, nine did)


def _conversations_with_prefetches(seed: int, steps: int = 200) -> int:
    """Returns how many blocks the prefetches restored."""
    rng = random.Random(seed)
    cache = checked_cache(geometry(num_pages=rng.choice([12, 16, 24]), host_slabs=rng.choice([16, 24, 40]),
                                   snapshot_slots=4))
    conversations = [tokens(rng.randint(100, 300), seed=seed * 100 + i) for i in range(4)]
    restored = 0
    for step in range(steps):
        c = rng.randrange(len(conversations))
        if rng.random() < 0.4:
            plan = cache.prefetch(prompt([*conversations[c], 7]), keep_free=rng.randint(0, 2))
            if plan is not None:
                for copy in plan.blocks:
                    owner = cache.index.pages.owners[copy.page]
                    node = cache.index.nodes[owner[1]]
                    assert node.device_state == Residency.FILLING and node.host_slab == copy.slab
                cache.restore_done(plan.batch)
                restored += len(plan.blocks)
            continue
        conversations[c] = conversations[c] + tokens(rng.randint(20, 200), seed=seed * 1000 + step)
        if len(conversations[c]) > 700:
            conversations[c] = tokens(rng.randint(100, 300), seed=seed * 7 + step)
        if cache.quote(prompt(conversations[c])).readiness == Readiness.READY:
            run_request(cache, conversations[c], output_tokens=0)
    return restored


def test_prefetch_restores_only_blocks_that_survived_its_own_room_making():
    restored = [_conversations_with_prefetches(seed) for seed in SEEDS]
    assert all(count > 0 for count in restored)  # the prefetches did restore blocks in every run
