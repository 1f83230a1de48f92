"""The daemon's loop as pure functions: which trigger fires when, what comes next, how long a retry waits."""

from __future__ import annotations

import pytest

import fiar_contract as contract
from node_agent import loop
from node_agent.report import PreviousReport
from node_agent.verdict import Status

TIMING = loop.Timing(interval_s=3600.0, retry_interval_s=600.0, driver_check_s=60.0, api_backoff_max_s=60.0)
VERDICT = loop.Publish({contract.LABEL_BACKEND: "trtllm"}, "{}")
NO_VERDICT = loop.Publish({contract.LABEL_GPUS: "2"}, "{}")


def started(now: float = 0.0, previous_read: bool = True) -> loop.LoopState:
    return loop.arrive(loop.initial(now, "580.1", previous_read, TIMING), ["start"])


def after_probe(status: Status, publish: loop.Publish, previous_read: bool = True) -> loop.LoopState:
    """The state once the start-up probe (at 0) finished with ``status``."""
    state, probe = loop.step(started(previous_read=previous_read), 0.0, TIMING)
    assert isinstance(probe, loop.Probe)
    return loop.probed(state, 0.0, probe, status, publish, TIMING)


def test_start_asks_for_a_probe_at_once() -> None:
    _, action = loop.step(started(), 0.0, TIMING)
    assert action == loop.Probe(triggers=("start",), reprobe=None)


def test_stop_comes_before_everything_else() -> None:
    state = loop.arrive(started(), ["driver-change", "stop"], reprobe="now")
    assert loop.step(state, 0.0, TIMING)[1] == loop.Stop()


def test_triggers_that_arrive_together_are_one_probe_that_answers_the_newest_reprobe() -> None:
    state = loop.arrive(started(), ["reprobe", "driver-change"], reprobe="first")
    state = loop.arrive(state, ["reprobe"], reprobe="second")
    state, action = loop.step(state, 0.0, TIMING)
    assert action == loop.Probe(triggers=("start", "reprobe", "driver-change"), reprobe="second")
    assert state.due == () and state.reprobe is None


def test_an_ok_probe_is_written_at_once_and_the_next_one_waits_for_the_interval() -> None:
    state, probe = loop.step(started(), 0.0, TIMING)
    assert isinstance(probe, loop.Probe)
    state = loop.probed(state, 10.0, probe, "ok", VERDICT, TIMING)
    state, action = loop.step(state, 10.0, TIMING)
    assert action == loop.Write(publish=VERDICT, clear=None, read_previous=False)
    state = loop.wrote(state, 10.0, loop.Wrote("written", published=True), TIMING)
    assert state.probe_at == 3610.0 and state.probe_timer == "interval"
    state, action = loop.step(state, 3610.0, TIMING)
    assert isinstance(action, loop.Probe) and action.triggers == ("interval",)


def test_a_degraded_probe_is_followed_by_a_retry_after_the_retry_interval() -> None:
    state, probe = loop.step(started(), 0.0, TIMING)
    assert isinstance(probe, loop.Probe)
    state = loop.probed(state, 5.0, probe, "degraded", NO_VERDICT, TIMING)
    assert (state.probe_at, state.probe_timer) == (605.0, "retry")
    state = loop.wrote(state, 5.0, loop.Wrote("written", published=True), TIMING)
    _, action = loop.step(state, 605.0, TIMING)
    assert isinstance(action, loop.Probe) and action.triggers == ("retry",)


def test_the_retry_interval_never_exceeds_the_interval() -> None:
    timing = loop.Timing(interval_s=100.0, retry_interval_s=600.0, driver_check_s=60.0, api_backoff_max_s=60.0)
    assert timing.degraded_wait_s == 100.0


def test_idle_the_loop_waits_for_the_first_deadline_but_never_past_the_heartbeat() -> None:
    state = loop.wrote(after_probe("ok", VERDICT), 0.0, loop.Wrote("written", published=True), TIMING)
    assert loop.step(state, 0.0, TIMING)[1] == loop.Wait(until=loop.HEARTBEAT_S)
    state, action = loop.step(state, 60.0, TIMING)
    assert action == loop.CheckDriver() and state.driver_at == 120.0
    assert loop.step(state, 118.0, TIMING)[1] == loop.Wait(until=120.0)


def test_a_changed_readable_driver_triggers_a_probe_an_unreadable_one_does_not() -> None:
    state = loop.initial(0.0, "580.1", True, TIMING)
    assert loop.driver_read(state, None) == state
    assert loop.driver_read(state, "580.1") == state
    changed = loop.driver_read(state, "590.2")
    assert changed.driver == "590.2" and changed.due == ("driver-change",)


def test_failed_writes_back_off_doubling_up_to_the_cap() -> None:
    state = after_probe("ok", VERDICT)
    now, waits = 0.0, []
    for _ in range(8):
        state, action = loop.step(state, now, TIMING)
        assert isinstance(action, loop.Write)
        state = loop.wrote(state, now, loop.Wrote("failed", error="connection refused"), TIMING)
        waits.append(state.write_at - now)
        now = state.write_at
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    state = loop.wrote(state, now, loop.Wrote("written", published=True), TIMING)
    assert state.write_failures == 0 and not state.write_pending


def test_jitter_spreads_a_wait_by_the_fraction_given() -> None:
    assert loop.backoff_s(3, 1.0, 60.0, jitter=0.2) == pytest.approx(4.8)
    assert loop.backoff_s(10, 1.0, 60.0, jitter=-0.2) == pytest.approx(48.0)


def test_a_wait_after_thousands_of_failed_writes_is_still_the_cap() -> None:
    assert loop.backoff_s(5000, 1.0, 60.0) == 60.0


def test_a_failed_probe_keeps_its_triggers_and_reprobe_and_backs_off_up_to_the_interval() -> None:
    timing = loop.Timing(interval_s=100.0, retry_interval_s=600.0, driver_check_s=1e9, api_backoff_max_s=60.0)
    state = loop.arrive(loop.initial(0.0, None, True, timing), ["start", "reprobe"], reprobe="now")
    now, waits = 0.0, []
    for _ in range(4):
        state, action = loop.step(state, now, timing)
        assert isinstance(action, loop.Probe) and action.reprobe == "now"
        state = loop.probe_failed(state, now, action, timing)
        waits.append(state.probe_hold_until - now)
        assert loop.step(state, now, timing)[1] == loop.Wait(until=min(state.probe_hold_until, now + 5.0))
        now = state.probe_hold_until
    assert waits == [30.0, 60.0, 100.0, 100.0]
    assert action.triggers[:2] == ("start", "reprobe")


def test_a_reprobe_that_arrives_during_a_failed_probe_wins_over_the_failed_ones() -> None:
    state = loop.arrive(started(), ["reprobe"], reprobe="old")
    state, action = loop.step(state, 0.0, TIMING)
    assert isinstance(action, loop.Probe)
    state = loop.arrive(state, ["reprobe"], reprobe="new")
    state = loop.probe_failed(state, 0.0, action, TIMING)
    assert state.reprobe == "new" and state.due == ("start", "reprobe")


def test_the_reprobe_a_probe_answered_is_cleared_with_its_verdict() -> None:
    state = loop.arrive(started(), ["reprobe"], reprobe="")
    state, action = loop.step(state, 0.0, TIMING)
    assert isinstance(action, loop.Probe)
    state = loop.probed(state, 1.0, action, "ok", VERDICT, TIMING)
    assert loop.step(state, 1.0, TIMING)[1] == loop.Write(publish=VERDICT, clear="", read_previous=False)
    half = loop.wrote(state, 1.0, loop.Wrote("failed", published=True), TIMING)
    assert half.publish is None and half.clear == "" and half.write_at == 2.0, "the clear is retried alone"


def _node_report(labels: dict[str, str]) -> PreviousReport:
    return PreviousReport("2026-12-01T00:00:00Z", "abc", labels, False, {})


def test_a_blind_probe_gives_way_to_a_verdict_found_on_the_node() -> None:
    state = after_probe("degraded", NO_VERDICT, previous_read=False)
    state, action = loop.step(state, 0.0, TIMING)
    assert action == loop.Write(publish=NO_VERDICT, clear=None, read_previous=True)
    assert loop.node_verdict_wins(NO_VERDICT.labels, _node_report({contract.LABEL_BACKEND: "trtllm"}))
    state = loop.wrote(state, 0.0, loop.Wrote("superseded", previous_read=True), TIMING)
    assert state.publish is None and state.previous_read
    assert loop.step(state, 0.0, TIMING)[1] == loop.Probe(triggers=("previous-report",), reprobe=None)


def test_a_probe_with_a_verdict_or_a_node_without_one_is_written_as_it_is() -> None:
    assert not loop.node_verdict_wins(VERDICT.labels, _node_report({contract.LABEL_BACKEND: "mnnvl"}))
    assert not loop.node_verdict_wins(NO_VERDICT.labels, _node_report({contract.LABEL_GPUS: "2"}))
    assert not loop.node_verdict_wins(NO_VERDICT.labels, None)
