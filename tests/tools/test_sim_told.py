"""`simulate --told` (sim/told_cache.py): ``ours`` told in hindsight which host snapshots are dead."""

from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple

import pytest

from hybridcache.cache.integrity import check_integrity
from hybridcache.tools import simulate as simulate_cli
from hybridcache.tools.sim.runner import Simulation, simulate_told
from hybridcache.tools.sim.told_cache import Told, ToldCache
from tests.tools.test_sim_explain import ENDED_TIGHT, ended_conversations_trace
from tests.tools.test_simulate import TINY, story_traces


class Request(NamedTuple):
    conversation: int
    turn: int


def _node(lookup_hash: int, parent, depth: int):
    return SimpleNamespace(lookup_hash=lookup_hash, parent=parent, depth=depth)


def _snapshot(sid: int, anchor, dependents=()):
    return SimpleNamespace(id=sid, anchor=anchor, dependents={d.id: d for d in dependents})


def test_told_dead_names_ended_conversations_or_every_dead_snapshot():
    """Conversation 0 sends [1, 2] then [1, 2, 4]; conversation 1 sends [1, 3] once. After the first two
    requests: conversation 1's snapshot is dead and ended; conversation 0's snapshot at block 2 with a
    dependent at block 4 is dead (its next request resumes deeper) but not ended; without that dependent
    it is needed."""
    root = _node(0, None, -1)
    one = _node(1, root, 0)
    two, three = _node(2, one, 1), _node(3, one, 1)
    four = _node(4, two, 2)
    ended_snap = _snapshot(10, three)
    deeper = _snapshot(12, four)
    middle = _snapshot(11, two, [deeper])
    newest = _snapshot(13, two)
    future = [(Request(0, 0), [1, 2]), (Request(1, 0), [1, 3]), (Request(0, 1), [1, 2, 4])]
    verdicts = {}
    for told in Told:
        cache = ToldCache(TINY.geometry(64, 1, 2, 3))
        cache.know_future(future, told)
        cache.future.admitted(Request(0, 0))
        cache.future.admitted(Request(1, 0))
        verdicts[told] = [cache.told_dead(s) for s in (ended_snap, middle, newest, deeper)]
    assert verdicts[Told.ENDED] == [True, False, False, False]
    assert verdicts[Told.DEAD] == [True, True, False, False]


def test_a_told_run_evicts_dead_state_first_and_keeps_the_index_sound(tmp_path, monkeypatch):
    applied = []
    original = ToldCache._apply

    def checked(self, event):
        original(self, event)
        applied.append(type(event).__name__)
        check_integrity(self.index)

    monkeypatch.setattr(ToldCache, "_apply", checked)
    trace = ended_conversations_trace(tmp_path)
    tight = ENDED_TIGHT
    untold, ended = simulate_told(trace, tight, Told.ENDED)
    assert untold.counters == Simulation(trace, tight).run().counters  # the first run's numbers
    _, dead = simulate_told(trace, tight, Told.DEAD)
    assert applied and "SnapshotDeleted" in applied
    computed = [r.counters.computed_tokens for r in (untold, ended, dead)]
    assert computed[1] < computed[0]  # what ended conversations held went first, and a later return hit
    assert computed[2] <= computed[1]
    for result in (ended, dead):
        c = result.counters
        assert c.requests == trace.num_requests
        assert c.computed_tokens + c.reused_tokens_device_kv + c.reused_tokens_host_kv == c.input_tokens


@pytest.mark.parametrize(
    "extra", [["--policy", "lru"], ["--explain"], ["--sweep-users", "1,2"], ["--sweep", "0,1"]]
)
def test_cli_told_prints_both_runs_and_refuses_other_modes(tmp_path, capsys, extra):
    paths = [str(p) for p in story_traces(tmp_path)]
    tight = ["--model-shape", "tiny", "--host-cache-mib", "1", "--device-pages", "40", "--users", "1"]
    assert simulate_cli.main([*paths, *tight, "--told", "ended"]) == 0
    values = dict(line.split("=", 1) for line in capsys.readouterr().out.strip().splitlines())
    assert values["told"] == "ended"
    assert int(values["untold_computed_tokens"]) >= 1 and float(values["untold_computed_vs_bound"]) >= 1.0
    assert "computed_vs_bound" in values and "capacity_floor_tokens" not in values
    assert simulate_cli.main([*paths, *tight, "--told", "dead", *extra]) == 2
    assert "--told" in capsys.readouterr().err
