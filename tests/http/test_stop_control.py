"""Stop signals (spec §5.5): SIGTERM stops; Ctrl+C needs a second press within 5 s; a third exits."""

from hybridcache.http.stop_control import StopAction, StopControl


def test_sigterm_stops_in_order_once():
    control = StopControl()
    assert control.on_terminate() is StopAction.STOP
    assert control.stopping
    assert control.on_terminate() is StopAction.IGNORE_ASK_CONFIRM


def test_a_single_ctrl_c_only_asks_for_confirmation():
    control = StopControl()
    assert control.on_interrupt(now=100.0) is StopAction.IGNORE_ASK_CONFIRM
    assert not control.stopping


def test_a_second_ctrl_c_within_the_window_stops():
    control = StopControl()
    control.on_interrupt(now=100.0)
    assert control.on_interrupt(now=104.9) is StopAction.STOP


def test_a_late_second_ctrl_c_asks_again():
    control = StopControl()
    control.on_interrupt(now=100.0)
    assert control.on_interrupt(now=105.5) is StopAction.IGNORE_ASK_CONFIRM
    assert control.on_interrupt(now=106.0) is StopAction.STOP


def test_ctrl_c_while_stopping_exits_at_once():
    control = StopControl()
    control.on_terminate()
    assert control.on_interrupt(now=1.0) is StopAction.EXIT_NOW
