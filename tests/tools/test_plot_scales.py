"""The scales the plots use: units that fit the values, round log ticks, marker areas that grow with
hits and never vanish."""

from hybridcache.tools.inspect_plot import byte_unit, marker_area
from hybridcache.tools.sim.policies import Policy
from hybridcache.tools.sim.report import POLICY_STYLES, ratio_ticks, token_unit


def test_token_units_fit_the_magnitude():
    assert token_unit(648_418) == (1e3, "thousand tokens")
    assert token_unit(9_794_787) == (1e6, "million tokens")
    assert token_unit(64) == (1.0, "tokens")


def test_byte_units_fit_the_magnitude():
    assert byte_unit(992 * 1024) == (1024, "KiB")
    assert byte_unit(2 << 20) == (2**20, "MiB")
    assert byte_unit(100) == (1.0, "bytes")


def test_log_ticks_are_round_and_inside_the_range():
    assert ratio_ticks(0.95, 16) == [1, 1.2, 1.5, 2, 3, 5, 7, 10, 12, 15]


def test_a_snapshot_without_hits_still_has_a_marker_and_hits_make_it_bigger():
    assert 0 < marker_area(0) < marker_area(1) < marker_area(4)


def test_every_policy_has_its_own_marker_and_line_style():
    assert set(POLICY_STYLES) == {policy.value for policy in Policy}
    markers = {style["marker"] for style in POLICY_STYLES.values()}
    lines = {style["linestyle"] for style in POLICY_STYLES.values()}
    assert len(markers) == len(lines) == len(POLICY_STYLES)
