"""The simulation loop: users, conversations and requests on a simulated clock, admitted FIFO.

Timing (conversation clocks, WEKA): ``users`` root conversations run at once, each with its
sub-agents; a new one starts when one ends. A request arrives at its user's start + its trace time, but
never before the previous request of its conversation finished. Global clocks (Mooncake, our JSONL):
every request arrives at its trace time (``users`` does not apply). Arrivals queue FIFO; the head is
admitted when a lane is free and its quote is Ready, and nothing overtakes a blocked head (spec §6.3).
A request holds its lane (pages, slot, path pins) for its modeled duration (cost model: restore +
prefill + decode), then finishes. Ties are broken by push order, so a run is deterministic.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from typing import NamedTuple

import msgspec

from hybridcache.cache.facade import Cache
from hybridcache.cache.hedge_admission import resolve_hedge_budget
from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.tap_planner import HintKind, TapHint, derive_tap_options
from hybridcache.cache.write_back import HostWrite
from hybridcache.config import HedgeBudget
from hybridcache.tools.sim.bound import InfiniteCacheBound
from hybridcache.tools.sim.capacity_floor import AccessLog, CapacityFloor
from hybridcache.tools.sim.counters import EvictionTally, SimCounters
from hybridcache.tools.sim.driver import Admission, RequestDriver
from hybridcache.tools.sim.excess import ExcessSplit
from hybridcache.tools.sim.explain import CensusCache, ExplainReport
from hybridcache.tools.sim.material import RequestMaterial, build_material, generated_count
from hybridcache.tools.sim.oracle import FutureUses, OracleCache
from hybridcache.tools.sim.policies import Policy, make_cache
from hybridcache.tools.sim.shapes import ModelShape
from hybridcache.tools.sim.told_cache import Told, ToldCache
from hybridcache.tools.traces import Conversation, Trace


class SimConfig(msgspec.Struct, frozen=True, kw_only=True):
    """One simulation's settings (see ``hybridcache simulate --help``)."""

    shape: ModelShape
    policy: Policy = Policy.OURS
    host_cache_mib: int = 65536
    device_pages: int = 16384
    max_concurrency: int = 8
    device_snapshot_slots: int | None = None  # None: the spec default C + 1 (C + 2 without a host tier)
    users: int = 8
    assume_echo: bool = True
    host_write: HostWrite = HostWrite.BACK
    hedges: bool = True  # HEDGE taps near each prompt end (tap_planner)
    hedge_budget: HedgeBudget = "auto"  # host bytes of hedge images (cache/hedge_admission.py)
    capacity_floor: bool = False  # also compute the floor of this run's admission order (capacity_floor.py)

    def snapshot_slots(self) -> int:
        if self.device_snapshot_slots is not None:
            return self.device_snapshot_slots
        return self.max_concurrency + (1 if self.host_cache_mib > 0 else 2)


class SimResult(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a run reports: the counters, the bound, and how long the run took."""

    counters: SimCounters
    bound_tokens: int
    bound_tokens_inputs_only: int
    simulated_seconds: float
    wall_seconds: float
    capacity_floor: CapacityFloor | None = None  # with SimConfig.capacity_floor
    floor_seconds: float = 0.0  # wall seconds the floor took (not in wall_seconds)

    @property
    def computed_vs_bound(self) -> float:
        return self.counters.computed_tokens / max(self.bound_tokens, 1)


class _Item(NamedTuple):
    conversation: int  # index into the run's conversation list
    turn: int


class _User:
    __slots__ = ("conversations", "remaining", "start")

    def __init__(self, conversations: list[int], remaining: int) -> None:
        self.conversations = conversations
        self.remaining = remaining
        self.start = 0.0


_ARRIVE, _FINISH = 0, 1
# caches told each admission (their FutureUses moves)
_KNOWS_THE_FUTURE = (OracleCache, CensusCache, ToldCache)


class Simulation:
    """One run over one trace. Mutable; call ``run`` once."""

    def __init__(self, trace: Trace, config: SimConfig, ours_class: type[Cache] = Cache) -> None:
        self.trace = trace
        self.config = config
        self.counters = SimCounters()
        geometry = config.shape.geometry(
            config.device_pages, config.host_cache_mib, config.max_concurrency, config.snapshot_slots()
        )
        tally = EvictionTally(self.counters)
        hedge_budget = resolve_hedge_budget(config.hedge_budget, geometry)
        cache = make_cache(
            config.policy, geometry, config.shape.cost, tally, config.host_write, hedge_budget, ours_class
        )
        options = derive_tap_options(
            config.shape.cost.prefill_chunk_tokens,
            geometry.has_host_tier,
            hedges=config.hedges,
            hedge_cold_prompts=hedge_budget > 0,
        )
        self.driver = RequestDriver(cache, config.policy, config.shape, options, self.counters)
        self.bound = InfiniteCacheBound()
        self.excess = ExcessSplit()
        self._finished_at: dict[int, float] = {}  # conversation -> when its latest request finished
        index = cache.index
        tally.on_published = lambda e: self.excess.published(index.nodes[e.anchor].lookup_hash, e.tail_tokens)
        self.conversations: list[Conversation] = list(trace.conversations)
        self._ordinal_base = _ordinal_bases(self.conversations)
        self._user_of: list[int] = [0] * len(self.conversations)
        self.users = self._group_users()
        self._events: list[tuple[float, int, int, object]] = []
        self._pushes = 0
        self._queue: deque[tuple[_Item, RequestMaterial | None]] = deque()
        self._next_user = 0
        self._running: dict[int, _Item] = {}
        self.now = 0.0
        self.admitted: list[tuple[_Item, list[int]]] = []  # (request, its prompt's full-block hashes)
        self.accesses = AccessLog() if config.capacity_floor else None

    # ------------------------------------------------------------------ setup
    def _group_users(self) -> list[_User]:
        if self.trace.clock != "conversation":
            everything = list(range(len(self.conversations)))
            return [_User(everything, sum(len(c.requests) for c in self.conversations))]
        root_of: dict[str, str] = {}
        by_id = {c.id: c for c in self.conversations}
        for conversation in self.conversations:
            top = conversation
            while top.parent is not None and top.parent in by_id:
                top = by_id[top.parent]
            root_of[conversation.id] = top.id
        users: dict[str, _User] = {}
        for position, conversation in enumerate(self.conversations):
            user = users.setdefault(root_of[conversation.id], _User([], 0))
            user.conversations.append(position)
            user.remaining += len(conversation.requests)
        ordered = list(users.values())
        for number, user in enumerate(ordered):
            for position in user.conversations:
                self._user_of[position] = number
        return ordered

    def _concurrent_users(self) -> int:
        return len(self.users) if self.trace.clock != "conversation" else max(1, self.config.users)

    # ------------------------------------------------------------------ the loop
    def run(self) -> SimResult:
        """Simulate every request. Mutates the simulation; returns the result."""
        started = time.perf_counter()
        for _ in range(min(self._concurrent_users(), len(self.users))):
            self._start_user()
        while self._events:
            self.now, _, kind, payload = heapq.heappop(self._events)
            self.driver.cache.now = self.now
            if kind == _ARRIVE:
                self._queue.append((payload, None))  # type: ignore[arg-type]
            else:
                self._finish(payload)  # type: ignore[arg-type]
            if not self._events or self._events[0][0] > self.now:
                self._admit()
        stats = self.driver.cache.stats
        self.counters.hedge_writes_refused = stats.hedge_writes_refused
        wall = time.perf_counter() - started
        floor = None
        if self.accesses is not None:
            geometry = self.driver.cache.index.geometry
            capacity = geometry.num_pages + geometry.host_cache_bytes // geometry.slab_bytes
            floor = self.accesses.floor(capacity, self.bound.unshared_tokens, self.bound.tokens)
        excess = self.excess
        self.counters.excess_capacity_tokens = excess.capacity_tokens
        self.counters.excess_placement_tokens = excess.placement_tokens
        self.counters.excess_capacity_requests = excess.capacity_requests
        self.counters.excess_placement_requests = excess.placement_requests
        for name, tokens in excess.capacity_by_idle.items():
            setattr(self.counters, f"excess_capacity_tokens_{name}", tokens)
        return SimResult(
            counters=self.counters,
            bound_tokens=self.bound.tokens,
            bound_tokens_inputs_only=self.bound.literal_tokens,
            simulated_seconds=self.now,
            wall_seconds=wall,
            capacity_floor=floor,
            floor_seconds=time.perf_counter() - started - wall,
        )

    def _push(self, at: float, kind: int, payload: object) -> None:
        self._pushes += 1
        heapq.heappush(self._events, (at, self._pushes, kind, payload))

    def _start_user(self) -> None:
        while self._next_user < len(self.users):
            user = self.users[self._next_user]
            self._next_user += 1
            user.start = self.now
            if user.remaining == 0:
                continue
            for position in user.conversations:
                first = self.conversations[position].requests
                if first:
                    self._push(user.start + first[0].arrival_s, _ARRIVE, _Item(position, 0))
            return

    def _admit(self) -> None:
        driver = self.driver
        while self._queue and driver.free_lanes:
            item, material = self._queue[0]
            if material is None:
                material = self._material(item)
                self._queue[0] = (item, material)
            computed_before = driver.counters.computed_tokens
            if isinstance(driver.cache, _KNOWS_THE_FUTURE):
                driver.cache.future.arriving(item)
            self.excess.admitting()
            outcome = driver.admit(material, self._hints(item, material))
            if outcome.outcome == Admission.BLOCKED and not driver.active:
                driver.counters.requests_infeasible += 1  # nothing will free pages: never fits
                outcome = outcome._replace(outcome=Admission.INFEASIBLE)
            if outcome.outcome == Admission.BLOCKED:
                self.excess.settle()
                return
            self._queue.popleft()
            if outcome.outcome == Admission.INFEASIBLE:
                self.excess.settle()
                self._advance(item)
                continue
            bound = self.bound.observe(material)
            finished = self._finished_at.get(item.conversation)
            idle = None if finished is None else self.now - finished
            self.excess.charge(material, driver.counters.computed_tokens - computed_before, bound, idle)
            self._record_admission(item, material)
            assert outcome.lane is not None
            self._running[outcome.lane] = item
            self._push(self.now + outcome.seconds, _FINISH, outcome.lane)

    def _record_admission(self, item: _Item, material: RequestMaterial) -> None:
        self.admitted.append((item, list(material.block_hashes[: material.prompt_tokens // BLOCK_TOKENS])))
        if self.accesses is not None:
            self.accesses.record(
                material.block_hashes,
                material.prompt_tokens // BLOCK_TOKENS,
                material.committed_tokens // BLOCK_TOKENS,
            )
        cache = self.driver.cache
        if isinstance(cache, _KNOWS_THE_FUTURE):
            cache.future.admitted(item)

    def _finish(self, lane: int) -> None:
        self.driver.finish(lane)
        item = self._running.pop(lane)
        self._finished_at[item.conversation] = self.now
        self._advance(item)

    def _advance(self, item: _Item) -> None:
        """The request ``item`` is done: its conversation's next request arrives; its user may end."""
        conversation = self.conversations[item.conversation]
        user = self.users[self._user_of[item.conversation]]
        user.remaining -= 1
        following = item.turn + 1
        if following < len(conversation.requests):
            due = user.start + conversation.requests[following].arrival_s
            self._push(max(due, self.now), _ARRIVE, _Item(item.conversation, following))
        if user.remaining == 0 and self.trace.clock == "conversation":
            self._start_user()

    # ------------------------------------------------------------------ per request
    def _material(self, item: _Item) -> RequestMaterial:
        requests = self.conversations[item.conversation].requests
        request = requests[item.turn]
        following = requests[item.turn + 1] if item.turn + 1 < len(requests) else None
        salt = self._ordinal_base[item.conversation] + item.turn
        return build_material(request, following, self.config.assume_echo, salt)

    def _hints(self, item: _Item, material: RequestMaterial) -> list[TapHint]:
        """What the trace says about boundaries: the end of the shared tool + system prefix, and where the
        previous request of the conversation ended (its prompt and its output), when this one extends it."""
        n = material.prompt_tokens
        conversation = self.conversations[item.conversation]
        hints = []
        shared = conversation.shared_prefix_blocks * BLOCK_TOKENS
        if 0 < shared < n:
            hints.append(TapHint(shared, HintKind.STRUCTURAL))
        if item.turn > 0:
            previous = conversation.requests[item.turn - 1]
            ids = previous.block_ids
            current = conversation.requests[item.turn].block_ids
            if len(current) >= len(ids) and (current[: len(ids)] == ids).all():
                for position in (previous.input_tokens, previous.input_tokens + generated_count(previous)):
                    if 0 < position < n:
                        hints.append(TapHint(position, HintKind.MESSAGE))
        return hints


def _ordinal_bases(conversations: list[Conversation]) -> list[int]:
    bases, total = [], 0
    for conversation in conversations:
        bases.append(total)
        total += len(conversation.requests)
    return bases


def simulate(trace: Trace, config: SimConfig) -> SimResult:
    """Run one simulation of ``trace`` under ``config`` (``oracle``: after a run of ``ours`` that gives it
    the future, see ``sim/oracle.py``). Pure with respect to its inputs."""
    if config.policy is Policy.ORACLE:
        return simulate_with_oracle(trace, config)[1]
    return Simulation(trace, config).run()


def simulate_with_oracle(trace: Trace, config: SimConfig) -> tuple[SimResult, SimResult]:
    """(``ours``, ``oracle``) under the same settings: the oracle knows the admission order of the ``ours``
    run. Pure with respect to its inputs."""
    ours = Simulation(trace, msgspec.structs.replace(config, policy=Policy.OURS))
    ours_result = ours.run()
    oracle = Simulation(trace, msgspec.structs.replace(config, policy=Policy.ORACLE, capacity_floor=False))
    cache = oracle.driver.cache
    assert isinstance(cache, OracleCache)
    cache.future = FutureUses(ours.admitted)
    return ours_result, oracle.run()


def simulate_explained(trace: Trace, config: SimConfig) -> tuple[SimResult, ExplainReport]:
    """A run of ``ours`` watched by explain.py's census, which knows the admission order of an earlier
    run under the same settings (that run's result is returned: the watched one repeats it). Pure with
    respect to its inputs."""
    config = msgspec.structs.replace(config, policy=Policy.OURS)
    first = Simulation(trace, config)
    result = first.run()
    watched = Simulation(trace, msgspec.structs.replace(config, capacity_floor=False), CensusCache)
    cache = watched.driver.cache
    assert isinstance(cache, CensusCache)
    cache.know_future(first.admitted)
    watched.run()
    return result, cache.report()


def simulate_told(trace: Trace, config: SimConfig, told: Told) -> tuple[SimResult, SimResult]:
    """(``ours``, ``ours`` told ``told`` in hindsight, told_cache.py) under the same settings: the second
    run knows the admission order of the first (neither computes the capacity floor). Pure with respect
    to its inputs."""
    config = msgspec.structs.replace(config, policy=Policy.OURS, capacity_floor=False)
    first = Simulation(trace, config)
    result = first.run()
    told_run = Simulation(trace, config, ToldCache)
    cache = told_run.driver.cache
    assert isinstance(cache, ToldCache)
    cache.know_future(first.admitted, told)
    return result, told_run.run()
