"""`hybridcache bench peer`: how rounds combine and how the bandwidth limit is read (the servers themselves
are not started here)."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from hybridcache.tools.bandwidth_probe import BUFFER_BYTES, BandwidthProbe
from hybridcache.tools.bench_peer import SideResult, _bandwidth_fraction, _best_of, _prompts, _wait_until_idle


def test_rounds_keep_each_sides_best_speeds_and_largest_memory():
    slow = SideResult({2048: 100.0}, {2048: 8.0}, 10, 30, 40, 3.0, {2048: [(8.0, 4e9)]})
    fast = SideResult({2048: 150.0}, {2048: 7.0}, 12, 25, 45, None, {2048: [(7.0, 2e9), (6.0, 3e9)]})
    best = _best_of([slow, fast])
    assert best == SideResult({2048: 150.0}, {2048: 8.0}, 12, 30, 45, 3.0,
                              {2048: [(8.0, 4e9), (7.0, 2e9), (6.0, 3e9)]})
    assert _best_of([fast]).batched_vs_single is None


def test_the_bandwidth_fraction_pairs_each_run_with_its_own_window():
    # 8 tok/s while 4 GB/s was available reaches 0.5 of its limit (1 GB steps); 7 tok/s while only 2 GB/s
    # was available reaches 0.875: the best pair counts, not the fastest run against the fastest window.
    side = SideResult({2048: 1.0}, {2048: 8.0}, 1, 1, 1, None, {2048: [(8.0, 4e9), (7.0, 2e9)]})
    assert _bandwidth_fraction(side, 2048, step_bytes=250_000_000) == pytest.approx(7.0 * 0.25 / 2)
    assert _bandwidth_fraction(side, 2048, step_bytes=250_000_000) > 8.0 * 0.25 / 4


def test_the_probe_reads_its_buffer_for_the_asked_window():
    probe = BandwidthProbe(threads=1)
    started = time.perf_counter()
    sustained = probe.sustained(0.3)
    elapsed = time.perf_counter() - started
    assert elapsed >= 0.3
    # The rate is the bytes of whole passes over the time they took: at least one pass, none cut short.
    assert BUFFER_BYTES / sustained <= elapsed
    assert probe.best(repeats=2) > 0


def test_each_round_gets_fresh_prompts_of_the_asked_lengths():
    first, second = _prompts([64, 128], 2, seed=1), _prompts([64, 128], 2, seed=2)
    assert [len(p) for p in first[64] + first[128]] == [64, 64, 128, 128]
    assert first == _prompts([64, 128], 2, seed=1)
    assert first[64][0] != second[64][0] and first[64][0] != first[64][1]


def test_the_bench_waits_for_our_servers_idle_work_and_not_for_a_server_without_stats():
    answers = iter([{"endpoint_refills_pending": 1, "endpoint_refills_running": 0},
                    {"endpoint_refills_pending": 0, "endpoint_refills_running": 1},
                    {"endpoint_refills_pending": 0, "endpoint_refills_running": 0}])
    asked: list[str] = []

    class Stats(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            if self.path != "/v1/cache/stats" or self.server.without_stats:
                self.send_error(404)
                return
            body = json.dumps(next(answers)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    for without_stats, polls in ((False, 3), (True, 1)):
        asked.clear()
        server = http.server.HTTPServer(("127.0.0.1", 0), Stats)
        server.without_stats = without_stats
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            _wait_until_idle(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=10)
        finally:
            server.shutdown()
        assert asked == ["/v1/cache/stats"] * polls
